"""Rollouts on tiny config-built pipelines saved in the diffusers folder format and loaded back."""

from __future__ import annotations

import pytest
import torch

from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import load_pipeline, make_adapter
from diffusion_rl.rollout import rollout
from diffusion_rl.seeding import counter_noise
from mmreward.errors import ConfigError


@pytest.fixture(scope="session")
def tiny_pipeline_dirs(tiny_pipeline_dir):
    """The session's shared tiny SD and SD3 folders (tests/conftest.py), not a copy of each."""
    return {k: str(tiny_pipeline_dir(k)) for k in ("sd", "sd3")}


def test_noise_depends_only_on_counters_not_batch_layout(tiny_pipeline_dirs):
    pipe = load_pipeline(tiny_pipeline_dirs["sd3"])
    adapter = make_adapter(pipe, 16, 16, max_sequence_length=8)
    prompts = ["a red circle"] * 2 + ["a blue square"] * 2
    emb = adapter.encode(prompts)
    kw = {"num_steps": 2, "guidance_scale": 1.0, "kernel": Kernel("flow_sde", 0.7), "seed": 3, "epoch": 5}
    whole = rollout(adapter, emb, [0, 0, 1, 1], [0, 1, 0, 1], **kw)
    halves = [rollout(adapter, emb.index([2, 3]), [1, 1], [0, 1], **kw), rollout(adapter, emb.index([0, 1]), [0, 0], [0, 1], **kw)]
    torch.testing.assert_close(whole.latents[2:], halves[0].latents, atol=1e-5, rtol=0)
    torch.testing.assert_close(whole.latents[:2], halves[1].latents, atol=1e-5, rtol=0)
    # samples of a group never share noise unless asked; shared initial noise keeps the step noise distinct
    assert not torch.equal(whole.latents[0, 0], whole.latents[1, 0])
    shared = rollout(adapter, emb, [0, 0, 1, 1], [0, 1, 0, 1], share_initial_noise=True, **kw)
    assert torch.equal(shared.latents[0, 0], shared.latents[1, 0])
    assert not torch.equal(shared.latents[0, 1], shared.latents[1, 1])
    other_epoch = counter_noise((2,), 3, 6, [0], [0], -1)
    assert not torch.equal(other_epoch, counter_noise((2,), 3, 5, [0], [0], -1))


def test_kernel_must_fit_the_model_family(tiny_pipeline_dirs):
    adapter = make_adapter(load_pipeline(tiny_pipeline_dirs["sd"]), 32, 32)
    with pytest.raises(ConfigError, match="does not fit a sd pipeline"):
        rollout(adapter, adapter.encode(["x"]), [0], [0], num_steps=2, guidance_scale=1.0, kernel=Kernel("flow_sde"))
    with pytest.raises(ConfigError, match="multiples of"):
        make_adapter(load_pipeline(tiny_pipeline_dirs["sd3"]), 31, 32)
    with pytest.raises(ConfigError, match="expected a StableDiffusionPipeline"):
        make_adapter(object())
