"""Kernels against independent computations: Gaussian densities from torch.distributions in fp64, the
papers' formulas written in their drift form, and diffusers' own schedulers on the same inputs and noise."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion_rl import kernels as K
from mmreward.errors import ConfigError

SHAPE = (3, 4, 6, 6)


def _normal_logp(x, mean, std, reduction):
    lp = torch.distributions.Normal(mean.double(), torch.as_tensor(std).double().expand_as(mean)).log_prob(x.double())
    return lp.flatten(1).mean(1) if reduction == "mean" else lp.flatten(1).sum(1)


@pytest.fixture
def xv():
    g = torch.Generator().manual_seed(1)
    return torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_flow_sde_matches_drift_form_and_gaussian_density(xv, reduction):
    x, v, z = xv
    sigma, sigma_next, a = 0.6, 0.45, 0.7
    out = K.flow_sde_step(x, v, sigma, sigma_next, noise_level=a, noise=z, reduction=reduction)
    # Drift form of Flow-GRPO's SDE: dx = [v + sigma_t^2 / (2 sigma) (x + (1 - sigma) v)] dt + sigma_t dw
    sigma_t = a * math.sqrt(sigma / (1 - sigma))
    dt = sigma_next - sigma
    mean = x + (v + sigma_t**2 / (2 * sigma) * (x + (1 - sigma) * v)) * dt
    std = sigma_t * math.sqrt(-dt)
    torch.testing.assert_close(out.mean, mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.prev_sample, mean + std * z, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.log_prob.double(), _normal_logp(out.prev_sample, mean, std, reduction), rtol=1e-5, atol=1e-4)


def test_flow_sde_sigma_one_uses_second_sigma(xv):
    x, v, z = xv
    out = K.flow_sde_step(x, v, 1.0, 0.9, noise_level=0.7, noise=z)
    sigma_t = 0.7 * math.sqrt(1.0 / (1 - 0.9))
    torch.testing.assert_close(out.std.expand(SHAPE), torch.full(SHAPE, sigma_t * math.sqrt(0.1)))
    assert torch.isfinite(out.log_prob).all() and torch.isfinite(out.prev_sample).all()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_dance_sde_density(xv, reduction):
    x, v, z = xv
    sigma, sigma_next, eta = 0.8, 0.55, 0.3
    out = K.dance_sde_step(x, v, sigma, sigma_next, eta=eta, noise=z, reduction=reduction)
    # score of x_sigma given x0_hat: -(x - (1 - sigma) x0_hat) / sigma^2; drift v - eta^2/2 * score
    x0 = x - sigma * v
    mean = x + (v + 0.5 * eta**2 * (x - (1 - sigma) * x0) / sigma**2) * (sigma_next - sigma)
    std = eta * math.sqrt(sigma - sigma_next)
    torch.testing.assert_close(out.mean, mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.log_prob.double(), _normal_logp(mean + std * z, mean, std, reduction), rtol=1e-5, atol=1e-4)


def test_cps_both_log_probs(xv):
    x, v, z = xv
    sigma, sigma_next, a = 0.7, 0.5, 0.8
    ref = K.cps_step(x, v, sigma, sigma_next, noise_level=a, noise=z, log_prob_mode="reference")
    gau = K.cps_step(x, v, sigma, sigma_next, noise_level=a, noise=z, log_prob_mode="gaussian", reduction="sum")
    std = sigma_next * math.sin(a * math.pi / 2)
    x0, x1 = x - sigma * v, x + (1 - sigma) * v
    mean = (1 - sigma_next) * x0 + math.sqrt(sigma_next**2 - std**2) * x1
    torch.testing.assert_close(ref.mean, mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ref.log_prob, -(std * z).pow(2).flatten(1).mean(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gau.log_prob.double(), _normal_logp(mean + std * z, mean, std, "sum"), rtol=1e-5, atol=1e-3)


def test_ode_kernel_equals_flow_match_euler_scheduler(xv):
    from diffusers import FlowMatchEulerDiscreteScheduler

    x, _, _ = xv
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(6)
    ours = x.clone()
    theirs = x.clone()
    for i, t in enumerate(sched.timesteps):
        v = torch.sin(3 * theirs) + 0.1 * i  # any model output
        theirs = sched.step(v, t, theirs).prev_sample
        ours = K.ode_step(ours, torch.sin(3 * ours) + 0.1 * i, sched.sigmas[i], sched.sigmas[i + 1]).prev_sample
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_ddim_kernel_equals_diffusers_ddim(xv, prediction_type, eta):
    from diffusers import DDIMScheduler

    x, out, z = xv
    sched = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                          prediction_type=prediction_type, clip_sample=False, set_alpha_to_one=False)
    sched.set_timesteps(5)
    for t in sched.timesteps:
        theirs = sched.step(out, t, x, eta=eta, variance_noise=z).prev_sample
        a_t, a_prev = K.ddim_alphas(sched, t)
        ours = K.ddim_step(x, out, a_t, a_prev, eta=eta, prediction_type=prediction_type, noise=z)
        torch.testing.assert_close(ours.prev_sample, theirs, rtol=1e-5, atol=1e-5)
        assert torch.isfinite(ours.log_prob).all()
        if float(ours.std.max()) > 0:  # the last step (a_prev == a_t here) is deterministic whatever eta
            torch.testing.assert_close(ours.log_prob.double(), _normal_logp(theirs, ours.mean, ours.std, "mean"),
                                       rtol=1e-5, atol=1e-4)
        else:
            assert (ours.log_prob == 0).all()


def test_zero_noise_is_deterministic_without_nans(xv):
    x, v, z = xv
    for kernel in (K.Kernel("flow_sde", 0.0), K.Kernel("dance_sde", 0.0), K.Kernel("ode", 0.0)):
        out = kernel.step(x, v, 0.5, 0.25, noise=z)
        ode = K.ode_step(x, v, 0.5, 0.25)
        torch.testing.assert_close(out.prev_sample, ode.prev_sample)
        assert torch.isfinite(out.log_prob).all() and (out.log_prob == 0).all()
    # CPS at the last step has std 0 whatever the noise level
    last = K.cps_step(x, v, 0.2, 0.0, noise_level=0.9, noise=z, log_prob_mode="gaussian")
    assert torch.isfinite(last.log_prob).all()
    torch.testing.assert_close(last.prev_sample, x - 0.2 * v)


def test_given_prev_sample_scores_it_and_grad_flows_through_mean(xv):
    x, v, z = xv
    v = v.clone().requires_grad_(True)
    first = K.flow_sde_step(x, v.detach(), 0.6, 0.4, noise=z)
    again = K.flow_sde_step(x, v, 0.6, 0.4, prev_sample=first.prev_sample)
    torch.testing.assert_close(again.log_prob, first.log_prob)
    again.log_prob.sum().backward()
    assert v.grad is not None and v.grad.abs().sum() > 0


def test_fp64_on_request_and_per_item_sigmas(xv):
    x, v, z = xv
    sig = torch.tensor([0.9, 0.5, 0.3])
    nxt = torch.tensor([0.8, 0.4, 0.1])
    out = K.flow_sde_step(x, v, sig, nxt, noise=z, dtype=torch.float64)
    assert out.prev_sample.dtype == torch.float64
    for i in range(3):
        single = K.flow_sde_step(x[i : i + 1], v[i : i + 1], float(sig[i]), float(nxt[i]), noise=z[i : i + 1], dtype=torch.float64)
        torch.testing.assert_close(out.log_prob[i : i + 1], single.log_prob, rtol=1e-6, atol=1e-6)


def test_bad_arguments_raise_clear_errors(xv):
    x, v, _ = xv
    with pytest.raises(ConfigError, match="reduction"):
        K.ode_step(x, v, 0.5, 0.4, reduction="max")
    with pytest.raises(ConfigError, match="kernel must be one of"):
        K.Kernel("euler_a")
    with pytest.raises(ConfigError, match="prediction_type"):
        K.ddim_step(x, v, 0.5, 0.6, prediction_type="flow")
    with pytest.raises(ConfigError, match="one entry per batch item"):
        K.ode_step(x, v, torch.ones(5), 0.4)


def test_ddim_at_zero_terminal_snr_puts_no_noise_direction_into_the_mean():
    # CogVideoX's first step: a_t = 0 (rescaled betas), eta = 1, so sigma^2 = 1 - a_prev and the eps direction
    # sqrt(1 - a_prev - sigma^2) is exactly 0: the mean is sqrt(a_prev) x0 with x0 = -v (v-prediction at a_t = 0)
    g = torch.Generator().manual_seed(0)
    x, v = 3 * torch.randn(2, 4, 3, 8, 8, generator=g), torch.randn(2, 4, 3, 8, 8, generator=g)
    for a_prev in (0.07543450555643426, 0.3, 0.9):
        res = K.ddim_step(x, v, 0.0, a_prev, eta=1.0, prediction_type="v_prediction")
        want = -math.sqrt(a_prev) * v.double()
        # float32 rounding of the mean itself only: a leak of the 1e-4 cancellation residue times |x| ~ 10 fails
        assert float((res.mean.double() - want).abs().max()) <= 1e-6 * float(want.abs().max())
        assert res.std.flatten()[0].item() == pytest.approx(math.sqrt(1 - a_prev), rel=1e-6)
