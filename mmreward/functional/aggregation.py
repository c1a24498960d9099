"""Bradley-Terry probabilities and multi-reward aggregation (pairwise credits and win rates: pairwise.py)."""

from __future__ import annotations

from typing import Literal

import torch

from mmreward.errors import RewardInputError


def bradley_terry_prob(
    score_a: torch.Tensor,
    score_b: torch.Tensor,
    temperature: float = 1.0,
    higher_is_better: bool = True,
) -> torch.Tensor:
    """P(a preferred over b) = sigmoid((s_a - s_b) / T) under the Bradley-Terry model.

    For a lower-is-better score the difference is negated, so the result is always P(a is better).
    """
    if temperature <= 0:
        raise RewardInputError(f"temperature must be > 0, got {temperature}")
    diff = (score_a - score_b) if higher_is_better else (score_b - score_a)
    return torch.sigmoid(diff / temperature)


def coefficient_of_variation(values: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """std / (mean + eps) along the last axis, with the population std (as PaCo-GRPO computes it)."""
    return values.std(dim=-1, unbiased=False) / (values.mean(dim=-1) + eps)


def log_tame(
    rewards: torch.Tensor,
    weights: torch.Tensor | None = None,
    threshold: float | Literal["mean", "median"] = "mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """PaCo-GRPO's log-tamed aggregation of R rewards over a batch of B samples.

    rewards: (R, B). Each reward's coefficient of variation h_r = std/mean is measured over the batch;
    rewards with h_r above the threshold (a number, or the mean/median of all h_r) are replaced by
    log(1 + r) so that one high-variance reward cannot dominate the weighted sum.
    Returns (aggregated (B,), tamed mask (R,)).
    """
    if rewards.ndim != 2:
        raise RewardInputError(f"rewards must have shape (num_rewards, batch), got {tuple(rewards.shape)}")
    if weights is None:
        weights = torch.ones(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    h = coefficient_of_variation(rewards)
    if threshold == "mean":
        cut = h.mean()
    elif threshold == "median":
        # numpy's median averages the two middle values; torch.median takes the lower one.
        cut = torch.quantile(h, 0.5)
    elif isinstance(threshold, (int, float)):
        cut = torch.tensor(float(threshold), dtype=h.dtype)
    else:
        raise RewardInputError(f"threshold must be a number, 'mean' or 'median', got {threshold!r}")
    tamed = h > cut
    if bool((rewards[tamed] <= -1).any()):
        raise RewardInputError("log-tamed aggregation needs rewards > -1 for log(1 + r); shift them first")
    transformed = torch.where(tamed[:, None], torch.log1p(rewards), rewards)
    return (weights[:, None] * transformed).sum(dim=0), tamed
