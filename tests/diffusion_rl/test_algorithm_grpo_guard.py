"""GRPO-Guard: RatioNorm and the 1 / dt step weight equal verl-omni's GRPOGuardLoss transcribed
(verl-project/verl-omni@073521e verl_omni/trainer/diffusion/diffusion_algos.py), the normalised log-ratio equals its
closed form mean(Delta mu * eps) for Gaussians built by hand, the trainer applies the step weight, one iteration
trains tiny SD3, FLUX and Wan pipelines, and the preset carries Flow-GRPO's defaults with GRPO-Guard's clip."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from diffusion_rl.algorithms.grpo_guard import grad_reweight, guard_policy_loss, ratio_norm
from diffusion_rl.config import from_dict
from mmreward.errors import ConfigError
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures
from tests._helpers.tolerances import assert_close_scaled
from tests._helpers.train_checks import assert_resumed_equals_straight, tiny_video, train_one_iteration
from tests._helpers.two_process import assert_trained_params_match, launch_two_processes


def _verl_omni_grpo_guard_loss(old_log_prob, log_prob, advantages, old_prev_sample_mean, prev_sample_mean,
                               std_dev_t, sqrt_dt, clip_ratio, adv_clip_max):
    """verl-omni@073521e GRPOGuardLoss.compute_loss, transcribed (rollout-correction weights omitted)."""
    advantages = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    sigma_t = std_dev_t.mean()
    sqrt_dt_mean = sqrt_dt.mean()
    scale = sqrt_dt_mean * sigma_t
    mean_diff_sq = (prev_sample_mean - old_prev_sample_mean).pow(2)
    mean_diff_sq = mean_diff_sq.mean(dim=tuple(range(1, mean_diff_sq.ndim)))
    ratio_mean_bias = mean_diff_sq / (2 * scale**2)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp((log_ratio + ratio_mean_bias) * scale)
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    return torch.mean(torch.maximum(unclipped_loss, clipped_loss)) / (sqrt_dt_mean**2), ratio


def _gaussian_log_prob(x, mean, std):
    """Element-mean log-density of N(mean, std^2), written out (log_prob_reduction: mean)."""
    return (-((x - mean) ** 2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean(dim=(1, 2, 3))


def test_guard_loss_equals_verl_omni_transcribed_on_hand_built_tensors():
    g = torch.Generator().manual_seed(0)
    dt, sigma_t = 0.1, 0.7 * math.sqrt(0.6 / 0.4)  # a Flow-SDE step at sigma 0.6: std = sigma_t sqrt(dt)
    std = sigma_t * math.sqrt(dt)
    mu_old = torch.randn(6, 4, 3, 3, generator=g)
    mu_theta = mu_old + 0.02 * torch.randn(6, 4, 3, 3, generator=g)
    x = mu_old + std * torch.randn(6, 4, 3, 3, generator=g)
    lp, old_lp = _gaussian_log_prob(x, mu_theta, std), _gaussian_log_prob(x, mu_old, std)
    adv = torch.tensor([1.5, -0.7, 0.3, -2.0, 0.9, -0.1])
    clipped = []
    for clip in (1e-3, 1e-1):  # one clip range that binds for some samples, one that binds for none
        pl, loss = guard_policy_loss(lp, old_lp, mu_theta, mu_old, torch.tensor(std), adv, torch.full((6,), -dt), clip,
                                     reweight=True)
        ref, ref_ratio = _verl_omni_grpo_guard_loss(old_lp, lp, adv, mu_old, mu_theta, torch.tensor(sigma_t),
                                                    torch.tensor(math.sqrt(dt)), clip, adv_clip_max=5.0)
        assert_close_scaled(loss, ref, rel=1e-5)
        assert_close_scaled(pl.ratio, ref_ratio, rel=1e-6)
        assert_close_scaled(pl.loss, ref * dt, rel=1e-5)  # the unweighted loss: delta_t = 1 / dt is the only factor
        clipped.append(float(pl.clip_fraction))
    assert 0 < clipped[0] < 1 and clipped[1] == 0  # both branches of the clip are exercised


def test_ratio_norm_is_the_noise_projection_of_the_mean_shift_at_every_step():
    """Eq. 8 in closed form: for x = mu_old + s eps, log r_hat = mean(Delta mu * eps), whatever the step's std s;
    the raw log-ratio's mean shift -|Delta mu|^2 / (2 s^2) and spread 1 / s are both gone."""
    g = torch.Generator().manual_seed(1)
    mu_old = torch.randn(5, 2, 4, 4, generator=g, dtype=torch.float64)  # float64: x - mu_old is s eps exactly enough
    d_mu = 0.01 * torch.randn(5, 2, 4, 4, generator=g, dtype=torch.float64)
    eps = torch.randn(5, 2, 4, 4, generator=g, dtype=torch.float64)
    expected = (d_mu * eps).mean(dim=(1, 2, 3))
    for s in (0.02, 0.3, 1.5):
        x = mu_old + s * eps
        lp, old_lp = _gaussian_log_prob(x, mu_old + d_mu, s), _gaussian_log_prob(x, mu_old, s)
        got = ratio_norm(lp, old_lp, mu_old + d_mu, mu_old, torch.tensor(s, dtype=torch.float64))
        assert_close_scaled(got, expected, rel=1e-9)
        raw = lp - old_lp  # the raw log-ratio is s-dependent: the thing RatioNorm removes
        assert_close_scaled(raw, expected / s - (d_mu**2).mean(dim=(1, 2, 3)) / (2 * s**2), rel=1e-9)


def test_grad_reweight_divides_by_the_mean_step_size():
    loss = torch.tensor(0.3)
    assert float(grad_reweight(loss, torch.tensor([-0.1, -0.1]))) == pytest.approx(3.0, rel=1e-6)
    assert float(grad_reweight(loss, torch.tensor([-0.1, -0.3]))) == pytest.approx(1.5, rel=1e-6)  # 1 / mean|dt|


def _guard_dict(kind, tiny_pipeline_dir, out, **train):
    return {
        "preset": "grpo_guard",
        "model": {"pretrained": str(tiny_pipeline_dir(kind)), "height": 16, "width": 16, "lora_rank": 4,
                  "lora_alpha": 4},
        "sample": {"num_steps": 3, "eval_num_steps": None, "guidance_scale": 2.0, "prompts_per_iteration": 2,
                   "group_size": 2, "batch_size": 4},
        "reward": {"rewards": {"mock": 1.0}},
        "train": {"iterations": 1, "learning_rate": 1e-2, "probe": "error", "timestep_fraction": 0.3,
                  "num_minibatches": 1, "num_inner_epochs": 2, "kl_beta": 0.0, "clip_range": 1e-2, "ema": False,
                  **train},
        "prompts": {"train": ["a red circle", "a blue square"]},
        "log": {"output_dir": str(out), "eval_every": 0, "grid_every": 0, "progress": False},
    }


def test_one_grpo_guard_iteration_weights_the_step_by_one_over_dt(tmp_path, tiny_pipeline_dir):
    """Tiny SD3: every sample trains step 0 (timestep_fraction 0.3 of 3 steps); with no KL the logged loss is the
    clipped loss on the normalised ratio times 1 / |dt_0| (plain GRPO logs the two equal)."""
    from diffusion_rl.trainer import Trainer

    trainer = Trainer(from_dict(_guard_dict("sd3", tiny_pipeline_dir, tmp_path / "g")))
    assert trainer.algorithm.name == "grpo_guard"
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    sched = trainer.adapter.schedule(3)
    dt0 = float((sched.b[0] - sched.a[0]).abs())
    assert metrics["train/policy_loss"] != 0.0  # the second inner epoch moves the ratio off 1
    assert metrics["train/loss"] == pytest.approx(metrics["train/policy_loss"] / dt0, rel=1e-5)
    assert abs(dt0 - 1.0) > 0.1  # so the weight is visible in the logged loss
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.trainable, strict=True))


@pytest.mark.slow  # the default suite runs GRPO-Guard on tiny SD3 (the 1 / dt test)
@pytest.mark.parametrize("kind", ["flux", "wan"])
def test_one_grpo_guard_iteration_trains_tiny_flux_and_wan(kind, tmp_path, tiny_pipeline_dir):
    from diffusion_rl.trainer import Trainer

    cfg = from_dict(_guard_dict(kind, tiny_pipeline_dir, tmp_path))
    trainer = Trainer(tiny_video(cfg) if kind == "wan" else cfg)
    metrics = train_one_iteration(trainer)
    assert math.isfinite(metrics["train/loss"]) and metrics["train/probe/max_abs_log_ratio"] < 1e-5
    assert trainer.last_images.shape[0] == 4 and metrics["adv/abs_mean"] > 0


def test_grpo_guard_preset_and_config_checks():
    rw = {"rewards": {"mock": 1.0}}
    cfg = from_dict({"preset": "grpo_guard", "reward": rw})
    assert (cfg.train.algorithm, cfg.train.clip_range, cfg.train.kl_beta, cfg.sample.kernel) == (
        "grpo_guard", 2e-6, 0.04, "flow_sde")
    assert (cfg.sample.group_size, cfg.sample.prompts_per_iteration, cfg.sample.noise_level) == (24, 48, 0.7)
    with pytest.raises(ConfigError, match="group_size"):
        from_dict({"preset": "grpo_guard", "sample": {"group_size": 1}, "reward": rw})
    with pytest.raises(ConfigError, match="ode"):
        from_dict({"preset": "grpo_guard", "sample": {"kernel": "ode"}, "reward": rw})


@pytest.mark.slow
def test_grpo_guard_resumes_bit_exact_and_two_processes_equal_one(tmp_path, tiny_pipeline_dir):
    """1 iteration + resume == 2 straight, bit for bit; 2 gloo processes with the same global batch give the same
    rewards, gradient norm and weights as 1 process."""
    from diffusion_rl.checkpointing import read_checkpoint
    from diffusion_rl.trainer import Trainer

    def run(sub, **train):
        d = _guard_dict("sd3", tiny_pipeline_dir, tmp_path / sub, **train)
        t = Trainer(from_dict(d))
        t.fit()
        return t

    straight = run("a", iterations=2)
    run("b", iterations=1)
    resumed = run("b", iterations=2, resume_from=str(tmp_path / "b" / "checkpoints" / "iter_000001"))
    assert_resumed_equals_straight(straight, resumed)

    d = _guard_dict("sd3", tiny_pipeline_dir, tmp_path / "dp2")
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(d))
    launch_two_processes(path)
    one = run("dp1")
    two = read_checkpoint(tmp_path / "dp2" / "checkpoints" / "iter_000001")
    h1, h2 = one.history[0], two["history"][0]  # losses are each process's own; rewards and gradients are global
    assert h2["reward/mock"] == pytest.approx(h1["reward/mock"], rel=1e-6)
    assert h2["train/grad_norm"] == pytest.approx(h1["train/grad_norm"], rel=1e-4)
    assert_trained_params_match(one, two["params"], atol=1e-4)
