"""DiffusionNFT: the loss, the optimality probabilities and the old-policy schedule equal the paper's formulas
computed independently; DPM-Solver++ 2M is second order; one iteration trains tiny SD3 and FLUX pipelines."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl.algorithms.nft import nft_loss, old_policy_decay, optimality_probability, sample_ode
from diffusion_rl.config import from_dict
from diffusion_rl.solvers import dpm2_step
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures


def _random(seed=0, shape=(4, 3, 5, 5)):
    g = torch.Generator().manual_seed(seed)
    x0, eps = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    v_theta, v_old = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    sigma = torch.tensor([0.9, 0.5, 0.2, 0.05])
    r = torch.tensor([1.0, 0.0, 0.3, 0.75])
    s = sigma.view(-1, 1, 1, 1)
    return x0, eps, v_theta, v_old, sigma, r, (1 - s) * x0 + s * eps


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_nft_loss_equals_the_velocity_form_of_the_paper(beta):
    x0, eps, v_theta, v_old, sigma, r, x_t = _random()
    got = nft_loss(v_theta, v_old, x_t, x0, sigma, r, beta, adaptive=True, clip_max=5.0)
    # independent: in velocity space, target u = eps - x0, and the x0 error of v is sigma * (u - v)
    u = eps - x0
    want = []
    for b in range(4):
        s = float(sigma[b])
        vp = (1 - beta) * v_old[b] + beta * v_theta[b]
        vn = (1 + beta) * v_old[b] - beta * v_theta[b]
        pos = (s ** 2 * ((vp - u[b]) ** 2).mean()) / max(s * (vp - u[b]).abs().mean().item(), 1e-5)
        neg = (s ** 2 * ((vn - u[b]) ** 2).mean()) / max(s * (vn - u[b]).abs().mean().item(), 1e-5)
        want.append(5.0 * (r[b] * pos + (1 - r[b]) * neg) / beta)
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-5, atol=0)
    plain = nft_loss(v_theta, v_old, x_t, x0, sigma, r, beta, adaptive=False)
    s = sigma.view(-1, 1, 1, 1)
    vp, vn = (1 - beta) * v_old + beta * v_theta, (1 + beta) * v_old - beta * v_theta
    want_plain = (r * (s ** 2 * (vp - u) ** 2).mean((1, 2, 3)) + (1 - r) * (s ** 2 * (vn - u) ** 2).mean((1, 2, 3))) / beta
    torch.testing.assert_close(plain, want_plain, rtol=1e-5, atol=0)


def test_nft_loss_pulls_toward_good_and_away_from_bad_samples():
    x0, eps, v_theta, v_old, sigma, _, x_t = _random(1)
    u = eps - x0
    for r_val, toward in ((1.0, True), (0.0, False)):
        v = v_old.clone().requires_grad_(True)  # at v_theta = v_old both implicit policies equal v_old
        nft_loss(v, v_old, x_t, x0, sigma, torch.full((4,), r_val), 1.0, adaptive=False).sum().backward()
        # a small gradient step moves v towards the flow-matching target (r = 1) or away from it (r = 0)
        moved = v.detach() - 1e-3 * v.grad
        before, after = ((v_old - u) ** 2).sum(), ((moved - u) ** 2).sum()
        assert (after < before) == toward
    # the weight gets no gradient: the adaptive loss's gradient is the plain one divided by the weight
    v = v_theta.clone().requires_grad_(True)
    r1 = torch.ones(4)
    nft_loss(v, v_old, x_t, x0, sigma, r1, 1.0, adaptive=True).sum().backward()
    w = (sigma.view(-1, 1, 1, 1) * (v_theta - u)).abs().mean((1, 2, 3), keepdim=True)
    v2 = v_theta.clone().requires_grad_(True)
    nft_loss(v2, v_old, x_t, x0, sigma, r1, 1.0, adaptive=False).sum().backward()
    torch.testing.assert_close(v.grad, v2.grad / w, rtol=1e-4, atol=0)


def test_optimality_probability_is_the_papers_mapping():
    a = torch.tensor([-7.0, -5.0, -2.5, 0.0, 1.0, 5.0, 12.0])
    # r = clip(A / (2 * 5) + 0.5, 0, 1) with A clipped to [-5, 5], by hand
    want = torch.tensor([0.0, 0.0, 0.25, 0.5, 0.6, 1.0, 1.0])
    torch.testing.assert_close(optimality_probability(a, 5.0), want)
    torch.testing.assert_close(optimality_probability(torch.tensor([0.5, -1.0]), 1.0), torch.tensor([0.75, 0.0]))


def test_old_policy_decay_follows_the_reference_schedules():
    # decay_type 1 (default): flat 0, rate 0.001, cap 0.5; decay_type 2 (OCR): flat 75, rate 0.0075, cap 0.999
    t1 = (0.0, 0.001, 0.5)
    assert [old_policy_decay(s, *t1) for s in (0, 1, 100, 499, 500, 10_000)] == pytest.approx(
        [0.0, 0.001, 0.1, 0.499, 0.5, 0.5])
    t2 = (75.0, 0.0075, 0.999)
    assert [old_policy_decay(s, *t2) for s in (0, 74, 75, 175, 208, 300)] == pytest.approx(
        [0.0, 0.0, 0.0, 0.75, 0.9975, 0.999])


def _x0_pred(x: torch.Tensor, s: float, c2: float = 0.09) -> torch.Tensor:
    """The exact E[x0 | x_s] for data N(0, c2) under x_s = (1 - s) x0 + s eps."""
    return (1 - s) * c2 / ((1 - s) ** 2 * c2 + s ** 2) * x


def _solve_error(solver: str, n: int, lo: float = 0.02, hi: float = 0.98, c2: float = 0.09) -> float:
    """|numerical - exact| of the flow ODE from sigma `hi` to `lo` in n uniform steps, for N(0, c2) data: the
    exact ODE keeps x_s / std(s) fixed, std(s) = sqrt((1 - s)^2 c2 + s^2)."""
    def std(s):
        return math.sqrt((1 - s) ** 2 * c2 + s ** 2)

    sig = [hi - (hi - lo) * i / n for i in range(n + 1)]
    z = torch.linspace(-2, 2, 9, dtype=torch.float64)
    x, prev = z * std(hi), None
    for s, s_next in zip(sig[:-1], sig[1:]):
        x0 = _x0_pred(x, s, c2)
        if solver == "euler":
            x = x + (s_next - s) * (x - x0) / s
        else:
            x = dpm2_step(x, x0, *(prev or (None, None)), s, s_next)
            prev = (x0, s)
    return float((x - z * std(lo)).abs().max())


def test_dpm_solver_2m_is_second_order_and_euler_first():
    # stop at sigma 0.02: a last step to 0 returns x0, exact for this data, which would hide the order
    euler_rate = _solve_error("euler", 32) / _solve_error("euler", 64)
    dpm_rate = _solve_error("dpm2", 32) / _solve_error("dpm2", 64)
    assert 1.6 < euler_rate < 2.5 and 3.2 < dpm_rate < 5.0, (euler_rate, dpm_rate)
    assert _solve_error("dpm2", 32) < _solve_error("euler", 32) / 2


def test_dpm2_first_step_is_euler_and_last_returns_x0():
    g = torch.Generator().manual_seed(0)
    x, x0 = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    torch.testing.assert_close(dpm2_step(x, x0, None, None, 1.0, 0.7), x + (0.7 - 1.0) * (x - x0) / 1.0)
    torch.testing.assert_close(dpm2_step(x, x0, torch.zeros(3, 4), 0.6, 0.3, 0.0), x0)


def _adapter(tiny_pipeline_dir, kind):
    from diffusers import DiffusionPipeline

    from diffusion_rl.pipelines import make_adapter

    pipe = DiffusionPipeline.from_pretrained(str(tiny_pipeline_dir(kind)))
    pipe.set_progress_bar_config(disable=True)
    return make_adapter(pipe, 16, 16)


def test_euler_sampler_equals_the_ode_rollout(tiny_pipeline_dir):
    from diffusion_rl.kernels import Kernel
    from diffusion_rl.rollout import rollout

    adapter = _adapter(tiny_pipeline_dir, "sd3")
    emb = adapter.encode(["a red circle", "a blue square"])
    traj = rollout(adapter, emb, [0, 1], [0, 0], num_steps=3, guidance_scale=1.0, kernel=Kernel("ode", 0.0),
                   seed=3, epoch=2, decode=False)
    x = sample_ode(adapter, adapter.denoiser, emb, [0, 1], [0, 0], num_steps=3, guidance_scale=1.0, solver="euler",
                   seed=3, epoch=2)
    torch.testing.assert_close(x, traj.latents[:, -1], rtol=1e-5, atol=1e-6)


def _nft_config(kind, tmp_path, tiny_pipeline_dir, **train):
    return from_dict({
        "preset": "diffusion_nft",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4, "lora_alpha": 4},
        "sample": {"num_steps": 3, "group_size": 2, "prompts_per_iteration": 2, "batch_size": 4},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 1, "learning_rate": 1e-2, "micro_batch_size": 2, "timestep_fraction": 0.67, **train},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(tmp_path / kind), "progress": False},
    })


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_one_nft_iteration_trains_tiny_pipelines(kind, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(_nft_config(kind, tmp_path, tiny_pipeline_dir))
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert math.isfinite(metrics["train/loss"]) and metrics["train/loss"] > 0
    assert metrics["train/grad_norm"] > 0
    after = [p.detach().clone() for p in trainer.trainable]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    # after one optimizer step the old policy is 0.001 old + 0.999 new (decay type 1 at step 1)
    assert metrics["nft/old_decay"] == pytest.approx(0.001)
    for b, a, o in zip(before, after, trainer.algorithm.old):
        torch.testing.assert_close(o, 0.001 * b + 0.999 * a, rtol=1e-5, atol=1e-7)
    assert trainer.last_images.shape == (4, 3, 16, 16)
    # two timesteps of three per sample were trained (timestep_fraction 0.67), every sample its own draw
    steps = trainer.algorithm.train_steps(0, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1]), 3)
    assert steps.shape == (4, 2) and all(len(set(row.tolist())) == 2 for row in steps)


def test_nft_config_checks():
    rw = {"rewards": {"mock": 1.0}}
    cfg = from_dict({"preset": "diffusion_nft", "reward": rw})
    assert cfg.train.algorithm == "nft" and cfg.sample.kernel == "ode" and cfg.sample.ode_solver == "dpm2"
    assert cfg.sample.guidance_scale == 1.0 and cfg.nft.beta == 1.0
    with pytest.raises(ConfigError, match="nft.old_decay"):
        from_dict({"train": {"algorithm": "nft"}, "nft": {"old_decay": [0, 0.1, 1.0]}, "sample": {"kernel": "ode"},
                   "reward": rw})
    with pytest.raises(ConfigError, match="ode_solver"):
        from_dict({"sample": {"ode_solver": "heun"}, "reward": rw})
    with pytest.raises(ConfigError, match="kernel 'ode'"):
        from_dict({"train": {"algorithm": "grpo"}, "sample": {"kernel": "ode"}, "reward": rw})


def test_interrupted_and_resumed_nft_run_equals_an_uninterrupted_one(tmp_path, tiny_pipeline_dir):
    """2 iterations, checkpoint, resume for 1 more == 3 straight: parameters, EMA, old policy and every metric
    (the old policy travels in the checkpoint as safetensors)."""
    from diffusion_rl.checkpointing import read_checkpoint
    from diffusion_rl.trainer import Trainer

    def without_times(history):
        return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]

    straight = Trainer(_nft_config("sd3", tmp_path / "a", tiny_pipeline_dir, iterations=3))
    straight.fit()
    first = Trainer(_nft_config("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=2))
    first.fit()
    ckpt = tmp_path / "b" / "sd3" / "checkpoints" / "iter_000002"
    saved = read_checkpoint(ckpt)["algorithm_tensors"]
    assert saved is not None and len(saved) == len(first.algorithm.old)
    for i, o in enumerate(first.algorithm.old):
        assert torch.equal(saved[f"old.{i}"], o.cpu())
    resumed = Trainer(_nft_config("sd3", tmp_path / "b", tiny_pipeline_dir, iterations=3, resume_from=str(ckpt)))
    assert resumed.iteration == 2 and resumed.algorithm.old is not None
    resumed.fit()
    for a, b in zip(straight.trainable, resumed.trainable, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(straight.algorithm.old, resumed.algorithm.old, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(straight.ema.shadow, resumed.ema.shadow, strict=True):
        assert torch.equal(a, b)
    assert without_times(resumed.history) == without_times(straight.history)
