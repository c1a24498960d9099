"""Antithetic (mirrored) SDE noise, `sample.antithetic_noise`: samples 2k and 2k+1 of a group take opposite noise
at every SDE step from one x_T; sample 2k keeps the noise it has without the option; config errors name the fix."""

from __future__ import annotations

import pytest
import torch

from diffusion_rl.config import from_dict
from diffusion_rl.rollout import rollout, step_noise
from diffusion_rl.seeding import counter_noise
from mmreward.errors import ConfigError

PROMPTS = ["a red circle moving left", "a blue square moving up"]


def test_step_noise_pairs_are_opposite_and_even_ids_keep_their_noise():
    pids, sids = [0, 0, 0, 0, 3, 3], [0, 1, 2, 3, 4, 5]
    plain = counter_noise((2, 3), 7, 1, pids, sids, 2)
    anti = step_noise((2, 3), 7, 1, pids, sids, 2, "cpu", antithetic=True)
    for even in (0, 2, 4):
        assert torch.equal(anti[even], plain[even])
        assert torch.equal(anti[even + 1], -plain[even])
    assert torch.equal(step_noise((2, 3), 7, 1, pids, sids, 2, "cpu"), plain)


def _cfg(pipe_dir: str, out, **sample) -> dict:
    return {
        "model": {"pretrained": pipe_dir, "height": 16, "width": 16, "num_frames": 5, "max_sequence_length": 16},
        "sample": {"num_steps": 3, "group_size": 4, "prompts_per_iteration": 2, "batch_size": 8, "kernel": "flow_sde",
                   "noise_level": 0.7, "share_initial_noise": True, **sample},
        "train": {"iterations": 1, "micro_batch_size": 8},
        "reward": {"rewards": {"mock": 1.0}},
        "prompts": {"train": PROMPTS},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


@pytest.fixture(scope="module")
def wan_dir(tiny_pipeline_dir):
    """The session's tiny Wan pipeline (conftest.tiny_pipeline_dir: built once per worker, shared read-only)."""
    return str(tiny_pipeline_dir("wan"))


def test_antithetic_rollout_mirrors_each_pair_about_its_shared_mean(wan_dir, tmp_path):
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(from_dict(_cfg(wan_dir, tmp_path, antithetic_noise=True)))
    prompts = [p for p in PROMPTS for _ in range(4)]
    pids, sids = [0] * 4 + [1] * 4, list(range(4)) * 2
    kw = dict(num_steps=3, guidance_scale=trainer.cfg.sample.guidance_scale, kernel=trainer.kernel, seed=5,
              share_initial_noise=True, store_means=True, decode=False)
    embeds = trainer.embeds_for(prompts)
    anti = rollout(trainer.adapter, embeds, pids, sids, antithetic=True, **kw)
    plain = rollout(trainer.adapter, embeds, pids, sids, **kw)
    x1, mean = anti.latents[:, 1], anti.means[:, 0]
    for even in range(0, 8, 2):
        # one x_T per group: the pair's first-step means agree, and their steps are mirror images about them
        torch.testing.assert_close(mean[even], mean[even + 1])
        torch.testing.assert_close(x1[even] - mean[even], -(x1[even + 1] - mean[even + 1]), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(anti.log_probs[even, 0], anti.log_probs[even + 1, 0], rtol=1e-5, atol=1e-6)
        assert not torch.allclose(x1[even], x1[even + 1])
    # even samples draw exactly the noise they draw without the option
    torch.testing.assert_close(anti.latents[0::2], plain.latents[0::2], rtol=0, atol=0)
    assert not torch.allclose(anti.latents[1::2, 1], plain.latents[1::2, 1])


@pytest.mark.parametrize("sample, fix", [({"share_initial_noise": False}, "share_initial_noise"),
                                         ({"group_size": 3, "prompts_per_iteration": 2, "batch_size": 6}, "even"),
                                         ])
def test_antithetic_noise_config_errors_name_the_fix(tmp_path, sample, fix):
    with pytest.raises(ConfigError, match=fix):
        from_dict(_cfg("unused", tmp_path, antithetic_noise=True, **sample))


def test_antithetic_noise_is_refused_where_no_sde_rollout_uses_it(tmp_path):
    cfg = _cfg("unused", tmp_path, antithetic_noise=True)
    cfg["train"]["algorithm"] = "nft"
    with pytest.raises(ConfigError, match="remove the key"):
        from_dict(cfg)
