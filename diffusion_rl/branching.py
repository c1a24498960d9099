"""TempFlow-GRPO (He et al., 2025, arXiv 2508.04324): trajectory branching and noise-aware timestep weights.

**Trajectory branching** (`sample.branching`). A group is one prompt and one initial noise x_T (the paper's
*seed group*: `sample.share_initial_noise`). Its trajectory follows the ODE from x_T to the branching step k,
computed once for the whole group; at step k each of the group's `group_size` samples takes its own SDE step
(its own counter-based noise), and every branch follows the ODE to the end. The branches differ only by
their step-k noise, so the reward differences within the group are credited to step k alone: step k is the
only stochastic step, the only one with a log-prob, and the only one trained (a process reward without an
intermediate reward model). The branching step of an iteration is the iteration's one-step SDE window
(`sample.sde_window_size: 1`): random inside `sample.sde_window` each iteration, or cycling through it with
`sample.sde_window_shift_every: 1` (preset `tempflow_grpo`).

**Noise-aware weighting** (`ppo.noise_aware_weight`). The policy loss of step j is multiplied by
W(j) = Norm(sigma_j sqrt(dt_j)), the std of the step's transition (for Flow-GRPO's SDE sigma_j = a sqrt(s / (1 - s)),
so the std is sigma_j sqrt(s_j - s_{j+1})), normalised to mean 1 over the steps that can be trained. The
paper's eq. (7) writes Norm(sigma_t sqrt(dt)); its authors define the normalisation as "the policy loss weight for
every timestep is different but the mean is 1" (Shredded-Pork/TempFlow-GRPO issues #1 and #11), and their
scripts hard-code the resulting factor (2.25 std for SD3.5-M at 10 steps, noise 0.7, steps 0..8 trained;
1.73 for FLUX). The weight multiplies the PPO-clip term only, not the KL (as in their scripts).

Differences from the authors' scripts (Shredded-Pork/TempFlow-GRPO at commit 63e4def, since removed from the
repository: scripts/train_sd3_pr.py, flow_grpo/diffusers_patch/sd3_pipeline_with_logprob_perstep.py): they
branch at *every* step of every iteration (K = 6 branches per step from each ODE trajectory, so one x_T costs
(T-1) K partial rollouts); here an iteration branches at one step, which costs about one ordinary rollout, and
the designated steps are covered over iterations (cycling) or in expectation (random).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from diffusion_rl.config import SampleConfig
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds, Schedule
from diffusion_rl.rollout import SamplingOptions, Trajectory, kernel_for, rollout, sde_steps_mask
from mmreward.errors import ConfigError


def designated_steps(sample: SampleConfig) -> list[int]:
    """The steps an iteration may branch at (and train): `sample.sde_window` [start, end), or every step."""
    lo, hi = sample.sde_window or (0, sample.num_steps)
    return list(range(lo, hi))


def transition_std(schedule: Schedule, kernel: Kernel) -> torch.Tensor:
    """(T,) float64: the std of each step's Gaussian transition under `kernel` (sigma_t sqrt(dt) for flow_sde).
    A schedule-only quantity: the kernel is evaluated on a zero sample and zero model output."""
    k = replace(kernel, dtype=torch.float64)
    x = torch.zeros(len(schedule), 1, dtype=torch.float64)
    std = k.step(x, x, schedule.a, schedule.b, noise=torch.zeros_like(x)).std
    return torch.as_tensor(std, dtype=torch.float64).expand(len(schedule), 1).flatten().clone()


def noise_aware_weights(schedule: Schedule, kernel: Kernel, designated: Sequence[int]) -> torch.Tensor:
    """(T,) float64: W(j) = std_j / mean over the designated steps of std (the paper's Norm(sigma_t sqrt(dt)))."""
    designated = list(designated)
    if not designated:
        raise ConfigError("ppo.noise_aware_weight: no designated steps (sample.sde_window is empty)")
    std = transition_std(schedule, kernel)
    mean = std[designated].mean()
    if not float(mean) > 0:
        raise ConfigError(f"ppo.noise_aware_weight: kernel '{kernel.name}' with noise_level {kernel.noise_level} has "
                          "no noise on the designated steps; use a stochastic kernel (flow_sde, dance_sde, cps, ddim)")
    return std / mean


def step_weights(sample: SampleConfig, noise_aware: bool, adapter: PipelineAdapter, kernel: Kernel,
                 schedule: Schedule) -> torch.Tensor | None:
    """The trainer's per-step policy-loss weights: None (all 1) unless `ppo.noise_aware_weight`."""
    if not noise_aware:
        return None
    return noise_aware_weights(schedule, kernel_for(adapter, kernel), designated_steps(sample)).float()


@torch.no_grad()
def branched_rollout(adapter: PipelineAdapter, embeds: PromptEmbeds, prompt_ids: Sequence[int] | torch.Tensor,
                     sample_ids: Sequence[int] | torch.Tensor, options: SamplingOptions | None = None, *,
                     decode: bool = True, model: torch.nn.Module | None = None, **sampling: Any) -> Trajectory:
    """`rollout` with the ODE prefix shared by each group (consecutive rows with the same prompt id): the prefix
    x_T -> x_k runs once per group, the SDE step k and the ODE suffix once per sample. `options.sde_steps` must be
    the one branching step k; the other arguments are `rollout`'s. Equal to `rollout(..., sde_steps=[k],
    share_initial_noise=True)` up to float batch effects, with k (G - 1) fewer model calls per group of G."""
    options = SamplingOptions(**sampling) if options is None else replace(options, **sampling)
    num_steps, sde_steps = options.num_steps, options.sde_steps
    if not options.share_initial_noise:
        raise ConfigError("sample.branching grows a group's branches from one initial noise (the seed group): set "
                          "sample.share_initial_noise: true")
    mask = sde_steps_mask(num_steps, sde_steps)
    if int(mask.sum()) != 1:
        raise ConfigError(f"sample.branching takes one SDE step per iteration (the branching step), got "
                          f"{mask.nonzero().flatten().tolist()}: set sample.sde_window_size: 1")
    k = int(mask.nonzero())
    pids = torch.as_tensor(prompt_ids, dtype=torch.long).cpu()
    _, inverse, counts = torch.unique_consecutive(pids, return_inverse=True, return_counts=True)
    first = torch.cumsum(counts, 0) - counts  # the first row of each group stands for the group in the prefix
    common = replace(options, sde_steps=[k], share_initial_noise=True)
    init = None
    if k > 0:
        prefix = rollout(adapter, embeds.index(first), pids[first], torch.zeros(len(first), dtype=torch.long), common,
                         model=model, decode=False, step_range=(0, k))
        init = prefix.latents[inverse, -1]
    suffix = rollout(adapter, embeds, pids, sample_ids, common, model=model, decode=decode, init_latents=init,
                     step_range=(k, num_steps))
    if k == 0:
        return replace(suffix, sde_mask=mask)
    means = None
    if options.store_means:
        means = torch.cat([prefix.means[inverse], suffix.means], dim=1)
    return replace(suffix, latents=torch.cat([prefix.latents[inverse], suffix.latents[:, 1:]], dim=1),
                   log_probs=torch.cat([prefix.log_probs[inverse], suffix.log_probs], dim=1), means=means)
