"""GRPO for diffusion and flow models: Flow-GRPO (Liu et al., 2025) and DanceGRPO (Xue et al., 2025).

Per iteration: sample G images per prompt with an SDE kernel, score them, turn rewards into advantages
by normalising within each prompt's group, then maximise the PPO-clipped, per-step likelihood ratio
objective (optionally with a KL to the reference policy). The rollout and the PPO update are the
trainer's (the `PolicyGradient` defaults); what is GRPO-specific is the advantage stage below (presets: `diffusion_rl.presets`).

Simplifications relative to the papers: prompts are drawn from a fixed list (no dataloader sharding by
node), the per-iteration sample count is prompts_per_iteration * group_size over all processes.
"""

from __future__ import annotations

import math
import warnings

import torch

from diffusion_rl.advantages import (
    aggregate,
    clip_advantages,
    group_advantages,
    within_group_fraction,
    zero_variance_fraction,
)
from diffusion_rl.algorithms.base import PolicyGradient, Rollouts
from diffusion_rl.config import AdvantageConfig, RunConfig


def grpo_advantages(rewards: dict[str, torch.Tensor], group_ids: torch.Tensor, weights: dict[str, float],
                    adv: AdvantageConfig, aggregation: str) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages of all samples (canonical order) from their rewards and prompt groups."""
    def normalize(r: torch.Tensor) -> torch.Tensor:
        return group_advantages(r, group_ids, std_scope=adv.std_scope, unbiased=adv.unbiased, eps=adv.eps)

    total, advantages = aggregate(rewards, weights, normalize, level=aggregation)
    metrics = {"reward/combined": float(total.mean()), "reward/zero_std_groups": zero_variance_fraction(total, group_ids),
               "reward/within_group_fraction": within_group_fraction(total, group_ids)}
    return clip_advantages(advantages, adv.clip_max), metrics


class GRPO(PolicyGradient):
    """Group-relative advantages: (r - mean_group) / (std + eps), std of the group or of the whole batch."""

    name = "grpo"

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.watch = ExplorationWatch()

    def advantages(self, samples: Rollouts) -> tuple[torch.Tensor, dict[str, float]]:
        """This process's advantages; the normalisation sees every process's rewards."""
        batch, order = samples.batch, samples.order
        rewards = {k: order.gather(v) for k, v in batch.rewards.items()}
        group_ids = order.gather(batch.slots)
        adv, metrics = grpo_advantages(rewards, group_ids, self.cfg.reward.rewards, self.cfg.advantage,
                                       self.cfg.reward.aggregation)
        self.watch.update(metrics["reward/within_group_fraction"])
        return order.local(adv), metrics


class ExplorationWatch:
    """Warns once when the reward barely varies within groups for `window` iterations in a row: the trained
    steps then hardly change the outcome, and GRPO's advantages are mostly noise. Measured on ShapesWorld
    video: Dance-SDE eta 0.3 on steps [0, 4) of 8 left about 0.1 of the variance within groups and did not
    learn (docs/results/shapes_video_grpo)."""

    def __init__(self, threshold: float = 0.05, window: int = 5) -> None:
        self.threshold, self.window = threshold, window
        self.recent: list[float] = []
        self.warned = False

    def update(self, fraction: float) -> None:
        if self.warned or math.isnan(fraction):
            return
        self.recent = [*self.recent, fraction][-self.window:]
        if len(self.recent) == self.window and max(self.recent) < self.threshold:
            self.warned = True
            warnings.warn(
                f"GRPO: under {self.threshold:.0%} of the reward's variance lies within prompt groups in each of the "
                f"last {self.window} iterations (reward/within_group_fraction): the SDE steps hardly change the "
                "outcome, so the advantages are mostly noise. Raise sample.noise_level, move sample.sde_window to "
                "earlier steps, or measure candidates with benchmarks/sde_exploration.py.", stacklevel=2)
