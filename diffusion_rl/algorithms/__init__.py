"""One readable file per method. Each exposes an algorithm class (the advantage computation that
distinguishes it; the PPO update is shared in `diffusion_rl.trainer`); the papers' presets are in `diffusion_rl.presets`."""

from __future__ import annotations

from diffusion_rl.algorithms.ddpo import DDPO
from diffusion_rl.algorithms.draft import DRaFT
from diffusion_rl.algorithms.grpo import GRPO
from diffusion_rl.algorithms.pref_grpo import PrefGRPO

ALGORITHMS = {"grpo": GRPO, "pref_grpo": PrefGRPO, "ddpo": DDPO, "draft": DRaFT}

__all__ = ["ALGORITHMS", "DDPO", "DRaFT", "GRPO", "PrefGRPO"]
