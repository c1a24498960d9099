"""Voting over a judge's samples; position-bias control (`debias`, `agreement_rate`) lives in
mmreward.functional.pairwise, shared with the group win rates, and is re-exported here.

With k samples per order, each order's verdict is the mean of its valid samples (majority-vote credit); NaN samples are dropped and
reported, and a pair with no valid sample in an order stays NaN.
"""

from __future__ import annotations

import torch

from mmreward.functional.pairwise import agreement_rate, debias

__all__ = ["agreement_rate", "debias", "vote"]


def vote(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """samples: (B, k) verdicts in {0, 0.5, 1} or NaN. Returns (mean of valid samples, valid count)."""
    valid = ~torch.isnan(samples)
    count = valid.sum(dim=1)
    total = torch.where(valid, samples, torch.zeros_like(samples)).sum(dim=1)
    mean = torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))
    return mean, count
