"""GRPO for diffusion and flow models: Flow-GRPO (Liu et al., 2025) and DanceGRPO (Xue et al., 2025).

Per iteration: sample G images per prompt with an SDE kernel, score them, turn rewards into advantages
by normalising within each prompt's group, then maximise the PPO-clipped, per-step likelihood ratio
objective (optionally with a KL to the reference policy). The update itself lives in the trainer;
what is GRPO-specific is the advantage below and the presets.

Simplifications relative to the papers: prompts are drawn from a fixed list (no dataloader sharding by
node), the per-iteration sample count is prompts_per_iteration * group_size over all processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from diffusion_rl.advantages import aggregate, clip_advantages, group_advantages, zero_variance_fraction

if TYPE_CHECKING:
    from diffusion_rl.trainer import RolloutBatch, Trainer

class GRPO:
    """Group-relative advantages: (r - mean_group) / (std + eps), std of the group or of the whole batch."""

    name = "grpo"

    def advantages(self, trainer: Trainer, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = trainer.cfg
        gathered = {k: trainer.gather_canonical(v) for k, v in batch.rewards.items()}
        group_ids = trainer.gather_canonical(batch.slots)
        weights = cfg.reward.rewards

        def normalize(r: torch.Tensor) -> torch.Tensor:
            return group_advantages(r, group_ids, std_scope=cfg.advantage.std_scope,
                                    unbiased=cfg.advantage.unbiased, eps=cfg.advantage.eps)

        total, adv = aggregate(gathered, weights, normalize, level=cfg.reward.aggregation)
        adv = clip_advantages(adv, cfg.advantage.clip_max)
        metrics = {"reward/combined": float(total.mean()), "reward/zero_std_groups": zero_variance_fraction(total, group_ids)}
        return trainer.local_part(adv), metrics
