"""Record what a parity test measured, for the parity table (`scripts/parity.sh` -> docs/parity.md).

A parity test compares our reward with an independent reference that follows the original's code path
(its package, or its source transcribed with repo@commit). It calls `record_parity(...)` with both outputs;
this returns the max abs / relative difference and, when `MMREWARD_PARITY_LOG` names a file, appends one
JSON line to it. The test still asserts its own tolerance: recording never replaces the assertion.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import torch


def record_parity(
    family: str,
    *,
    original: str,
    how: str,
    actual: Any,
    expected: Any,
    cases: Sequence[str] = ("RGB",),
    not_checked: str = "",
) -> tuple[float, float]:
    """Max |actual - expected| and that divided by max |expected|; logged when MMREWARD_PARITY_LOG is set.

    `original`: "repo@commit path" or "package==version"; `how`: "package" or "transcribed";
    `cases`: the inputs covered (RGB, grayscale, odd sizes, RGBA, video ...); `not_checked`: what is not and why.
    """
    a = torch.as_tensor(actual, dtype=torch.float64).detach().cpu()
    e = torch.as_tensor(expected, dtype=torch.float64).detach().cpu()
    max_abs = float((a - e).abs().max()) if e.numel() else 0.0
    scale = float(e.abs().max()) if e.numel() else 0.0
    max_rel = max_abs / scale if scale > 0 else max_abs
    path = os.environ.get("MMREWARD_PARITY_LOG")
    if path:
        row = {"family": family, "original": original, "how": how, "max_abs": max_abs, "max_rel": max_rel,
               "cases": list(cases), "not_checked": not_checked}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    return max_abs, max_rel
