"""The correctness probe: before the first update the PPO ratio must be 1, or the update is off-policy."""

from __future__ import annotations

import warnings

import torch

from diffusion_rl.config import TrainConfig


class ProbeError(RuntimeError):
    """The training path does not reproduce the rollout's log-probs: the update would be off-policy."""


class Probe:
    """Checks the first log-ratio of a run (of a resumed run too) against `train.probe_tolerance`."""

    def __init__(self, train: TrainConfig) -> None:
        self.mode, self.tolerance, self.clip_range = train.probe, train.probe_tolerance, train.clip_range
        self.done = False

    def check(self, log_ratio: torch.Tensor) -> dict[str, float]:
        """Raise or warn (train.probe) on the first call if the log-ratio exceeds the tolerance; returns the
        largest |log-ratio|, the numerical noise floor of the update."""
        floor = float(log_ratio.detach().abs().max())
        if self.mode != "off" and not self.done:
            self.done = True
            if floor > self.tolerance:
                msg = (f"correctness probe: recomputed log-probs differ from the rollout's by up to {floor:.3g} "
                       f"(tolerance {self.tolerance:g}) before any update, so the first PPO ratio is not 1. "
                       "Check that training uses the rollout's guidance scale, dtype and kernel.")
                if self.mode == "error":
                    raise ProbeError(msg)
                warnings.warn(msg, stacklevel=3)
            elif floor > 0.1 * self.clip_range:
                warnings.warn(f"correctness probe: the numerical noise floor of the log-ratio ({floor:.3g}) is "
                              f"above 10% of the clip range ({self.clip_range:g}); use fp32 or a larger clip range",
                              stacklevel=3)
        return {"probe/max_abs_log_ratio": floor}
