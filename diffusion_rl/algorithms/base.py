"""The one shape every algorithm has: three stages the trainer calls by name, and a report.

`Trainer.train_iteration` runs, for every method alike,

    inputs  = the iteration's prompts (this process's slots, sample ids, prompts and their embeddings)
    samples = algorithm.rollout(run, inputs)       rollout + reward: samples, scored chunk by chunk
    samples.advantages, metrics = algorithm.advantages(samples)
    metrics |= algorithm.update(samples, run)      loss -> optimizer step(s)
    metrics |= algorithm.report(samples, timings)  the rewards over all processes, the stage timings

and never asks what a method is. The defaults are the policy-gradient family's (`PolicyGradient`): the trainer's
SDE/DDIM rollout with log-probs scored by the run's rewards (`Run.collect`), no advantages, and the shared PPO
update with DanceGRPO's best/worst selection (`Run.ppo_update`). How each method maps onto the stages (each
keeps the order of its random draws and computations):

- GRPO, GRPO-Guard, Pref-GRPO, DDPO: default rollout and update; `advantages` is what tells them apart;
- PRDP: default rollout, no advantages, its own `update` (the regression of reward differences of pairs);
- DiffusionNFT: `rollout` samples the ODE with the old policy and scores it, `advantages` are the optimality
  probabilities r, `update` the NFT loss steps and the old policy's move;
- DPO (online), RAFT, AWM, DGPO, CRD (`dpo.RankedSamplesMethod`): `rollout` samples the ODE and scores it,
  `advantages` ranks the groups, `update` is the method's `train_on_samples`;
- offline Diffusion-DPO: `rollout` picks the iteration's pairs of the dataset (read and encoded only when
  `update`, the DPO loss steps, reaches them, one micro-batch at a time);
- DRaFT/AlignProp and ReFL backpropagate the reward through a differentiable rollout: sampling, reward and loss
  are one graph per micro-batch, so they cannot be separate stages. Their `rollout` only hands the inputs on
  (`RewardBackpropSamples`) and their `update` does the fused sample -> score -> backward per micro-batch, then
  the step; the rewards and images it produces are on the samples afterwards for the report and the grids.

`Run` is what a method may use of the run (policy, adapter, kernel, accelerator, scorer and the trainer's
rollout and PPO update as callables); no method sees the trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import torch

if TYPE_CHECKING:
    from diffusion_rl.config import RunConfig
    from diffusion_rl.kernels import Kernel
    from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds
    from diffusion_rl.policy import Policy
    from diffusion_rl.rewards import RolloutScorer
    from diffusion_rl.rollout import RolloutBatch
    from diffusion_rl.sample_assignment import CanonicalOrder


@dataclass(frozen=True)
class Inputs:
    """The prompt stage's output: what this process samples in iteration `it`."""

    it: int
    prompts: list[str]  # (N,) the prompt of each of this process's samples
    embeds: PromptEmbeds  # their embeddings
    slots: torch.Tensor  # (N,) long: the prompt slot (group) of each sample
    sample_ids: torch.Tensor  # (N,) long: its index within the group
    slot_prompts: list[str]  # the prompt of every slot of the iteration, on all processes


class Samples:
    """What a rollout stage hands to the advantage and update stages. The trainer reads `images` (the grids)
    and sets `advantages`; each method's subclass holds what its stages need."""

    images: torch.Tensor | None = None  # the iteration's samples, for the grids (`Trainer.last_images`)
    advantages: torch.Tensor | None = None  # set from the advantage stage; None where a method has none


@dataclass(eq=False)
class Rollouts(Samples):
    """The trainer's rollouts (trajectories with log-probs, scored) and the order that gathers them."""

    batch: RolloutBatch
    order: CanonicalOrder
    reward_blocking_s: float = 0.0  # of the rollout's time, how long it waited for rewards (reward.overlap)

    @property
    def images(self) -> torch.Tensor:  # type: ignore[override]  # read-only: the trajectories' decoded samples
        return self.batch.images

    @property
    def advantages(self) -> torch.Tensor | None:
        return self.batch.advantages

    @advantages.setter
    def advantages(self, value: torch.Tensor | None) -> None:
        self.batch.advantages = value


@dataclass(frozen=True)
class Timings:
    """Seconds of the stages: rollout (and reward), and advantages + update (loss and steps)."""

    rollout_s: float
    update_s: float


@dataclass(frozen=True)
class Run:
    """What a method may use of the run; never the trainer itself."""

    policy: Policy
    adapter: PipelineAdapter
    kernel: Kernel
    accelerator: Any
    scorer: RolloutScorer
    collect: Callable[[Inputs], Rollouts]  # the SDE/DDIM rollout with log-probs, scored chunk by chunk
    ppo_update: Callable[[Rollouts], dict[str, float]]  # best/worst-k selection, then the PPO update


S = TypeVar("S", bound=Samples)


class Algorithm(Generic[S]):
    """The stages of one iteration (see the module docstring). Subclasses override the stages their method
    changes; `name` is `train.algorithm`."""

    name: ClassVar[str] = ""
    cfg: RunConfig

    def rollout(self, run: Run, inputs: Inputs) -> S:
        """Sample with the current policy and score the samples (rewards are part of the rollout)."""
        raise NotImplementedError

    def advantages(self, samples: S) -> tuple[torch.Tensor | None, dict[str, float]]:
        """This process's advantages of `samples` (None: the method uses none) and their metrics."""
        return None, {}

    def update(self, samples: S, run: Run) -> dict[str, float]:
        """Loss -> optimizer step(s) on `samples`; returns the training metrics."""
        raise NotImplementedError

    def report(self, samples: S, timings: Timings) -> dict[str, float]:
        """The iteration's closing metrics, after the update: by default the stage timings."""
        return {"time/rollout_s": timings.rollout_s, "time/update_s": timings.update_s}


def gathered_reward_metrics(rewards: dict[str, torch.Tensor], order: CanonicalOrder) -> dict[str, float]:
    """reward/<name> and reward/<name>_std of each reward over every process's samples (canonical order)."""
    metrics = {}
    for name, r in rewards.items():
        all_r = order.gather(r)
        metrics[f"reward/{name}"] = float(all_r.mean())
        metrics[f"reward/{name}_std"] = float(all_r.std()) if len(all_r) > 1 else 0.0
    return metrics


class PolicyGradient(Algorithm[Rollouts]):
    """The defaults: the trainer's rollout (`Run.collect`), the shared PPO update (`Run.ppo_update`), and a report
    of the rewards over all processes, the mean |advantage| and the timings (with the time the rollout waited
    for its rewards)."""

    def rollout(self, run: Run, inputs: Inputs) -> Rollouts:
        return run.collect(inputs)

    def update(self, samples: Rollouts, run: Run) -> dict[str, float]:
        return run.ppo_update(samples)

    def report(self, samples: Rollouts, timings: Timings) -> dict[str, float]:
        metrics = gathered_reward_metrics(samples.batch.rewards, samples.order)
        if samples.advantages is not None:
            metrics["adv/abs_mean"] = float(samples.advantages.abs().mean())
        metrics.update(super().report(samples, timings))
        metrics["time/reward_blocking_s"] = samples.reward_blocking_s  # of rollout_s
        return metrics
