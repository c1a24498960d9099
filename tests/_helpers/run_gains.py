"""Gains of a training run's held-out evaluation metrics (the slow learning tests print and assert them)."""

from __future__ import annotations

import math


def gain(first: dict, last: dict, key: str) -> tuple[float, float]:
    """(last - first, hypot of their SEs) of one evaluation metric: unpaired, so conservative where both
    evaluations share their noise."""
    return last[key] - first[key], math.hypot(first[key + "_se"], last[key + "_se"])


def gain_text(first: dict, last: dict, key: str) -> str:
    g, se = gain(first, last, key)
    in_se = f"{g / se:.1f} SE" if se > 0 else "no spread"  # e.g. strict 0 -> 0: both SEs are 0
    return f"{first[key]:.3f} -> {last[key]:.3f} (gain {g:+.3f}, {in_se})"
