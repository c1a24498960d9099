"""One home for comparing scaled quantities (0-100 scores, logits, rewards, sums, log-probs, sizes).

An absolute tolerance only means something next to the size of what it compares: 1e-5 is float32
noise on a 0-100 CLIPScore (one ulp at 64 is 7.6e-6) but a real error on a cosine near 0.01. So
the comparison is relative elementwise, plus an absolute floor at the same fraction of the
reference's largest magnitude: elements near zero in a vector whose scale is 100 carry the
rounding of that scale (e.g. 100 * cos with cos ~ 0), not of their own tiny value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def assert_close_scaled(
    actual: Any,
    expected: Any,
    *,
    rel: float,
    scale: float | None = None,
    msg: str | Callable[[str], str] | None = None,
) -> None:
    """`actual == expected` to within `rel` of the magnitude of `expected` (elementwise and overall).

    `scale` overrides the magnitude (default: max |expected|) where the quantity's scale is known
    better than a sample of it shows, e.g. the 100 of CLIPScore when all scores happen to be small.
    Pick `rel` as the smallest fraction that float noise needs, so that a real defect (a wrong
    normalisation, a missing clamp, another resize) still fails.
    """
    actual_t, expected_t = torch.as_tensor(actual), torch.as_tensor(expected)
    if scale is None:
        scale = float(expected_t.detach().abs().max()) if expected_t.numel() else 0.0
    torch.testing.assert_close(actual_t, expected_t, rtol=rel, atol=rel * scale, msg=msg)
