"""DDPO (Black et al., 2023): PPO on the DDIM chain of a UNet diffusion model.

Advantages are rewards normalised per prompt with a running buffer (`PerPromptStatTracker`, buffer 16,
min count 16, as ddpo-pytorch), or over the whole batch. The preset (`diffusion_rl.presets`) follows ddpo-pytorch's base config:
50 DDIM steps with eta 1, CFG 5, every step trained, clip range 1e-4, lr 3e-4, LoRA.
Simplification: samples are organised as prompts x group_size (group_size 1 draws independent prompts).
"""

from __future__ import annotations

from typing import Any

import torch

from diffusion_rl.advantages import PerPromptStatTracker, aggregate, clip_advantages, global_advantages
from diffusion_rl.algorithms.base import PolicyGradient, Rollouts
from diffusion_rl.config import RunConfig


class DDPO(PolicyGradient):
    """Per-prompt running normalisation; the tracker is the algorithm's state, saved in checkpoints."""

    name = "ddpo"

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.tracker: PerPromptStatTracker | None = None

    def advantages(self, samples: Rollouts) -> tuple[torch.Tensor, dict[str, float]]:
        """This process's advantages; every process updates its tracker with all processes' rewards."""
        cfg, batch, order = self.cfg, samples.batch, samples.order
        gathered = {k: order.gather(v) for k, v in batch.rewards.items()}
        slots = order.gather(batch.slots)
        prompts = [batch.slot_prompts[int(s)] for s in slots.tolist()]
        if cfg.advantage.per_prompt_tracking:
            if self.tracker is None:
                self.tracker = PerPromptStatTracker(cfg.advantage.buffer_size, cfg.advantage.min_count, cfg.advantage.eps)
            tracker = self.tracker

            def normalize(r: torch.Tensor) -> torch.Tensor:
                return tracker.update(prompts, r)
        else:
            def normalize(r: torch.Tensor) -> torch.Tensor:
                return global_advantages(r, unbiased=cfg.advantage.unbiased, eps=cfg.advantage.eps)

        # a stat tracker must see each prompt's rewards once per iteration, so it always aggregates rewards first
        level = "reward" if cfg.advantage.per_prompt_tracking else cfg.reward.aggregation
        total, adv = aggregate(gathered, cfg.reward.rewards, normalize, level=level)
        return order.local(clip_advantages(adv, cfg.advantage.clip_max)), {"reward/combined": float(total.mean())}

    def state_dict(self) -> dict[str, Any]:
        return {"tracker": None if self.tracker is None else self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("tracker") is not None:
            self.tracker = PerPromptStatTracker()
            self.tracker.load_state_dict(state["tracker"])
