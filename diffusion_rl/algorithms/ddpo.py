"""DDPO (Black et al., 2023): PPO on the DDIM chain of a UNet diffusion model.

Advantages are rewards normalised per prompt with a running buffer (`PerPromptStatTracker`, buffer 16,
min count 16, as ddpo-pytorch), or over the whole batch. The preset follows ddpo-pytorch's base config:
50 DDIM steps with eta 1, CFG 5, every step trained, clip range 1e-4, lr 3e-4, LoRA.
Simplification: samples are organised as prompts x group_size (group_size 1 draws independent prompts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from diffusion_rl.advantages import PerPromptStatTracker, aggregate, clip_advantages, global_advantages

if TYPE_CHECKING:
    from diffusion_rl.trainer import RolloutBatch, Trainer

class DDPO:
    name = "ddpo"

    def __init__(self) -> None:
        self.tracker: PerPromptStatTracker | None = None

    def advantages(self, trainer: Trainer, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = trainer.cfg
        gathered = {k: trainer.gather_canonical(v) for k, v in batch.rewards.items()}
        slots = trainer.gather_canonical(batch.slots)
        prompts = [trainer.iteration_prompts[int(s)] for s in slots.tolist()]
        if cfg.advantage.per_prompt_tracking:
            if self.tracker is None:
                self.tracker = PerPromptStatTracker(cfg.advantage.buffer_size, cfg.advantage.min_count, cfg.advantage.eps)

            def normalize(r):
                return self.tracker.update(prompts, r)
        else:
            def normalize(r):
                return global_advantages(r, unbiased=cfg.advantage.unbiased, eps=cfg.advantage.eps)

        # a stat tracker must see each prompt's rewards once per iteration, so it always aggregates rewards first
        level = "reward" if cfg.advantage.per_prompt_tracking else cfg.reward.aggregation
        total, adv = aggregate(gathered, cfg.reward.rewards, normalize, level=level)
        return trainer.local_part(clip_advantages(adv, cfg.advantage.clip_max)), {"reward/combined": float(total.mean())}

    def state_dict(self) -> dict:
        return {"tracker": None if self.tracker is None else self.tracker.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("tracker") is not None:
            self.tracker = PerPromptStatTracker()
            self.tracker.load_state_dict(state["tracker"])
