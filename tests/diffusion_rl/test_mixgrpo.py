"""MixGRPO: the sliding SDE window follows the reference's progressive schedule, DPM-Solver++ 2M takes only
the ODE steps after the window (trained log-probs unchanged), and one iteration trains tiny SD3 and FLUX."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl.config import SampleConfig, from_dict
from diffusion_rl.kernels import Kernel
from diffusion_rl.sample_assignment import sde_steps
from diffusion_rl.solvers import dpm2_step
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures


def _reference_window(it: int, size: int = 4, every: int = 25, stride: int = 1, max_t: int = 23) -> list[int]:
    """MixGRPO's GRPOTrainingStates (progressive, prog_overlap, roll_back) replayed iteration by iteration:
    the window is read, then the state advances; an empty window (cur == max_t) is skipped here."""
    cur, in_group = 0, 0
    for _ in range(it):
        in_group += 1
        if in_group >= every:
            in_group, cur = 0, cur + stride
        if cur > max_t or cur == max_t:  # roll back (the reference waits one more group on an empty window)
            cur = 0
    return list(range(cur, min(cur + size, max_t)))


def test_sliding_window_follows_mixgrpo_progressive_schedule():
    cfg = from_dict({"preset": "mixgrpo", "reward": {"rewards": {"mock": 1.0}}}).sample
    for it in [0, 1, 24, 25, 49, 50, 26 * 25, 500, 524, 525, 550, 575, 22 * 25 + 3, 23 * 25, 23 * 25 + 30, 3000]:
        assert sde_steps(cfg, 0, it) == _reference_window(it), it
    # by hand: a full window at the start, shrinking windows at the end of [0, 23), then back to the start
    assert sde_steps(cfg, 0, 0) == [0, 1, 2, 3] and sde_steps(cfg, 0, 25) == [1, 2, 3, 4]
    assert sde_steps(cfg, 0, 21 * 25) == [21, 22] and sde_steps(cfg, 0, 23 * 25) == [0, 1, 2, 3]
    frozen = SampleConfig(num_steps=10, sde_window=[2, 8], sde_window_size=3, sde_window_shift_every=5,
                          sde_window_stride=0)
    assert {tuple(sde_steps(frozen, 0, it)) for it in range(40)} == {(2, 3, 4)}
    with pytest.raises(ConfigError, match="sde_window_size"):
        SampleConfig(sde_window_shift_every=3)


def _adapter(tiny_pipeline_dir, kind):
    from diffusers import DiffusionPipeline

    from diffusion_rl.pipelines import make_adapter

    pipe = DiffusionPipeline.from_pretrained(str(tiny_pipeline_dir(kind)))
    pipe.set_progress_bar_config(disable=True)
    return make_adapter(pipe, 16, 16)


def test_dpm2_takes_only_the_ode_steps_after_the_window(tiny_pipeline_dir):
    from diffusion_rl.rollout import rollout

    adapter = _adapter(tiny_pipeline_dir, "sd3")
    emb = adapter.encode(["a red circle", "a blue square"])
    kw = dict(num_steps=6, guidance_scale=1.0, kernel=Kernel("flow_sde", 0.7), sde_steps=[1, 2], seed=1, epoch=0,
              decode=False)
    euler = rollout(adapter, emb, [0, 1], [0, 0], **kw)
    dpm = rollout(adapter, emb, [0, 1], [0, 0], ode_solver="dpm2", **kw)
    # up to the end of the window the trajectories and the log-probs the trainer uses are identical
    torch.testing.assert_close(dpm.latents[:, :4], euler.latents[:, :4], rtol=0, atol=0)
    torch.testing.assert_close(dpm.log_probs[:, 1:3], euler.log_probs[:, 1:3], rtol=0, atol=0)
    assert not torch.allclose(dpm.latents[:, -1], euler.latents[:, -1])
    # independent replay of the post-window steps with the 2M formula from the step-2 and step-3 predictions
    sched = adapter.schedule(6)
    x, prev = dpm.latents[:, 3], None
    for j in range(2, 6):
        xj = dpm.latents[:, j]
        t = sched.timesteps[j].expand(2)
        v = adapter.predict(adapter.denoiser, xj, t, emb, 1.0)
        x0 = xj - float(sched.a[j]) * v
        if j >= 3:
            x = dpm2_step(xj, x0, *prev, float(sched.a[j]), float(sched.b[j]))
            torch.testing.assert_close(dpm.latents[:, j + 1], x, rtol=1e-5, atol=1e-6)
        prev = (x0, float(sched.a[j]))


@pytest.mark.parametrize("preset", ["mixgrpo", "mixgrpo_flash"])
@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_one_mixgrpo_iteration_trains_tiny_pipelines(kind, preset, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    cfg = from_dict({
        "preset": preset,
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16},
        "sample": {"num_steps": 6, "sde_window": [0, 5], "sde_window_size": 2, "sde_window_shift_every": 1,
                   "group_size": 2, "prompts_per_iteration": 2, "batch_size": 4, "guidance_scale": 1.0},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 2, "learning_rate": 1e-3, "micro_batch_size": 2, "clip_range": 0.2},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(tmp_path / kind), "progress": False},
    })
    trainer = Trainer(cfg)
    before = [p.detach().clone() for p in trainer.trainable]
    batch, _ = trainer.collect(1)
    assert batch.traj.sde_mask.nonzero().flatten().tolist() == [1, 2]  # the window moved by one at iteration 1
    assert batch.train_steps.tolist() == [[1, 2]] * 4
    metrics = trainer.train_iteration(1)
    assert math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.trainable))
