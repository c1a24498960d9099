"""Transition kernels x_t -> x_{t-1} with the Gaussian log-density of the chosen next sample.

Every kernel takes the current sample, the model output and the schedule values of this step, and
returns a `StepResult(prev_sample, mean, std, log_prob)`:

- `prev_sample`: the next sample (drawn as `mean + std * noise`, or the given `prev_sample`),
- `mean`, `std`: the Gaussian transition N(mean, std^2 I) (std broadcastable to the sample),
- `log_prob`: log N(prev_sample; mean, std^2) per batch item, reduced over elements by
  `reduction="mean"` (what every reference implementation does, so their clip ranges transfer) or
  `"sum"` (the true log-density of the whole sample).

All arithmetic happens in `dtype` (fp32 by default, fp64 on request) whatever the model's dtype, because
bf16 means overflow and round-off drift that silently breaks the on-policy ratio of 1.
A zero std (eta = 0, or the last step of CPS) gives a deterministic step: prev_sample = mean and a
log_prob of 0 (a point mass has no density; we report 0 rather than NaN so that masks and sums work).

Flow-matching convention (diffusers `FlowMatchEulerDiscreteScheduler`): x_sigma = (1 - sigma) x0 + sigma x1
with x1 ~ N(0, I), the model predicts v = x1 - x0, and sampling goes from sigma = 1 down to 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from mmreward.errors import ConfigError

Reduction = Literal["mean", "sum"]
PredictionType = Literal["epsilon", "v_prediction", "sample"]
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class StepResult:
    prev_sample: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    log_prob: torch.Tensor


def _as(x: torch.Tensor | float, ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A scalar or per-item (B,) schedule value as a tensor broadcastable against `ref` (B, ...)."""
    t = torch.as_tensor(x, dtype=dtype, device=ref.device)
    if t.ndim == 0:
        return t
    if t.ndim == 1 and t.shape[0] == ref.shape[0]:
        return t.view(-1, *([1] * (ref.ndim - 1)))
    if t.ndim == ref.ndim:
        return t
    raise ConfigError(
        f"schedule values must be scalars or have one entry per batch item ({ref.shape[0]}), got shape {tuple(t.shape)}"
    )


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum"):
        raise ConfigError(f"reduction must be 'mean' or 'sum', got {reduction!r}")


def reduce_elements(values: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """Reduce every dimension but the batch one."""
    _check_reduction(reduction)
    dims = tuple(range(1, values.ndim))
    return values.mean(dim=dims) if reduction == "mean" else values.sum(dim=dims)


def gaussian_log_prob(
    x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduction: Reduction = "mean"
) -> torch.Tensor:
    """log N(x; mean, std^2) per element, reduced per batch item; 0 where std == 0 (a point mass)."""
    std = torch.as_tensor(std, dtype=mean.dtype, device=mean.device).expand_as(mean)
    positive = std > 0
    safe = torch.where(positive, std, torch.ones_like(std))
    per_element = -((x - mean) ** 2) / (2 * safe**2) - torch.log(safe) - _LOG_SQRT_2PI
    return reduce_elements(torch.where(positive, per_element, torch.zeros_like(per_element)), reduction)


def _finish(
    mean: torch.Tensor,
    std: torch.Tensor,
    noise: torch.Tensor | None,
    prev_sample: torch.Tensor | None,
    reduction: Reduction,
    dtype: torch.dtype,
) -> StepResult:
    std = torch.as_tensor(std, dtype=dtype, device=mean.device)
    if prev_sample is None:
        if noise is None:
            noise = torch.randn_like(mean)
        # where std == 0 the noise is ignored, so eta = 0 is exactly the deterministic sampler
        prev_sample = mean + std * noise.to(dtype)
    else:
        prev_sample = prev_sample.to(dtype)
    # The chosen sample is data, not a function of the parameters (as in every reference implementation).
    log_prob = gaussian_log_prob(prev_sample.detach(), mean, std, reduction)
    return StepResult(prev_sample, mean, std, log_prob)


def ode_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor | float,
    sigma_next: torch.Tensor | float,
    *,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    reduction: Reduction = "mean",
    dtype: torch.dtype = torch.float32,
) -> StepResult:
    """Euler step of the probability-flow ODE: x_next = x + (sigma_next - sigma) v (std 0, log_prob 0)."""
    x, v = x.to(dtype), v.to(dtype)
    s, s_next = _as(sigma, x, dtype), _as(sigma_next, x, dtype)
    mean = x + (s_next - s) * v
    return _finish(mean, torch.zeros((), dtype=dtype), noise, prev_sample, reduction, dtype)


def flow_sde_std(
    sigma: torch.Tensor, sigma_next: torch.Tensor, noise_level: float
) -> torch.Tensor:
    """Flow-GRPO's sigma_t = a * sqrt(sigma / (1 - sigma)).

    At sigma = 1 the ratio is infinite; Flow-GRPO substitutes the schedule's second sigma (sigmas[1]) in
    the denominator. sigma = 1 only occurs at the first step, whose sigma_next *is* sigmas[1], so we use it.
    """
    denom_sigma = torch.where(sigma >= 1, sigma_next, sigma)
    return noise_level * torch.sqrt(sigma / (1 - denom_sigma))


def flow_sde_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor | float,
    sigma_next: torch.Tensor | float,
    *,
    noise_level: float = 0.7,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    reduction: Reduction = "mean",
    dtype: torch.dtype = torch.float32,
) -> StepResult:
    """Flow-GRPO's marginal-preserving reverse SDE, discretised with Euler-Maruyama (dt = sigma_next - sigma < 0).

    mean = x (1 + sigma_t^2 dt / (2 sigma)) + v (1 + sigma_t^2 (1 - sigma) / (2 sigma)) dt,
    std  = sigma_t sqrt(-dt), with sigma_t = a sqrt(sigma / (1 - sigma)) (see `flow_sde_std`).
    noise_level a = 0 is the ODE.
    """
    x, v = x.to(dtype), v.to(dtype)
    s, s_next = _as(sigma, x, dtype), _as(sigma_next, x, dtype)
    dt = s_next - s
    sigma_t = flow_sde_std(s, s_next, noise_level)
    mean = x * (1 + sigma_t**2 / (2 * s) * dt) + v * (1 + sigma_t**2 * (1 - s) / (2 * s)) * dt
    std = sigma_t * torch.sqrt(-dt)
    return _finish(mean, std, noise, prev_sample, reduction, dtype)


def dance_sde_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor | float,
    sigma_next: torch.Tensor | float,
    *,
    eta: float = 0.3,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    reduction: Reduction = "mean",
    dtype: torch.dtype = torch.float32,
) -> StepResult:
    """DanceGRPO's reverse SDE with a constant noise scale eta.

    With x0_hat = x - sigma v and score s = -(x - (1 - sigma) x0_hat) / sigma^2:
    mean = x + (v - eta^2 s / 2) dsigma,  std = eta sqrt(sigma - sigma_next)  (dsigma = sigma_next - sigma).
    """
    x, v = x.to(dtype), v.to(dtype)
    s, s_next = _as(sigma, x, dtype), _as(sigma_next, x, dtype)
    dsigma = s_next - s
    x0_hat = x - s * v
    score = -(x - (1 - s) * x0_hat) / s**2
    mean = x + (v - 0.5 * eta**2 * score) * dsigma
    std = eta * torch.sqrt(-dsigma)
    return _finish(mean, std, noise, prev_sample, reduction, dtype)


def cps_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor | float,
    sigma_next: torch.Tensor | float,
    *,
    noise_level: float = 0.8,
    log_prob_mode: Literal["reference", "gaussian"] = "reference",
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    reduction: Reduction = "mean",
    dtype: torch.dtype = torch.float32,
) -> StepResult:
    """Coefficients-preserving sampling (CPS, as in Flow-GRPO's `sde_type="cps"` / MixGRPO).

    std = sigma_next sin(a pi / 2); x0_hat = x - sigma v; x1_hat = x + (1 - sigma) v;
    mean = (1 - sigma_next) x0_hat + sqrt(sigma_next^2 - std^2) x1_hat.
    The total noise coefficient stays sigma_next, but the kernel is NOT marginal-preserving for an
    imperfect model: it is a heuristic sampler, not the discretisation of an SDE.

    log_prob_mode="reference" returns the reference's unnormalised -(x_next - mean)^2 (reduced), which
    ignores std (its gradient scale differs from the Gaussian's by 1 / (2 std^2)); "gaussian" returns the
    true Gaussian log-density.
    """
    if log_prob_mode not in ("reference", "gaussian"):
        raise ConfigError(f"log_prob_mode must be 'reference' or 'gaussian', got {log_prob_mode!r}")
    x, v = x.to(dtype), v.to(dtype)
    s, s_next = _as(sigma, x, dtype), _as(sigma_next, x, dtype)
    std = s_next * math.sin(noise_level * math.pi / 2)
    x0_hat = x - s * v
    x1_hat = x + (1 - s) * v
    mean = (1 - s_next) * x0_hat + torch.sqrt(torch.clamp(s_next**2 - std**2, min=0)) * x1_hat
    out = _finish(mean, std, noise, prev_sample, reduction, dtype)
    if log_prob_mode == "reference":
        out.log_prob = reduce_elements(-((out.prev_sample.detach() - mean) ** 2), reduction)
    return out


def ddim_step(
    x: torch.Tensor,
    model_output: torch.Tensor,
    alpha_prod_t: torch.Tensor | float,
    alpha_prod_t_prev: torch.Tensor | float,
    *,
    eta: float = 1.0,
    prediction_type: PredictionType = "epsilon",
    clip_sample_range: float | None = None,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
    reduction: Reduction = "mean",
    dtype: torch.dtype = torch.float32,
) -> StepResult:
    """DDIM (Song et al. eq. 12) with stochasticity eta, as in diffusers' `DDIMScheduler.step` and DDPO.

    x0 and eps from the prediction type; sigma_t = eta sqrt((1 - a_prev) / (1 - a_t) (1 - a_t / a_prev));
    mean = sqrt(a_prev) x0 + sqrt(1 - a_prev - sigma_t^2) eps; std = sigma_t.
    """
    x, out = x.to(dtype), model_output.to(dtype)
    # the coefficients in float64: at a zero-terminal-SNR step (a_t = 0, CogVideoX) with eta = 1, sigma_t^2 equals
    # 1 - a_prev, and in float32 their difference rounds to ~1e-8, whose square root (1e-4) would leak into the mean
    wide = torch.float32 if x.device.type == "mps" else torch.float64  # MPS has no float64
    a_t, a_prev = _as(alpha_prod_t, x, wide), _as(alpha_prod_t_prev, x, wide)
    std = eta * ((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)).clamp(min=0).sqrt()
    direction = torch.clamp(1 - a_prev - std**2, min=0).sqrt().to(dtype)
    a_t, a_prev, std = a_t.to(dtype), a_prev.to(dtype), std.to(dtype)
    b_t = 1 - a_t
    if prediction_type == "epsilon":
        x0 = (x - b_t.sqrt() * out) / a_t.sqrt()
        eps = out
    elif prediction_type == "sample":
        x0 = out
        eps = (x - a_t.sqrt() * x0) / b_t.sqrt()
    elif prediction_type == "v_prediction":
        x0 = a_t.sqrt() * x - b_t.sqrt() * out
        eps = a_t.sqrt() * out + b_t.sqrt() * x
    else:
        raise ConfigError(
            f"prediction_type must be 'epsilon', 'v_prediction' or 'sample', got {prediction_type!r}"
        )
    if clip_sample_range is not None:
        x0 = x0.clamp(-clip_sample_range, clip_sample_range)
    mean = a_prev.sqrt() * x0 + direction * eps
    return _finish(mean, std, noise, prev_sample, reduction, dtype)


# ----------------------------------------------------------------------------------------------
# A kernel chosen by name, so configs and rollouts can pass one object around
# ----------------------------------------------------------------------------------------------
KernelName = Literal["ode", "flow_sde", "dance_sde", "cps", "cps_gaussian", "ddim"]
FLOW_KERNELS = ("ode", "flow_sde", "dance_sde", "cps", "cps_gaussian")


@dataclass(frozen=True)
class Kernel:
    """A named transition kernel with its noise level (a for Flow-SDE/CPS, eta for Dance-SDE and DDIM)."""

    name: KernelName = "flow_sde"
    noise_level: float = 0.7
    reduction: Reduction = "mean"
    dtype: torch.dtype = torch.float32
    prediction_type: PredictionType = "epsilon"  # DDIM only
    clip_sample_range: float | None = None  # DDIM only

    def __post_init__(self) -> None:
        if self.name not in FLOW_KERNELS + ("ddim",):
            raise ConfigError(f"kernel must be one of {FLOW_KERNELS + ('ddim',)}, got {self.name!r}")
        if self.noise_level < 0:
            raise ConfigError(f"noise_level must be >= 0, got {self.noise_level}")
        _check_reduction(self.reduction)

    @property
    def is_flow(self) -> bool:
        return self.name in FLOW_KERNELS

    def deterministic(self) -> Kernel:
        """The same family's noiseless sampler (ODE for flows, DDIM eta=0), used outside the SDE window."""
        return Kernel("ode" if self.is_flow else "ddim", 0.0, self.reduction, self.dtype,
                      self.prediction_type, self.clip_sample_range)

    def step(
        self,
        x: torch.Tensor,
        model_output: torch.Tensor,
        a: torch.Tensor | float,
        b: torch.Tensor | float,
        *,
        noise: torch.Tensor | None = None,
        prev_sample: torch.Tensor | None = None,
    ) -> StepResult:
        """`a, b` are (sigma, sigma_next) for flow kernels and (alpha_prod_t, alpha_prod_t_prev) for DDIM."""
        kw = {"noise": noise, "prev_sample": prev_sample, "reduction": self.reduction, "dtype": self.dtype}
        if self.name == "ode":
            return ode_step(x, model_output, a, b, **kw)
        if self.name == "flow_sde":
            return flow_sde_step(x, model_output, a, b, noise_level=self.noise_level, **kw)
        if self.name == "dance_sde":
            return dance_sde_step(x, model_output, a, b, eta=self.noise_level, **kw)
        if self.name in ("cps", "cps_gaussian"):
            mode = "gaussian" if self.name == "cps_gaussian" else "reference"
            return cps_step(x, model_output, a, b, noise_level=self.noise_level, log_prob_mode=mode, **kw)
        return ddim_step(
            x, model_output, a, b, eta=self.noise_level, prediction_type=self.prediction_type,
            clip_sample_range=self.clip_sample_range, **kw,
        )


def ddim_alphas(scheduler, timesteps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(alpha_prod_t, alpha_prod_t_prev) of a diffusers DDIM-style scheduler for each timestep, as its `step` does.

    prev_t = t - num_train_timesteps // num_inference_steps; below 0 the scheduler's final_alpha_cumprod.
    """
    if getattr(scheduler, "num_inference_steps", None) is None:
        raise ConfigError("scheduler: call scheduler.set_timesteps(num_steps) before ddim_alphas")
    cumprod = scheduler.alphas_cumprod.to(torch.float64)
    t = torch.as_tensor(timesteps).long().cpu()
    prev_t = t - scheduler.config.num_train_timesteps // scheduler.num_inference_steps
    final = torch.as_tensor(scheduler.final_alpha_cumprod, dtype=torch.float64)
    a_t = cumprod[t]
    a_prev = torch.where(prev_t >= 0, cumprod[prev_t.clamp(min=0)], final)
    return a_t, a_prev
