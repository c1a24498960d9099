"""Policy losses on per-step log-probs: PPO-clip (GRPO/DDPO), KL to the reference policy, GRPO-Guard's
ratio normalisation. Pure functions of tensors; reductions are means over the batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from mmreward.errors import ConfigError

KLMode = Literal["exact", "flow_grpo"]


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor
    ratio: torch.Tensor  # (B,)
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor  # 0.5 E[(log ratio)^2], as the references log it


def ppo_clip_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    *,
    log_ratio: torch.Tensor | None = None,
) -> PolicyLossOutput:
    """mean(max(-A r, -A clip(r, 1 - eps, 1 + eps))) with r = exp(log_prob - old_log_prob).

    At r = 1 its gradient is -mean(A grad log_prob): REINFORCE with advantages. `log_ratio` overrides
    the ratio's exponent (GRPO-Guard's normalised ratio).
    """
    if clip_range <= 0:
        raise ConfigError(f"clip_range must be > 0, got {clip_range}")
    lr = (log_prob - old_log_prob) if log_ratio is None else log_ratio
    ratio = torch.exp(lr)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    with torch.no_grad():
        clip_fraction = ((ratio - 1.0).abs() > clip_range).float().mean()
        approx_kl = 0.5 * (lr.detach() ** 2).mean()
    return PolicyLossOutput(loss, ratio.detach(), clip_fraction, approx_kl)


def gaussian_kl(
    mean: torch.Tensor,
    ref_mean: torch.Tensor,
    std: torch.Tensor,
    *,
    mode: KLMode = "exact",
    dt: torch.Tensor | None = None,
    reduction: Literal["mean", "sum"] = "mean",
) -> torch.Tensor:
    """KL(N(mean, std^2) || N(ref_mean, std^2)) per batch item = |mean - ref_mean|^2 / (2 std^2), reduced over elements.

    mode="flow_grpo" is Flow-GRPO's compatibility form: it divides by 2 sigma_t^2 without the sqrt(|dt|) of
    the step's std, i.e. the exact KL multiplied by |dt| (pass dt); its beta values assume this scaling.
    """
    if mode not in ("exact", "flow_grpo"):
        raise ConfigError(f"kl mode must be 'exact' or 'flow_grpo', got {mode!r}")
    std = torch.as_tensor(std, dtype=mean.dtype, device=mean.device)
    sq = (mean - ref_mean) ** 2
    dims = tuple(range(1, sq.ndim))
    per = sq.mean(dim=dims, keepdim=True) if reduction == "mean" else sq.sum(dim=dims, keepdim=True)
    std_b = std.expand_as(mean).flatten(1)[:, :1].view(-1, *([1] * (mean.ndim - 1)))
    safe = torch.where(std_b > 0, std_b, torch.ones_like(std_b))
    kl = torch.where(std_b > 0, per / (2 * safe**2), torch.zeros_like(per))
    if mode == "flow_grpo":
        if dt is None:
            raise ConfigError("gaussian_kl(mode='flow_grpo') needs dt (sigma_next - sigma) per item")
        kl = kl * torch.as_tensor(dt, dtype=kl.dtype, device=kl.device).abs().view(-1, *([1] * (mean.ndim - 1)))
    return kl.flatten()


def normalized_log_ratio(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    std: torch.Tensor,
) -> torch.Tensor:
    """GRPO-Guard's ratio normalisation (as Pref-GRPO's `--rationorm`, for element-mean log-probs).

    The log-ratio of two Gaussians with the same std has a mean shift -|dmu|^2 / (2 std^2) and a scale
    1 / std that differ from step to step; adding the shift back and multiplying by std makes the ratio
    distribution comparable across steps so one clip range fits all of them.
    """
    dims = tuple(range(1, mean.ndim))
    std_b = torch.as_tensor(std, dtype=mean.dtype, device=mean.device).expand_as(mean).flatten(1)[:, 0]
    bias = ((mean - old_mean.to(mean.dtype)) ** 2).mean(dim=dims) / (2 * std_b.clamp(min=1e-20) ** 2)
    return (log_prob - old_log_prob + bias) * std_b
