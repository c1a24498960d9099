"""One readable file per method, each in the one shape of `base.Algorithm`: the stages the trainer calls by name,
`rollout(run, inputs) -> samples` (sampling and rewards), `advantages(samples) -> (advantages | None, metrics)`,
`update(samples, run) -> metrics` (loss -> optimizer step) and `report(samples, timings)` (the rewards over all
processes, the stage timings). The trainer never asks which method it runs:

- policy gradient (GRPO, GRPO-Guard, Pref-GRPO, DDPO; `base.PolicyGradient`): the trainer's SDE rollout and PPO
  update (the defaults, `Run.collect` and `Run.ppo_update`); the advantage stage is what tells them apart;
- PRDP: the default rollout, no advantages, its own update (reward-difference regression of pairs);
- forward-process methods (DiffusionNFT; Diffusion-DPO, RAFT, AWM, DGPO, CRD through `dpo.RankedSamplesMethod`):
  ODE samples and their rewards, then advantages (NFT's optimality probabilities, the others' ranking), then
  the method's loss steps; offline Diffusion-DPO's rollout picks the iteration's pairs of a dataset;
- reward backpropagation (DRaFT/AlignProp, ReFL): sampling, reward and loss are one graph per micro-batch, so the
  rollout stage hands the inputs on and `update` does the fused work (the module docstring of `base` says why).

None of them sees the trainer (`base.Run` is what they may use). The papers' presets are in
`diffusion_rl.presets`; `BUILDERS` maps each `train.algorithm` to its constructor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from diffusion_rl.algorithms.awm import AWM
from diffusion_rl.algorithms.base import Algorithm, Inputs, PolicyGradient, Rollouts, Run, Samples, Timings
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

Builder = Callable[[RunConfig, dict[str, Any], Any], Algorithm[Any]]

# train.algorithm -> the method, built from the config, the run's rewards and its pairwise judge
BUILDERS: dict[str, Builder] = {
    "grpo": lambda cfg, rewards, pairwise: GRPO(cfg),
    "grpo_guard": lambda cfg, rewards, pairwise: GRPOGuard(cfg),  # the PPO loss takes its ratio (uses_ratio_norm)
    "pref_grpo": lambda cfg, rewards, pairwise: PrefGRPO(cfg, pairwise),
    "ddpo": lambda cfg, rewards, pairwise: DDPO(cfg),
    "prdp": lambda cfg, rewards, pairwise: PRDP(cfg),
    "nft": lambda cfg, rewards, pairwise: DiffusionNFT(cfg, rewards),
    # offline on a pair dataset when dpo.pairs names one, else online ranked samples
    "dpo": lambda cfg, rewards, pairwise: OfflineDiffusionDPO(cfg) if cfg.dpo.pairs else DiffusionDPO(cfg, rewards),
    "raft": lambda cfg, rewards, pairwise: RAFT(cfg, rewards),
    "awm": lambda cfg, rewards, pairwise: AWM(cfg, rewards),
    "dgpo": lambda cfg, rewards, pairwise: DGPO(cfg, rewards),
    "crd": lambda cfg, rewards, pairwise: CRD(cfg, rewards),
    "refl": lambda cfg, rewards, pairwise: ReFL(cfg, rewards),
    "draft": lambda cfg, rewards, pairwise: DRaFT(cfg, rewards),
}


def make_algorithm(cfg: RunConfig, rewards: dict[str, Any], pairwise: Any | None) -> Algorithm[Any]:
    """The method `train.algorithm` names, built from the config and the rewards it needs."""
    return BUILDERS[cfg.train.algorithm](cfg, rewards, pairwise)


__all__ = ["AWM", "BUILDERS", "CRD", "DGPO", "DDPO", "RAFT", "Algorithm", "DRaFT", "DiffusionDPO", "DiffusionNFT", "GRPO",
           "GRPOGuard", "PrefGRPO", "OfflineDiffusionDPO", "PRDP", "ReFL", "Inputs", "PolicyGradient",
           "Rollouts", "Run", "Samples", "Timings", "make_algorithm"]
