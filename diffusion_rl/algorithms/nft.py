"""DiffusionNFT (Zheng et al., 2025): online RL on the forward process of a flow model.

No likelihoods and no SDE: rollouts are sampled by any deterministic solver (CFG-free, DPM-Solver++ 2M
in the paper), scored, and turned into optimality probabilities r in [0, 1]; the velocity is then trained
by flow matching on fresh forward-noised x_t = (1 - s) x_0 + s eps of the *generated* x_0, through two
implicit policies built from the frozen old policy v_old and the trained one v_theta:

    v+ = (1 - beta) v_old + beta v_theta          (the policy that should fit the good samples)
    v- = (1 + beta) v_old - beta v_theta          (its mirror, which should fit the bad ones)
    loss = A_max / beta * [ r ||x0(v+) - x_0||^2 / w+  +  (1 - r) ||x0(v-) - x_0||^2 / w- ]

with x0(v) = x_t - s v (so ||x0(v) - x_0||^2 = s^2 ||v - (eps - x_0)||^2: the velocity loss at weight s^2),
and the adaptive weights w = mean |x0(v) - x_0| (per sample, no gradient, at least 1e-5). Rewards become
r by the paper's mapping r = clip(A / (2 A_max) + 1/2, 0, 1) of the group-normalised advantage A
clipped to [-A_max, A_max] (`optimality_probability`).

The old policy samples the rollouts and gives v_old; after each iteration it moves towards the trained
weights, old <- d old + (1 - d) theta, with d = min(rate * max(step - flat, 0), cap) at optimizer step
`step` (`old_policy_decay`; the paper's schedules: (0, 0.001, 0.5) by default, (75, 0.0075, 0.999) for OCR).
An optional KL term kl_beta * ||v_theta - v_ref||^2 keeps the velocity near the reference model.

Defaults follow scripts/train_nft_sd3.py and config/nft.py of NVlabs/DiffusionNFT (preset `diffusion_nft`).
Differences: the trained timesteps are a random `timestep_fraction` of the sampling schedule per sample,
drawn counter-based (the reference shuffles them with the global RNG); the old policy is a copy of the
trained parameters swapped in for its forward passes (the reference keeps a second LoRA adapter), so FSDP
runs are refused. The old policy is checkpointed (`tensor_state`, safetensors), so a resumed run is exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from diffusion_rl.algorithms.base import Algorithm, Inputs, Run, Samples, Timings, gathered_reward_metrics
from diffusion_rl.algorithms.grpo import grpo_advantages
from diffusion_rl.config import RunConfig
from diffusion_rl.context_parallel import degree
from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds
from diffusion_rl.policy import Policy
from diffusion_rl.sample_assignment import CanonicalOrder
from diffusion_rl.seeding import counter_noise, noise_key
from diffusion_rl.solvers import check_solver, dpm2_step
from mmreward.errors import CheckpointError, ConfigError
from mmreward.prompt_sources import score_with_metadata

NFT_STEP_DRAW = -6  # the last counter of the seed of the trained timesteps
FORWARD_NOISE_STEP = 10_000  # the step counter of the forward-process noise (rollout noise uses steps < 10000)


# ----------------------------------------------------------------------------------------------
# the paper's formulas (pure)
# ----------------------------------------------------------------------------------------------
def optimality_probability(advantages: torch.Tensor, clip_max: float) -> torch.Tensor:
    """r = clip(A / (2 A_max) + 1/2, 0, 1) of advantages A clipped to [-A_max, A_max]."""
    a = advantages.clamp(-clip_max, clip_max)
    return (a / clip_max / 2.0 + 0.5).clamp(0.0, 1.0)


def old_policy_decay(step: int, flat: float, rate: float, cap: float) -> float:
    """The old policy's soft-update factor d after `step` optimizer steps: 0 before `flat`, then
    rate * (step - flat), at most `cap` (0 copies the trained weights, 1 freezes the old policy)."""
    if step < flat:
        return 0.0
    return min((step - flat) * rate, cap)


def nft_loss(v_theta: torch.Tensor, v_old: torch.Tensor, x_t: torch.Tensor, x0: torch.Tensor, sigma: torch.Tensor,
             r: torch.Tensor, beta: float, *, adaptive: bool = True, clip_max: float = 1.0) -> torch.Tensor:
    """Per-sample DiffusionNFT loss (B,), see the module docstring; `sigma` and `r` are (B,)."""
    view = (-1,) + (1,) * (x0.dim() - 1)
    s = sigma.to(x0.dtype).view(view)
    dims = tuple(range(1, x0.dim()))
    v_old = v_old.detach()
    pos = x_t - s * (beta * v_theta + (1.0 - beta) * v_old)
    neg = x_t - s * ((1.0 + beta) * v_old - beta * v_theta)

    def term(x0_pred: torch.Tensor) -> torch.Tensor:
        err = x0_pred - x0
        if not adaptive:
            return (err ** 2).mean(dims)
        with torch.no_grad():  # the paper's self-normalising weight: no gradient through it
            w = err.double().abs().mean(dims, keepdim=True).clamp_min(1e-5).to(err.dtype)
        return (err ** 2 / w).mean(dims)

    r = r.to(x0.dtype)
    return clip_max * (r * term(pos) + (1.0 - r) * term(neg)) / beta


# ----------------------------------------------------------------------------------------------
# sampling
# ----------------------------------------------------------------------------------------------
@torch.no_grad()
def sample_ode(adapter: PipelineAdapter, model: torch.nn.Module, embeds: PromptEmbeds, prompt_ids: Sequence[int],
               sample_ids: Sequence[int], *, num_steps: int, guidance_scale: float, solver: str, seed: int,
               epoch: int, share_initial_noise: bool = False) -> torch.Tensor:
    """Final latents x_0 of the deterministic flow ODE from the rollout's counter-based x_T ('euler' takes
    exactly the steps of `rollout` with the ODE kernel; 'dpm2' DPM-Solver++ 2M)."""
    check_solver(solver)
    device = adapter.device
    pids, sids = list(prompt_ids), list(sample_ids)
    schedule = adapter.schedule(num_steps)
    shape = adapter.latent_shape()
    init_ids = [0] * len(sids) if share_initial_noise else sids
    x = counter_noise(shape, seed, epoch, pids, init_ids, -1, device).float() * adapter.initial_noise_scale()
    prev: tuple[torch.Tensor, float] | None = None
    for j in range(num_steps):
        t = schedule.timesteps[j].to(device).expand(len(pids))
        v = adapter.predict(model, x, t, embeds, guidance_scale).float()
        s, s_next = float(schedule.a[j]), float(schedule.b[j])
        if solver == "euler":
            x = x + (s_next - s) * v
            continue
        x0 = x - s * v
        x = dpm2_step(x, x0, *(prev if prev is not None else (None, None)), s, s_next)
        prev = (x0, s)
    return x


# ----------------------------------------------------------------------------------------------
# the method
# ----------------------------------------------------------------------------------------------
@dataclass(eq=False)
class NFTSamples(Samples):
    """The old policy's clean ODE samples, their images and rewards; `advantages` holds the optimality
    probabilities r the loss weighs them by."""

    inputs: Inputs
    x0: torch.Tensor  # (N, ...) clean latents
    rewards: dict[str, torch.Tensor]  # name -> (N,) this process's scores
    order: CanonicalOrder
    images: torch.Tensor | None = None  # decoded, on the CPU


class DiffusionNFT(Algorithm[NFTSamples]):
    """Forward-process RL (see the module docstring): rollout = the old policy's ODE samples and their rewards,
    advantages = the optimality probabilities r, update = the NFT loss steps and the old policy's move."""

    name = "nft"

    def __init__(self, cfg: RunConfig, rewards: dict[str, Any]) -> None:
        self.cfg, self.rewards = cfg, rewards
        self.metadata = cfg.prompts.load("train")  # metadata-aware rewards (shapes-eval) look prompts up here
        self.old: list[torch.Tensor] | None = None

    @contextlib.contextmanager
    def old_weights(self, policy: Policy) -> Iterator[None]:
        """Inside the block the model holds the old policy's weights."""
        assert self.old is not None
        for p, o in zip(policy.trainable, self.old, strict=True):
            p.data, o.data = o.data, p.data
        try:
            yield
        finally:
            for p, o in zip(policy.trainable, self.old, strict=True):
                p.data, o.data = o.data, p.data

    def tensor_state(self) -> dict[str, torch.Tensor] | None:
        """The old policy's weights for the checkpoint (None before the first iteration creates them)."""
        if self.old is None:
            return None
        return {f"old.{i}": o.detach().cpu().contiguous() for i, o in enumerate(self.old)}

    def load_tensor_state(self, tensors: dict[str, torch.Tensor], policy: Policy) -> None:
        """Restore the old policy saved by `tensor_state`, one tensor per trained parameter."""
        keys = [f"old.{i}" for i in range(len(policy.trainable))]
        if sorted(tensors) != sorted(keys) or any(tuple(tensors[k].shape) != tuple(p.shape)
                                                  for k, p in zip(keys, policy.trainable, strict=True)):
            raise CheckpointError(f"the checkpoint's nft old policy ({len(tensors)} tensors) does not fit this model's "
                                  f"{len(keys)} trained parameters (different LoRA config?)")
        self.old = [tensors[k].to(p.device, p.dtype).clone() for k, p in zip(keys, policy.trainable, strict=True)]

    @torch.no_grad()
    def update_old(self, policy: Policy) -> float:
        d = old_policy_decay(policy.steps, *self.cfg.nft.old_decay)
        for p, o in zip(policy.trainable, self.old, strict=True):
            o.mul_(d).add_(p.detach(), alpha=1.0 - d)
        return d

    def _check(self, adapter: PipelineAdapter, policy: Policy) -> None:
        if not adapter.is_flow:
            raise ConfigError("train.algorithm 'nft' trains a flow model's velocity: use an SD3, FLUX or other flow "
                              f"pipeline (this one is {adapter.family})")
        if policy.sharded:
            raise ConfigError("train.algorithm 'nft' swaps in the old policy's weights, which FSDP-sharded parameters "
                              "do not allow: run it with DDP (or one process)")

    def rollout(self, run: Run, inputs: Inputs) -> NFTSamples:
        """ODE samples of the old policy, decoded and scored."""
        policy, adapter, acc = run.policy, run.adapter, run.accelerator
        self._check(adapter, policy)
        cfg, tc = self.cfg, self.cfg.train
        if self.old is None:
            self.old = [p.detach().clone() for p in policy.trainable]
        prompts, embeds, slots, sample_ids = inputs.prompts, inputs.embeds, inputs.slots, inputs.sample_ids
        model = policy.unwrapped
        n = len(prompts)
        x0_parts = []
        model.eval()
        with self.old_weights(policy), acc.autocast():
            for idx in torch.split(torch.arange(n), cfg.sample.batch_size):
                x0_parts.append(sample_ode(
                    adapter, model, embeds.index(idx), slots[idx].tolist(), sample_ids[idx].tolist(),
                    num_steps=cfg.sample.num_steps, guidance_scale=cfg.sample.guidance_scale,
                    solver=cfg.sample.ode_solver, seed=tc.seed, epoch=inputs.it,
                    share_initial_noise=cfg.sample.share_initial_noise))
        x0_all = torch.cat(x0_parts).float()
        images = torch.cat([adapter.decode(x0_all[i]) for i in torch.split(torch.arange(n), cfg.sample.batch_size)])
        rewards = {name: score_with_metadata(r, prompts, images, self.metadata).scores.float().to(acc.device)
                   for name, r in self.rewards.items()}
        # under context parallelism the group's processes hold the same samples: the gather keeps one copy
        order = CanonicalOrder(acc, slots, sample_ids, cfg.sample.group_size, degree(cfg.model.context_parallel))
        return NFTSamples(inputs=inputs, x0=x0_all, rewards=rewards, order=order, images=images.detach().cpu())

    def advantages(self, samples: NFTSamples) -> tuple[torch.Tensor, dict[str, float]]:
        """The optimality probabilities r of this process's samples, from GRPO's advantages over all processes."""
        cfg, order = self.cfg, samples.order
        adv_all, metrics = grpo_advantages({k: order.gather(v) for k, v in samples.rewards.items()},
                                           order.gather(samples.inputs.slots), cfg.reward.rewards, cfg.advantage,
                                           cfg.reward.aggregation)
        return optimality_probability(order.local(adv_all), self.clip_max), metrics

    @property
    def clip_max(self) -> float:
        """A_max: advantage.clip_max, 1 when unset."""
        return self.cfg.advantage.clip_max if self.cfg.advantage.clip_max is not None else 1.0

    def update(self, samples: NFTSamples, run: Run) -> dict[str, float]:
        """`num_minibatches` optimizer steps of the NFT loss, then the old policy moves towards the trained one."""
        assert samples.advantages is not None
        i = samples.inputs
        metrics = self._train(i.it, run.policy, run.adapter, i.embeds, i.slots, i.sample_ids, samples.x0,
                              samples.advantages, self.clip_max)
        metrics["nft/old_decay"] = self.update_old(run.policy)
        return metrics

    def report(self, samples: NFTSamples, timings: Timings) -> dict[str, float]:
        assert samples.advantages is not None
        metrics = gathered_reward_metrics(samples.rewards, samples.order)
        metrics["nft/r_mean"] = float(samples.advantages.mean())
        return {**metrics, **super().report(samples, timings)}

    def train_steps(self, it: int, slots: torch.Tensor, sample_ids: torch.Tensor, num_steps: int) -> torch.Tensor:
        """(N, k): the schedule steps trained for each sample, a counter-based random subset of the
        `timestep_fraction` * num_steps steps (the same on any number of processes)."""
        k = max(1, int(num_steps * self.cfg.train.timestep_fraction))
        rows, gen = [], torch.Generator()
        for p, i in zip(slots.tolist(), sample_ids.tolist()):
            gen.manual_seed(noise_key(self.cfg.train.seed, it, p, i, NFT_STEP_DRAW))
            rows.append(torch.randperm(num_steps, generator=gen)[:k])
        return torch.stack(rows)

    def _train(self, it: int, policy: Policy, adapter: PipelineAdapter, embeds: PromptEmbeds, slots: torch.Tensor,
               sample_ids: torch.Tensor, x0_all: torch.Tensor, r_all: torch.Tensor, clip_max: float
               ) -> dict[str, float]:
        cfg, acc, tc, nc = self.cfg, policy.accelerator, self.cfg.train, self.cfg.nft
        schedule = adapter.schedule(cfg.sample.num_steps)
        steps = self.train_steps(it, slots, sample_ids, cfg.sample.num_steps)
        n, k = len(slots), steps.shape[1]
        shape = adapter.latent_shape()
        stats: dict[str, list[float]] = {"loss": [], "policy_loss": [], "kl": [], "old_deviation": []}
        grad_norms = []
        model, unwrapped = policy.model, policy.unwrapped
        for mb in torch.tensor_split(torch.arange(n), tc.num_minibatches):
            chunks = list(torch.split(mb, tc.micro_batch_size))
            n_backward, count = len(chunks) * k, 0
            model.train()
            for chunk in chunks:
                emb = embeds.index(chunk)
                x0 = x0_all[chunk].to(acc.device)
                r = r_all[chunk].to(acc.device)
                for s_i in range(k):
                    j = steps[chunk, s_i]
                    sigma = schedule.a[j].to(acc.device, torch.float32)
                    t = schedule.timesteps[j].to(acc.device)
                    # fresh forward noise per (sample, trained step), counter-based like every other draw
                    eps = torch.stack([counter_noise(shape, tc.seed, it, [int(p)], [int(i)],
                                                     FORWARD_NOISE_STEP + int(jj), acc.device)[0]
                                       for p, i, jj in zip(slots[chunk].tolist(), sample_ids[chunk].tolist(), j.tolist())])
                    view = (-1,) + (1,) * (x0.dim() - 1)
                    x_t = (1.0 - sigma.view(view)) * x0 + sigma.view(view) * eps.float()
                    count += 1
                    with contextlib.nullcontext() if count == n_backward else acc.no_sync(model):
                        with torch.no_grad(), self.old_weights(policy), acc.autocast():
                            v_old = adapter.predict(unwrapped, x_t, t, emb, cfg.sample.guidance_scale).float()
                        with acc.autocast():
                            v = adapter.predict(model, x_t, t, emb, cfg.sample.guidance_scale).float()
                        pl = nft_loss(v, v_old, x_t, x0, sigma, r, nc.beta, adaptive=nc.adaptive_weight,
                                      clip_max=clip_max).mean()
                        loss = pl
                        if tc.kl_beta > 0:
                            kl = ((v - self._reference(policy, adapter, x_t, t, emb)) ** 2).mean()
                            loss = loss + tc.kl_beta * kl
                            stats["kl"].append(float(kl.detach()))
                        acc.backward(loss / n_backward)
                    stats["loss"].append(float(loss.detach()))
                    stats["policy_loss"].append(float(pl.detach()))
                    stats["old_deviation"].append(float(((v.detach() - v_old) ** 2).mean()))
            gn = policy.step()
            if gn is not None:
                grad_norms.append(gn)
        out = {f"train/{key}": sum(v) / len(v) for key, v in stats.items() if v}
        if grad_norms:
            out["train/grad_norm"] = sum(grad_norms) / len(grad_norms)
        return out

    @torch.no_grad()
    def _reference(self, policy: Policy, adapter: PipelineAdapter, x_t: torch.Tensor, t: torch.Tensor,
                   emb: PromptEmbeds) -> torch.Tensor:
        """The reference velocity: the frozen copy, or the LoRA model with its adapters off."""
        gs = self.cfg.sample.guidance_scale
        with policy.accelerator.autocast():
            if policy.ref_model is not None:
                return adapter.predict(policy.ref_model, x_t, t, emb, gs).float()
            model = policy.unwrapped
            model.disable_adapters()
            try:
                return adapter.predict(model, x_t, t, emb, gs).float()
            finally:
                model.enable_adapters()
