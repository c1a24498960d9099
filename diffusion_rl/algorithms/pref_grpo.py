"""Pref-GRPO (Wang et al., 2025): GRPO whose reward is each image's win rate within its group.

Every pair of the G images of a prompt is judged by a pairwise reward (`Reward.compare`; both orders by
default to cancel position bias); an image's reward is its mean credit against the G-1 others, and the
advantage is the group-normalised win rate. Groups are complete on one process (the trainer never
splits a group), so no pair crosses processes. Pointwise rewards in `reward.rewards` are still scored
for logging. Presets (`diffusion_rl.presets`) follow the official FLUX scripts (Flow-SDE "flow" step mode, eta 0.7, 25 steps,
G = 8, 60% of the steps, GRPO-Guard ratio normalisation, LoRA rank 64 / alpha 128, lr 1e-5).
"""

from __future__ import annotations

from typing import Any

import torch

from diffusion_rl.advantages import clip_advantages, group_advantages, pref_grpo_rewards
from diffusion_rl.algorithms.base import PolicyGradient, Rollouts
from diffusion_rl.config import RunConfig


class PrefGRPO(PolicyGradient):
    """Group-normalised win rates under the pairwise reward `judge` (a `Reward` with `compare`)."""

    name = "pref_grpo"

    def __init__(self, cfg: RunConfig, judge: Any) -> None:
        self.cfg, self.judge = cfg, judge

    def advantages(self, samples: Rollouts) -> tuple[torch.Tensor, dict[str, float]]:
        """This process's advantages; `samples.order` is needed only for advantage.std_scope = 'global'."""
        cfg, batch, order = self.cfg, samples.batch, samples.order
        out = pref_grpo_rewards(self.judge, batch.prompts, batch.images, cfg.sample.group_size,
                                both_orders=cfg.reward.both_orders, mode=cfg.reward.win_mode)
        win = out.win_rates.to(batch.slots.device)
        # local groups are complete, so normalising locally equals normalising the gathered batch per group
        adv = group_advantages(win, batch.slots, std_scope=cfg.advantage.std_scope,
                               unbiased=cfg.advantage.unbiased, eps=cfg.advantage.eps)
        if cfg.advantage.std_scope == "global":
            if order is None:
                raise ValueError("advantage.std_scope='global' normalises over all processes: pass the CanonicalOrder")
            all_win = order.gather(win)
            all_ids = order.gather(batch.slots)
            adv = order.local(group_advantages(all_win, all_ids, std_scope="global",
                                               unbiased=cfg.advantage.unbiased, eps=cfg.advantage.eps))
        metrics = {"pref/win_rate_std": float(win.std()), "pref/ties": float(out.num_ties),
                   "pref/failed": float(out.num_failed)}
        if out.agreement is not None:
            metrics["pref/order_agreement"] = float(out.agreement)
        return clip_advantages(adv, cfg.advantage.clip_max), metrics
