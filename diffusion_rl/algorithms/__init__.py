"""One readable file per method, in three shapes the trainer tells apart by what a method declares (never
by its class):

- a policy-gradient method (GRPO, GRPO-Guard, Pref-GRPO, DDPO) is the advantage computation that distinguishes
  it: `advantages(batch, order) -> (this process's advantages, metrics)`, where `order` gathers rewards from
  every process in canonical order; the PPO update is shared in `diffusion_rl.trainer`;
- `owns_update = True` (PRDP): the trainer collects and scores the rollouts, the method runs its own update;
- `owns_iteration = True` (DRaFT/AlignProp and ReFL, which backpropagate the reward; DiffusionNFT,
  Diffusion-DPO, RAFT, AWM, DGPO and CRD, which train on the forward process): the method brings its own
  `iteration(it, policy, adapter, kernel, prompts, embeds, slots, sample_ids) -> (metrics, images)`.

None of them sees the trainer. The papers' presets are in `diffusion_rl.presets`."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from diffusion_rl.algorithms.awm import AWM
from diffusion_rl.algorithms.crd import CRD
from diffusion_rl.algorithms.ddpo import DDPO
from diffusion_rl.algorithms.dgpo import DGPO
from diffusion_rl.algorithms.dpo import DiffusionDPO, OfflineDiffusionDPO
from diffusion_rl.algorithms.draft import DRaFT
from diffusion_rl.algorithms.grpo import GRPO
from diffusion_rl.algorithms.grpo_guard import GRPOGuard
from diffusion_rl.algorithms.nft import DiffusionNFT
from diffusion_rl.algorithms.prdp import PRDP
from diffusion_rl.algorithms.pref_grpo import PrefGRPO
from diffusion_rl.algorithms.raft import RAFT
from diffusion_rl.algorithms.refl import ReFL
from diffusion_rl.config import RunConfig
from diffusion_rl.rollout import RolloutBatch
from diffusion_rl.sample_assignment import CanonicalOrder


class AdvantageAlgorithm(Protocol):
    name: str

    def advantages(self, batch: RolloutBatch, order: CanonicalOrder) -> tuple[torch.Tensor, dict[str, float]]: ...


def make_algorithm(cfg: RunConfig, rewards: dict[str, Any], pairwise: Any | None
                   ) -> AdvantageAlgorithm | DRaFT | DiffusionNFT | DiffusionDPO | OfflineDiffusionDPO | RAFT | AWM:
    """The method `train.algorithm` names, built from the config and the rewards it needs."""
    name = cfg.train.algorithm
    if name == "grpo":
        return GRPO(cfg)
    if name == "prdp":  # the trainer's rollouts, then PRDP's own update in place of the PPO one
        return PRDP(cfg)
    if name == "grpo_guard":  # GRPO's advantages; the trainer's PPO loss takes GRPO-Guard's ratio (uses_ratio_norm)
        return GRPOGuard(cfg)
    if name == "ddpo":
        return DDPO(cfg)
    if name == "pref_grpo":
        return PrefGRPO(cfg, pairwise)
    if name == "nft":
        return DiffusionNFT(cfg, rewards)
    if name == "dpo":  # offline on a pair dataset when dpo.pairs names one, else online ranked samples
        return OfflineDiffusionDPO(cfg) if cfg.dpo.pairs else DiffusionDPO(cfg, rewards)
    if name == "raft":
        return RAFT(cfg, rewards)
    if name == "awm":
        return AWM(cfg, rewards)
    if name == "dgpo":
        return DGPO(cfg, rewards)
    if name == "crd":
        return CRD(cfg, rewards)
    if name == "refl":
        return ReFL(cfg, rewards)  # a DRaFT subclass: the trainer runs its own iteration
    return DRaFT(cfg, rewards)


__all__ = ["AWM", "CRD", "DGPO", "DDPO", "RAFT", "AdvantageAlgorithm", "DRaFT", "DiffusionDPO", "DiffusionNFT", "GRPO",
           "GRPOGuard", "PrefGRPO", "OfflineDiffusionDPO", "PRDP", "ReFL", "make_algorithm"]
