"""Reward post-processing for RL: affine map, running standardisation, clipping, mixing with the env reward.

Applied in this order to the VLM reward r:
    r <- scale * r + shift
    r <- (r - mean) / std          (running moments over every reward seen, if standardize)
    r <- clip(r, low, high)        (if clip is set)
    out = vlm_weight * r + env_weight * env_reward
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mmreward.errors import ConfigError
from mmreward.functional.normalization import RunningMoments


@dataclass
class RewardPostprocess:
    scale: float = 1.0
    shift: float = 0.0
    standardize: bool = False
    clip: tuple[float, float] | None = None
    vlm_weight: float = 1.0
    env_weight: float = 0.0
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.clip is not None:
            if len(self.clip) != 2 or not self.clip[0] < self.clip[1]:
                raise ConfigError(f"clip: expected (low, high) with low < high, got {self.clip}")
            self.clip = (float(self.clip[0]), float(self.clip[1]))
        self.moments = RunningMoments()

    def __call__(self, vlm_reward: np.ndarray, env_reward: np.ndarray) -> np.ndarray:
        r = np.asarray(vlm_reward, dtype=np.float64) * self.scale + self.shift
        if self.standardize:
            self.moments.update(torch.as_tensor(r))
            r = (r - self.moments.mean) / (self.moments.std + self.eps)
        if self.clip is not None:
            r = np.clip(r, *self.clip)
        return self.vlm_weight * r + self.env_weight * np.asarray(env_reward, dtype=np.float64)
