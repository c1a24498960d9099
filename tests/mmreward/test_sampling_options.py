"""`SamplingOptions`: a rollout's sampling settings as one object (issue 33 item 2). The object, the same fields as
keywords, and an object with a field overridden by a keyword must give the same trajectories bit for bit, and a
run config's options must carry every `sample.*` setting the trainer used to pass one by one."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from diffusion_rl.config import from_dict
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import load_pipeline, make_adapter
from diffusion_rl.rollout import SamplingOptions, rollout


@pytest.fixture(scope="module")
def adapter(tiny_pipeline_dir):
    return make_adapter(load_pipeline(str(tiny_pipeline_dir("sd3"))), 16, 16, max_sequence_length=8)


def test_options_object_keywords_and_overrides_give_the_same_trajectory(adapter):
    emb = adapter.encode(["a red circle", "a blue square"])
    kw = {"num_steps": 2, "guidance_scale": 1.0, "kernel": Kernel("flow_sde", 0.7), "sde_steps": [0], "seed": 3,
          "epoch": 5, "store_means": True}
    by_keywords = rollout(adapter, emb, [0, 1], [0, 1], **kw)
    by_object = rollout(adapter, emb, [0, 1], [0, 1], SamplingOptions(**kw))
    overridden = rollout(adapter, emb, [0, 1], [0, 1], SamplingOptions(**{**kw, "epoch": 6}), epoch=5)
    other_epoch = rollout(adapter, emb, [0, 1], [0, 1], SamplingOptions(**{**kw, "epoch": 6}))
    for t in (by_object, overridden):
        assert torch.equal(t.latents, by_keywords.latents) and torch.equal(t.log_probs, by_keywords.log_probs)
        assert torch.equal(t.means, by_keywords.means)
    assert not torch.equal(other_epoch.latents, by_keywords.latents)  # the epoch is a noise counter: it matters


def test_unknown_sampling_keyword_is_a_type_error(adapter):
    with pytest.raises(TypeError, match="num_stpes"):
        rollout(adapter, adapter.encode(["x"]), [0], [0], num_stpes=2, guidance_scale=1.0, kernel=Kernel("ode"))


def test_for_run_carries_every_sample_setting(adapter):
    cfg = from_dict({"reward": {"rewards": {"mock": 1.0}}, "sample": {
        "num_steps": 7, "guidance_scale": 3.5, "share_initial_noise": True, "ode_solver": "dpm2",
        "antithetic_noise": True, "decode_chunk_size": 3, "offload_trajectory": True}})
    kernel = Kernel("flow_sde", 0.5)
    opts = SamplingOptions.for_run(cfg.sample, adapter, kernel, seed=11, epoch=4, sde_steps=[1, 2], store_means=True)
    assert dataclasses.asdict(opts) == dataclasses.asdict(SamplingOptions(
        num_steps=7, guidance_scale=3.5, kernel=kernel, sde_steps=[1, 2], seed=11, epoch=4, share_initial_noise=True,
        store_means=True, ode_solver="dpm2", decode_chunk_size=3, offload=True, antithetic=True))
