"""MixGRPO-Flash (`preset: mixgrpo_flash`) on the tiny SD3 and FLUX pipelines: what makes it Flash. The ODE steps
after the SDE window are DPM-Solver++ 2M (`sample.ode_solver: dpm2`), so a rollout ends elsewhere than MixGRPO's
Euler rollout from the same noise, exactly where an independent 2M integration of the model's velocity ends; and
the window shifts every 20 iterations (MixGRPO: 25)."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl.config import from_dict
from diffusion_rl.sample_assignment import sde_steps
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures
from tests._helpers.tolerances import assert_close_scaled

MOCK = {"reward": {"rewards": {"mock": 1.0}}}


def test_flash_window_shifts_every_20_iterations():
    flash = from_dict({"preset": "mixgrpo_flash", **MOCK}).sample
    plain = from_dict({"preset": "mixgrpo", **MOCK}).sample
    assert flash.ode_solver == "dpm2" and plain.ode_solver == "euler"
    # a 4-step window in [0, 23), one step further every 20 iterations
    assert sde_steps(flash, 0, 0) == [0, 1, 2, 3]
    assert sde_steps(flash, 0, 19) == [0, 1, 2, 3]
    assert sde_steps(flash, 0, 20) == [1, 2, 3, 4]
    assert sde_steps(flash, 0, 40) == [2, 3, 4, 5]
    assert sde_steps(plain, 0, 20) == [0, 1, 2, 3] and sde_steps(plain, 0, 25) == [1, 2, 3, 4]  # MixGRPO: 25


def _lam(sigma: float) -> float:
    """DPM-Solver's half log-SNR lambda = log(alpha / sigma) of a rectified flow x = (1 - sigma) x0 + sigma eps."""
    return math.log((1.0 - sigma) / sigma)


@torch.no_grad()
def _dpm_solver_pp_2m(predict, x: torch.Tensor, sigmas: list[float], x0_prev: torch.Tensor,
                      sigma_prev: float) -> torch.Tensor:
    """Integrate the flow ODE from `x` at sigmas[0] through sigmas[-1] = 0 with DPM-Solver++(2M) (Lu et al. 2022,
    Alg. 2, data prediction x0 = x - sigma v), written here from the paper: with h = lambda_next - lambda,
    r = h_last / h and D = (1 + 1/(2r)) x0 - 1/(2r) x0_last,
        x_next = (sigma_next / sigma) x - alpha_next (exp(-h) - 1) D,
    first order on the final step to sigma = 0 (diffusers' `lower_order_final`), where it returns x0. The
    first step's x0_last is that of the step before (the last SDE step's prediction)."""
    for s, s_next in zip(sigmas[:-1], sigmas[1:], strict=True):
        x0 = x - s * predict(x, s)
        if s_next == 0.0:
            return x0
        h = _lam(s_next) - _lam(s)
        r = (_lam(s) - _lam(sigma_prev)) / h
        d = (1 + 1 / (2 * r)) * x0 - 1 / (2 * r) * x0_prev
        x = (s_next / s) * x - (1.0 - s_next) * math.expm1(-h) * d
        x0_prev, sigma_prev = x0, s
    return x


def _trainer(preset: str, kind: str, out, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    return Trainer(from_dict({
        "preset": preset,
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16},
        # a 2-step window in [0, 5) of 6 steps; the preset's shift period (20 for Flash) is kept
        "sample": {"num_steps": 6, "sde_window": [0, 5], "sde_window_size": 2, "group_size": 2,
                   "prompts_per_iteration": 2, "batch_size": 4, "guidance_scale": 1.0},
        "train": {"iterations": 1, "learning_rate": 1e-3, "micro_batch_size": 2, "clip_range": 0.2},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(out), "progress": False, "eval_every": 0, "grid_every": 0},
        **MOCK,
    }))


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_one_flash_iteration_integrates_after_the_window_with_dpm_solver_2m(kind, tmp_path, tiny_pipeline_dir):
    flash = _trainer("mixgrpo_flash", kind, tmp_path / "flash", tiny_pipeline_dir)
    euler = _trainer("mixgrpo", kind, tmp_path / "euler", tiny_pipeline_dir)
    f, _ = flash.collect(0)
    e, _ = euler.collect(0)
    window = f.traj.sde_mask.nonzero().flatten().tolist()
    assert window == [0, 1] == e.traj.sde_mask.nonzero().flatten().tolist()
    post = window[-1] + 1
    # the same noise and model: identical up to the end of the window, and so are the log-probs that are trained
    assert torch.equal(f.traj.latents[:, : post + 1], e.traj.latents[:, : post + 1])
    assert torch.equal(f.traj.log_probs[:, window], e.traj.log_probs[:, window])
    end_f, end_e = f.traj.latents[:, -1], e.traj.latents[:, -1]
    scale = float(end_e.abs().max())
    assert float((end_f - end_e).abs().max()) > 1e-2 * scale  # Flash ends elsewhere than Euler

    # the reference: DPM-Solver++ 2M of the policy's velocity on the rollout's sigmas, from the state after the window
    sched = f.traj.schedule
    sigmas = [float(s) for s in sched.a[post:]] + [float(sched.b[-1])]
    assert sigmas[-1] == 0.0 and float(sched.a[0]) == 1.0
    emb = flash.embeds_for(f.prompts)
    model = flash.policy.model.eval()
    t_of = {float(s): sched.timesteps[j] for j, s in enumerate(sched.a)}

    def predict(x: torch.Tensor, sigma: float) -> torch.Tensor:
        return flash.adapter.predict(model, x, t_of[sigma].expand(len(x)), emb, 1.0)

    last_sde = f.traj.latents[:, post - 1]  # the last SDE step's data prediction is 2M's memory at the first ODE step
    s_last = float(sched.a[post - 1])
    with torch.no_grad():
        x0_last = last_sde - s_last * predict(last_sde, s_last)
    ref = _dpm_solver_pp_2m(predict, f.traj.latents[:, post], sigmas, x0_last, s_last)
    # float32, the same ops in another order: measured 1-5e-7 of the latents' scale; the Euler gap is 8-20%
    assert_close_scaled(end_f, ref, rel=1e-5, scale=float(ref.abs().max()))

    # the one iteration trains: a finite loss that moves the weights
    before = [p.detach().clone() for p in flash.trainable]
    metrics = flash.train_iteration(0)
    assert math.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, flash.trainable, strict=True))
    # and the preset's 20-iteration period reaches the trainer's rollouts: one step further at iteration 20
    assert flash.collect(19)[0].traj.sde_mask.nonzero().flatten().tolist() == [0, 1]
    assert flash.collect(20)[0].traj.sde_mask.nonzero().flatten().tolist() == [1, 2]
