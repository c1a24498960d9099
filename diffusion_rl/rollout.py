"""Trajectories with log-probs from diffusers pipelines.

`rollout` runs a kernel (`diffusion_rl.kernels`) over an adapter's schedule (`diffusion_rl.pipelines`)
— SDE on a chosen window of steps, deterministic elsewhere — and `step_log_prob` recomputes one step's
log-prob on the training path with exactly the same code, so the first PPO ratio is 1.

Noise is counter-based (`diffusion_rl.seeding.counter_noise`): the noise of sample i of prompt p at step t
is drawn from a generator seeded by a hash of (seed, epoch, p, i, t) — initial noise uses t = -1 — so the
images do not depend on the number of processes or the batch layout, and two samples of a group never
share noise by accident.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from diffusion_rl.kernels import Kernel, StepResult
from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds, Schedule, decode_chunked
from diffusion_rl.seeding import counter_noise
from diffusion_rl.solvers import check_solver, dpm2_step
from mmreward.errors import DIFFUSION_EXTRA, ConfigError, require_installed

# every rollout drives a diffusers pipeline: name the extra at import instead of failing deep inside a run
require_installed("diffusers", DIFFUSION_EXTRA, "diffusion_rl (reward fine-tuning of diffusers pipelines)")


# ----------------------------------------------------------------------------------------------
# rollouts
# ----------------------------------------------------------------------------------------------
@dataclass
class Trajectory:
    """A batch of sampled trajectories. Step j goes from latents[:, j] to latents[:, j + 1]."""

    latents: torch.Tensor  # (B, T + 1, ...) fp32
    log_probs: torch.Tensor  # (B, T) fp32; 0 on deterministic steps
    sde_mask: torch.Tensor  # (T,) bool: steps sampled with the stochastic kernel
    schedule: Schedule
    embeds: PromptEmbeds
    prompt_ids: torch.Tensor  # (B,) long
    sample_ids: torch.Tensor  # (B,) long
    images: torch.Tensor | None = None  # (B, 3, H, W) in [0, 1]
    means: torch.Tensor | None = None  # (B, T, ...) when requested (ratio normalisation, diagnostics)

    def __len__(self) -> int:
        return int(self.latents.shape[0])

    @staticmethod
    def cat(parts: Sequence[Trajectory]) -> Trajectory:
        """Concatenate micro-batches sampled with the same schedule and SDE mask."""
        def opt(name):
            vals = [getattr(p, name) for p in parts]
            return None if vals[0] is None else torch.cat(vals)

        first = parts[0]
        return Trajectory(
            torch.cat([p.latents for p in parts]), torch.cat([p.log_probs for p in parts]), first.sde_mask,
            first.schedule, PromptEmbeds.cat([p.embeds for p in parts]), torch.cat([p.prompt_ids for p in parts]),
            torch.cat([p.sample_ids for p in parts]), opt("images"), opt("means"),
        )

    def index(self, idx) -> Trajectory:
        idx_t = torch.as_tensor(idx, dtype=torch.long)
        return Trajectory(
            self.latents[idx_t], self.log_probs[idx_t], self.sde_mask, self.schedule, self.embeds.index(idx_t),
            self.prompt_ids[idx_t], self.sample_ids[idx_t],
            None if self.images is None else self.images[idx_t],
            None if self.means is None else self.means[idx_t],
        )


def sde_steps_mask(num_steps: int, sde_steps: Sequence[int] | None) -> torch.Tensor:
    """(T,) bool: True for the SDE steps (None = every step)."""
    mask = torch.zeros(num_steps, dtype=torch.bool)
    if sde_steps is None:
        mask[:] = True
        return mask
    steps = list(sde_steps)
    bad = [s for s in steps if not 0 <= s < num_steps]
    if bad:
        raise ConfigError(f"sde_steps: step indices must be in [0, {num_steps}), got {bad}")
    mask[steps] = True
    return mask


def kernel_for(adapter: PipelineAdapter, kernel: Kernel) -> Kernel:
    """Check that the kernel fits the model family and fill in DDIM's prediction type and clipping."""
    if adapter.is_flow != kernel.is_flow:
        raise ConfigError(
            f"kernel '{kernel.name}' does not fit a {adapter.family} pipeline: use "
            f"{'ode, flow_sde, dance_sde, cps or cps_gaussian' if adapter.is_flow else 'ddim'}"
        )
    if not adapter.is_flow:
        from dataclasses import replace

        return replace(kernel, prediction_type=adapter.prediction_type, clip_sample_range=adapter.clip_sample_range)
    return kernel


def step_log_prob(
    adapter: PipelineAdapter,
    model: torch.nn.Module,
    x: torch.Tensor,
    x_next: torch.Tensor,
    step_index: torch.Tensor,
    schedule: Schedule,
    embeds: PromptEmbeds,
    guidance_scale: float,
    kernel: Kernel,
) -> StepResult:
    """The training path: log-prob of x -> x_next at per-item step indices, with gradients to the model."""
    step_index = torch.as_tensor(step_index, dtype=torch.long).cpu()
    dev = x.device
    t = schedule.timesteps[step_index].to(dev)
    out = adapter.predict(model, x, t, embeds, guidance_scale)
    a = schedule.a[step_index].to(dev)
    b = schedule.b[step_index].to(dev)
    return kernel_for(adapter, kernel).step(x, out, a, b, prev_sample=x_next)


@torch.no_grad()
def step_noise(shape: Sequence[int], seed: int, epoch: int, pids: list[int], sids: list[int], step: int,
               device: torch.device | str, antithetic: bool = False) -> torch.Tensor:
    """The SDE noise of one step; with `antithetic`, sample ids 2k and 2k+1 share one draw with opposite signs."""
    if not antithetic:
        return counter_noise(shape, seed, epoch, pids, sids, step, device)
    noise = counter_noise(shape, seed, epoch, pids, [s - s % 2 for s in sids], step, device)
    sign = torch.tensor([-1.0 if s % 2 else 1.0 for s in sids], device=noise.device, dtype=noise.dtype)
    return noise * sign.view(-1, *([1] * (noise.ndim - 1)))


@dataclass(frozen=True)
class SamplingOptions:
    """How a rollout samples, as one object: steps, guidance, kernel, which steps are stochastic, the noise counters
    and the memory knobs. `SamplingOptions.for_run` builds it from a run config; `rollout` takes it (or the same
    names as keywords)."""

    num_steps: int
    guidance_scale: float
    kernel: Kernel
    sde_steps: Sequence[int] | None = None
    seed: int = 0
    epoch: int = 0
    share_initial_noise: bool = False
    store_means: bool = False
    ode_solver: str = "euler"
    decode_chunk_size: int | None = None
    offload: bool = False
    antithetic: bool = False

    @classmethod
    def for_run(cls, sample_cfg: Any, adapter: PipelineAdapter, kernel: Kernel, *, seed: int, epoch: int,
                sde_steps: Sequence[int] | None = None, store_means: bool = False) -> SamplingOptions:
        """A training rollout of a run: `sample.*` settings, the memory defaults resolved for `adapter`."""
        from diffusion_rl.memory_settings import rollout_kwargs

        return cls(num_steps=sample_cfg.num_steps, guidance_scale=sample_cfg.guidance_scale, kernel=kernel,
                   sde_steps=sde_steps, seed=seed, epoch=epoch, share_initial_noise=sample_cfg.share_initial_noise,
                   store_means=store_means, ode_solver=sample_cfg.ode_solver,
                   antithetic=sample_cfg.antithetic_noise, **rollout_kwargs(sample_cfg, adapter))


def rollout(
    adapter: PipelineAdapter,
    embeds: PromptEmbeds,
    prompt_ids: Sequence[int] | torch.Tensor,
    sample_ids: Sequence[int] | torch.Tensor,
    options: SamplingOptions | None = None,
    *,
    model: torch.nn.Module | None = None,
    decode: bool = True,
    progress: bool = False,
    init_latents: torch.Tensor | None = None,
    step_range: tuple[int, int] | None = None,
    **sampling: Any,
) -> Trajectory:
    """Sample one trajectory per row of `embeds`, as `options` says (or the `SamplingOptions` fields given as
    keywords, which also override single fields of `options`).

    `prompt_ids`/`sample_ids` are the counters of the noise (see module docstring); with
    `share_initial_noise` every sample of a prompt starts from the same x_T (sample id 0), as DanceGRPO's
    `init_same_noise`, while the per-step SDE noise stays distinct. `model` defaults to the pipeline's
    denoiser (pass the wrapped training model to sample from the current policy). `ode_solver` 'dpm2' takes
    the deterministic steps after the last SDE step with DPM-Solver++ 2M (MixGRPO's higher-order ODE part;
    flow models only); the steps before and in the window, and so every trained log-prob, are unchanged.

    Memory (`diffusion_rl.memory_settings`): the VAE decodes `decode_chunk_size` samples at a time (None: one clip for
    video pipelines, the whole batch for images); with `offload` every stored tensor (the per-step latents,
    log-probs and means, and the decoded samples) goes to CPU memory as soon as it is made, so the device holds
    only the current state and one decode chunk. Neither changes a value.
    `step_range` (start, stop) takes only those steps, from `init_latents` (default: the x_T above) — the
    pieces of a branched rollout (`diffusion_rl.branching`); latents and log-probs then cover just those steps.
    `antithetic` mirrors the SDE noise: sample 2k+1 takes minus sample 2k's noise at every SDE step (each sample
    is still marginally a draw of the policy, so the gradient stays unbiased and each log-prob is unchanged).
    """
    if options is None:
        options = SamplingOptions(**sampling)
    elif sampling:
        options = replace(options, **sampling)
    return _rollout(adapter, embeds, prompt_ids, sample_ids, **{f.name: getattr(options, f.name) for f in fields(options)},
                    model=model, decode=decode, progress=progress, init_latents=init_latents, step_range=step_range)


def _rollout(
    adapter: PipelineAdapter,
    embeds: PromptEmbeds,
    prompt_ids: Sequence[int] | torch.Tensor,
    sample_ids: Sequence[int] | torch.Tensor,
    *,
    num_steps: int,
    guidance_scale: float,
    kernel: Kernel,
    sde_steps: Sequence[int] | None = None,
    seed: int = 0,
    epoch: int = 0,
    share_initial_noise: bool = False,
    model: torch.nn.Module | None = None,
    decode: bool = True,
    store_means: bool = False,
    progress: bool = False,
    ode_solver: str = "euler",
    decode_chunk_size: int | None = None,
    offload: bool = False,
    init_latents: torch.Tensor | None = None,
    step_range: tuple[int, int] | None = None,
    antithetic: bool = False,
) -> Trajectory:
    if num_steps < 1:
        raise ConfigError(f"num_steps must be >= 1, got {num_steps}")
    model = model if model is not None else adapter.denoiser
    kernel = kernel_for(adapter, kernel)
    deterministic = kernel.deterministic()
    pids = [int(p) for p in torch.as_tensor(prompt_ids).tolist()]
    sids = [int(s) for s in torch.as_tensor(sample_ids).tolist()]
    if len(pids) != len(embeds) or len(sids) != len(embeds):
        raise ConfigError(
            f"prompt_ids and sample_ids need one entry per embedding row ({len(embeds)}), got {len(pids)} and {len(sids)}"
        )
    device = adapter.device
    schedule = adapter.schedule(num_steps)
    mask = sde_steps_mask(num_steps, sde_steps)
    shape = adapter.latent_shape()
    init_ids = [0] * len(sids) if share_initial_noise else sids
    if init_latents is None:
        x = counter_noise(shape, seed, epoch, pids, init_ids, -1, device).to(kernel.dtype) * adapter.initial_noise_scale()
    else:
        x = init_latents.to(device, kernel.dtype)
    store = torch.device("cpu") if offload else x.device  # where the trajectory is kept
    latents, log_probs, means = [x.to(store)], [], []
    check_solver(ode_solver)
    if ode_solver == "dpm2" and not adapter.is_flow:
        raise ConfigError("sample.ode_solver 'dpm2' integrates the flow ODE: use 'euler' with DDIM pipelines")
    post = int(mask.nonzero().max()) + 1 if mask.any() else 0  # first step after the SDE window
    x0_prev: tuple[torch.Tensor, float] | None = None
    steps = range(*(step_range or (0, num_steps)))
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="rollout", leave=False)
    for j in steps:
        t = schedule.timesteps[j].to(device).expand(len(pids))
        out = adapter.predict(model, x, t, embeds, guidance_scale)
        k = kernel if mask[j] else deterministic
        noise = step_noise(shape, seed, epoch, pids, sids, j, device, antithetic) if mask[j] else None
        # per-item schedule values, exactly as `step_log_prob` passes them, so both paths round alike
        a = schedule.a[j].expand(len(pids)).to(device)
        b = schedule.b[j].expand(len(pids)).to(device)
        if ode_solver == "dpm2" and j >= post:
            s_j = float(schedule.a[j])
            x0 = x.float() - s_j * out.float()
            x_dpm = dpm2_step(x.float(), x0, *(x0_prev or (None, None)), s_j, float(schedule.b[j])).to(x.dtype)
            res = StepResult(x_dpm, x_dpm, torch.zeros((), dtype=x.dtype), torch.zeros(len(pids), device=x.device))
        else:
            res = k.step(x, out, a, b, noise=noise)
        if ode_solver == "dpm2":  # DPM-Solver++'s multistep memory: the data prediction of every step, SDE ones too
            x0_prev = (x.float() - float(schedule.a[j]) * out.float(), float(schedule.a[j]))
        x = res.prev_sample
        latents.append(x.to(store))
        log_probs.append(res.log_prob.to(store))
        if store_means:
            means.append(res.mean.to(store))
    traj = Trajectory(
        latents=torch.stack(latents, dim=1), log_probs=torch.stack(log_probs, dim=1), sde_mask=mask,
        schedule=schedule, embeds=embeds, prompt_ids=torch.tensor(pids), sample_ids=torch.tensor(sids),
        means=torch.stack(means, dim=1) if store_means else None,
    )
    if decode:
        traj.images = decode_chunked(adapter, x, decode_chunk_size, device=store)
    return traj


@dataclass
class RolloutBatch:
    """One iteration's local samples, scored: what an algorithm turns into advantages."""

    traj: Trajectory
    prompts: list[str]  # (N,) the prompt of each sample
    slots: torch.Tensor  # (N,) long: the prompt slot (= group id)
    rewards: dict[str, torch.Tensor]  # name -> (N,)
    train_steps: torch.Tensor  # (N, k) long: the steps trained for each sample
    slot_prompts: list[str]  # the prompt of every slot of the iteration, on all processes
    advantages: torch.Tensor | None = None
    step_weights: torch.Tensor | None = None  # (T,) policy-loss weight of each step (TempFlow-GRPO); None: all 1

    def weighted(self, advantages: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """The advantages of samples trained at `steps`, times the steps' loss weights: PPO-clip's
        max(-A r, -A clip(r)) is positively homogeneous in A, so this scales each sample's loss by its weight."""
        if self.step_weights is None:
            return advantages
        return advantages * self.step_weights[torch.as_tensor(steps).cpu()].to(advantages.device, advantages.dtype)

    @property
    def images(self) -> torch.Tensor:
        return self.traj.images
