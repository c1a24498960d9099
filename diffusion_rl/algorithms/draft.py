"""DRaFT-K (Clark et al., 2023) and AlignProp (Prabhudesai et al., 2023): reward backpropagation.

Sample an image with the current LoRA weights, score it with differentiable rewards, and follow the
gradient of the reward through the sampler into the weights. Backpropagating through all T steps is
exact but costs T times the activation memory, so both methods truncate:

    x_T ~ N(0, I);  x_{t-1} = step(x_t, eps_theta(x_t, t))   for the first T - K steps, without grad
                    x_{t-1} = step(x_t, eps_theta(x_t, t))   for the last K steps, with grad
    loss = -sum_k w_k r_k(decode(x_0))

DRaFT-K uses a fixed K (K = 1 works best in the paper); AlignProp draws K at random every iteration
("randomised truncated backpropagation") so every step's weights receive gradient over training.
Gradient checkpointing of the denoiser (`model.gradient_checkpointing`) keeps the K steps affordable.

Sampling, reward and loss are one graph per micro-batch (the loss IS the reward of a differentiable rollout), so
they cannot be separate stages of the iteration (`diffusion_rl.algorithms.base`): the rollout stage only hands
the inputs on, and `DRaFT.update` does the fused work (sample with truncated backprop -> score -> backward, per
micro-batch, then the step); the trainer keeps the shared setup (configs, LoRA/EMA/accelerate, evaluation,
logging and checkpoints). Simplifications: DRaFT-LV's extra noised copies
are not implemented; the sampler is the configured kernel (ODE / DDIM eta=0 for DRaFT; AlignProp's
code samples DDIM with eta=1, which stays differentiable because the step noise is fixed). The presets'
(`diffusion_rl.presets`) lr and LoRA rank for DRaFT are ours (the paper's code is not public); AlignProp's follow its config
(lr 1e-3, 50 DDIM steps, eta 1, guidance 5, grad-norm 1).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from diffusion_rl.algorithms.base import Algorithm, Inputs, Run, Samples, Timings
from diffusion_rl.config import RunConfig
from diffusion_rl.kernels import Kernel
from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds, decode_chunked
from diffusion_rl.rollout import kernel_for
from diffusion_rl.seeding import counter_noise, noise_key
from mmreward.errors import ConfigError

TRUNCATION_DRAW = -5  # the last counter of the seed of AlignProp's K


def truncation_steps(strategy: str, max_steps: int, num_steps: int, seed: int, iteration: int) -> int:
    """K for this iteration: `max_steps` ('fixed') or uniform in [1, max_steps] ('uniform'), counter-based
    so every process draws the same K; never more than the sampler's steps."""
    cap = min(max_steps, num_steps)
    if strategy == "fixed":
        return cap
    if strategy == "uniform":
        gen = torch.Generator().manual_seed(noise_key(seed, iteration, TRUNCATION_DRAW))
        return int(torch.randint(1, cap + 1, (1,), generator=gen))
    raise ConfigError(f"backprop_strategy must be 'fixed' or 'uniform', got {strategy!r}")


def sample_with_truncated_backprop(
    adapter: PipelineAdapter,
    model: torch.nn.Module,
    embeds: PromptEmbeds,
    prompt_ids: Sequence[int],
    sample_ids: Sequence[int],
    *,
    num_steps: int,
    guidance_scale: float,
    kernel: Kernel,
    backprop_steps: int,
    seed: int,
    epoch: int,
    decode_chunk_size: int | None = None,
) -> torch.Tensor:
    """Images whose graph reaches `model` through the last `backprop_steps` sampling steps (and the VAE).

    The noise is the rollout's counter-based noise, so with the same (seed, epoch, ids) this samples
    exactly the trajectory `diffusion_rl.rollout.rollout` would (checked in tests). The VAE decodes
    `decode_chunk_size` samples at a time (None: one clip for video, the whole batch for images) in one graph."""
    if not 1 <= backprop_steps <= num_steps:
        raise ConfigError(f"backprop_steps must be in [1, num_steps={num_steps}], got {backprop_steps}")
    kernel = kernel_for(adapter, kernel)
    stochastic = kernel.noise_level > 0
    pids, sids = list(prompt_ids), list(sample_ids)
    device = adapter.device
    schedule = adapter.schedule(num_steps)
    shape = adapter.latent_shape()
    x = counter_noise(shape, seed, epoch, pids, sids, -1, device).to(kernel.dtype) * adapter.initial_noise_scale()
    first_grad_step = num_steps - backprop_steps
    for j in range(num_steps):
        t = schedule.timesteps[j].to(device).expand(len(pids))
        noise = counter_noise(shape, seed, epoch, pids, sids, j, device) if stochastic else None
        a = schedule.a[j].expand(len(pids)).to(device)
        b = schedule.b[j].expand(len(pids)).to(device)
        with torch.set_grad_enabled(j >= first_grad_step and torch.is_grad_enabled()):
            out = adapter.predict(model, x, t, embeds, guidance_scale)
            x = kernel.step(x, out, a, b, noise=noise).prev_sample
    return decode_chunked(adapter, x, decode_chunk_size, keep_graph=True)


@dataclass(eq=False)
class RewardBackpropSamples(Samples):
    """Reward backpropagation's samples: the inputs when the rollout stage hands them on; the fused update adds
    each micro-batch's (detached) rewards and images."""

    inputs: Inputs
    accelerator: Any  # gathers the rewards of every process for the report
    rewards: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # name -> one tensor per micro-batch


class DRaFT(Algorithm[RewardBackpropSamples]):
    """Reward backpropagation (see the module docstring): the rollout stage hands the inputs on, `update` samples,
    scores and backpropagates per micro-batch, then steps."""

    name = "draft"

    def __init__(self, cfg: RunConfig, rewards: dict[str, Any]) -> None:
        self.cfg, self.rewards = cfg, rewards

    def reward_metrics(self, acc: Any, rewards: dict[str, list[torch.Tensor]], weights: dict[str, float]
                       ) -> dict[str, float]:
        """Each reward's mean and std over all processes, and their weighted, oriented sum (reward/combined)."""
        metrics: dict[str, float] = {}
        combined = 0.0
        for name, parts in rewards.items():
            allr = acc.gather(torch.cat(parts))
            metrics[f"reward/{name}"] = float(allr.mean())
            metrics[f"reward/{name}_std"] = float(allr.std()) if len(allr) > 1 else 0.0
            sign = 1.0 if self.rewards[name].higher_is_better else -1.0
            combined += weights[name] * sign * float(allr.mean())
        metrics["reward/combined"] = combined
        return metrics

    def _check_rewards(self) -> None:
        bad = [n for n, r in self.rewards.items() if not r.differentiable]
        if bad:
            raise ConfigError(
                f"reward.rewards: DRaFT/AlignProp backpropagate through the rewards, but {bad} are not "
                "differentiable; use differentiable rewards (see `mmreward list`) or a policy-gradient "
                "algorithm (grpo, ddpo) that takes any reward"
            )

    def rollout(self, run: Run, inputs: Inputs) -> RewardBackpropSamples:
        """Nothing is sampled yet: sampling, reward and loss are one graph, built in `update`."""
        self._check_rewards()
        return RewardBackpropSamples(inputs=inputs, accelerator=run.accelerator)

    def report(self, samples: RewardBackpropSamples, timings: Timings) -> dict[str, float]:
        """The rewards over all processes and their weighted sum; one timing, the whole fused iteration."""
        metrics = self.reward_metrics(samples.accelerator, samples.rewards, self.cfg.reward.rewards)
        metrics["time/iteration_s"] = timings.rollout_s + timings.update_s
        return metrics

    def update(self, samples: RewardBackpropSamples, run: Run) -> dict[str, float]:
        """Per micro-batch: sample with truncated backprop, score, backward; then one optimizer step."""
        it, prompts, embeds, slots, sample_ids = (samples.inputs.it, samples.inputs.prompts, samples.inputs.embeds,
                                                  samples.inputs.slots, samples.inputs.sample_ids)
        policy, adapter, kernel = run.policy, run.adapter, run.kernel
        cfg, acc, model = self.cfg, policy.accelerator, policy.model
        k = truncation_steps(cfg.draft.backprop_strategy, cfg.draft.backprop_steps, cfg.sample.num_steps,
                             cfg.train.seed, it)
        weights = cfg.reward.rewards
        model.train()
        n = len(prompts)
        chunks = list(torch.split(torch.arange(n), cfg.train.micro_batch_size))
        rewards: dict[str, list[torch.Tensor]] = {name: [] for name in self.rewards}
        samples.rewards = rewards
        losses, images_all = [], []
        for c, idx in enumerate(chunks):
            # gradients are averaged over processes once, on the last micro-batch
            with contextlib.nullcontext() if c == len(chunks) - 1 else acc.no_sync(model):
                with acc.autocast():
                    images = sample_with_truncated_backprop(
                        adapter, model, embeds.index(idx), slots[idx].tolist(), sample_ids[idx].tolist(),
                        num_steps=cfg.sample.num_steps, guidance_scale=cfg.sample.guidance_scale, kernel=kernel,
                        backprop_steps=k, seed=cfg.train.seed, epoch=it, decode_chunk_size=cfg.sample.decode_chunk_size,
                    )
                chunk_prompts = [prompts[i] for i in idx.tolist()]
                total = torch.zeros(len(idx), device=acc.device)
                for name, reward in self.rewards.items():
                    r = reward.score(chunk_prompts, images).scores.to(acc.device)
                    rewards[name].append(r.detach())
                    sign = 1.0 if reward.higher_is_better else -1.0
                    total = total + weights[name] * sign * r
                # mean over the local batch; DDP averages over processes
                loss = -total.sum() / n
                acc.backward(loss)
            losses.append(float(loss.detach()))
            images_all.append(images.detach().cpu())
        grad_norm = policy.step()
        metrics: dict[str, float] = {"train/loss": sum(losses), "train/backprop_steps": float(k)}
        if grad_norm is not None:
            metrics["train/grad_norm"] = grad_norm
        samples.images = torch.cat(images_all)
        return metrics
