"""ReFL (Xu et al., 2023, "ImageReward: Learning and Evaluating Human Preferences for Text-to-Image
Generation", Algorithm 1): reward feedback on a one-step prediction of the clean image at a random late step.

DRaFT backpropagates through the sampler's last K steps; ReFL observes that by a late step the model's own
clean estimate already shows what the final image will be, so it takes gradient through a single denoiser call:

    j ~ U{j_lo, ..., j_hi}                               (ReFL.py: randint(30, 39) of 40 DDPM steps)
    x_T ~ N(0, I);  x_{t-1} = step(x_t, eps_theta(x_t, t))  for the steps before j, without grad
    x0_hat = x0(x_j, f_theta(x_j, t_j))                  one call with grad (closed forms in `predict_x0`)
    loss = lambda * phi(margin - r(decode(x0_hat)))      phi = ReLU, margin 2, lambda 1e-3 (ReFL.py)

Reference read: THUDM/ImageReward@1beb4e4de0932acbe7fc090c51208048b6269b58 ImageReward/ReFL.py (`Trainer.train`:
no-grad loop over `timesteps[:mid_timestep]`, one UNet call with grad, `pred_original_sample` decoded by the VAE,
`loss = F.relu(-rewards + 2).mean() * args.grad_scale`; lr 1e-5, weight decay 1e-2, grad-norm 1).

What we simplify or change: the sampler is the run's kernel (ODE / DDIM, as DRaFT; ReFL.py steps a DDPM scheduler);
the grad step's denoiser sees the timestep t_j of its state (ReFL.py passes the integer index `mid_timestep` as the
UNet timestep and reads `pred_original_sample` with the previous loop's `t`, which we take for an oversight);
several rewards are combined as a weighted, signed sum before phi, as in DRaFT; the step j is drawn per iteration
from a counter-based generator (the same j on every process, and on resume) instead of Python's `random`, and the
range is given as fractions of the schedule so that it carries over to other step counts. The rewards logged are
those of the one-step predictions, not of fully sampled images.

`refl.mode: direct_align` is Direct-Align (Shen et al., 2025, "Directly Aligning the Full Diffusion Trajectory with
Fine-Grained Human Preference", SRPO), flow models only. The image is first sampled in full without grad from x_T,
then re-noised with that same x_T to the drawn step's sigma and recovered with the noise known:

    x_s = sigma x_T + (1 - sigma) x0;  x_next = x_s + (sigma_next - sigma) v_theta(x_s);
    x0_hat = (x_next - sigma_next x_T) / (1 - sigma_next)          (`direct_align_x0`)

Reference read: Tencent-Hunyuan/SRPO@69e8e817c3afd8e849827a97b8b7e612c3f60726 fastvideo/SRPO_Qwen.py (`SRPO_train`,
"Direct-Align step 1-3", the online branch where the injected noise is the sampling's initial latent). Not done:
its offline branch (re-noising dataset images), the semantic-relative-preference reward with control words (any
differentiable reward of the run is used), the reward discount by a time-shifted linspace, the k-step gap between
the noised and the base sigma (one schedule step here) and its norm-rescaled CFG.

`ReFL` subclasses `DRaFT` for its reward checks and its stages: as in DRaFT, sampling, reward and loss are one graph
per micro-batch, so the rollout stage hands the inputs on and `update` does the fused work
(`diffusion_rl.algorithms.base`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch

from diffusion_rl.algorithms.base import Run
from diffusion_rl.algorithms.draft import DRaFT, RewardBackpropSamples
from diffusion_rl.kernels import Kernel, PredictionType
from diffusion_rl.pipelines import PipelineAdapter, PromptEmbeds, Schedule, decode_chunked
from diffusion_rl.rollout import kernel_for
from diffusion_rl.seeding import counter_noise, noise_key
from mmreward.errors import ConfigError

REFL_STEP_DRAW = -8  # the last counter of the seed of ReFL's grad step


def grad_step_range(step_range: Sequence[float], num_steps: int) -> tuple[int, int]:
    """The inclusive step indices [floor(lo T), ceil(hi T) - 1] the grad step is drawn from (at least one)."""
    lo, hi = float(step_range[0]), float(step_range[1])
    if not 0 <= lo < hi <= 1:
        raise ConfigError(f"refl.step_range must be [lo, hi] with 0 <= lo < hi <= 1, got {list(step_range)}")
    first = min(math.floor(lo * num_steps), num_steps - 1)
    last = max(first, math.ceil(hi * num_steps) - 1)
    return first, min(last, num_steps - 1)


def draw_grad_step(step_range: Sequence[float], num_steps: int, seed: int, iteration: int) -> int:
    """The step index j of this iteration, uniform over `grad_step_range`, counter-based (every process draws the
    same j, and a resumed run the same as an uninterrupted one)."""
    first, last = grad_step_range(step_range, num_steps)
    gen = torch.Generator().manual_seed(noise_key(seed, iteration, REFL_STEP_DRAW))
    return int(torch.randint(first, last + 1, (1,), generator=gen))


def _per_item(v: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """A scalar or (B,) schedule value broadcastable against `ref` (B, ...)."""
    v = torch.as_tensor(v, dtype=ref.dtype, device=ref.device)
    return v.view(-1, *([1] * (ref.ndim - 1))) if v.ndim == 1 else v


def predict_x0(x: torch.Tensor, model_output: torch.Tensor, a_t: torch.Tensor | float, *, is_flow: bool,
               prediction_type: PredictionType = "epsilon", clip_sample_range: float | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The model's clean estimate at state x, in fp32: `a_t` is sigma_t for flows (x_t = (1 - sigma) x0 + sigma
    x1, v = x1 - x0, so x0 = x_t - sigma_t v) and alpha_prod_t for DDIM-style models (x_t = sqrt(a) x0 +
    sqrt(1 - a) eps: x0 = (x_t - sqrt(1 - a_t) eps) / sqrt(a_t), or sqrt(a_t) x_t - sqrt(1 - a_t) v for
    v-prediction), clipped as the scheduler clips `pred_original_sample`."""
    x, out = x.to(dtype), model_output.to(dtype)
    a = _per_item(a_t, x)
    if is_flow:
        return x - a * out
    if prediction_type == "epsilon":
        x0 = (x - (1 - a).sqrt() * out) / a.sqrt()
    elif prediction_type == "v_prediction":
        x0 = a.sqrt() * x - (1 - a).sqrt() * out
    elif prediction_type == "sample":
        x0 = out
    else:
        raise ConfigError(f"prediction_type must be 'epsilon', 'v_prediction' or 'sample', got {prediction_type!r}")
    return x0.clamp(-clip_sample_range, clip_sample_range) if clip_sample_range is not None else x0


def refl_loss(reward: torch.Tensor, *, margin: float, scale: float, phi: str = "relu") -> torch.Tensor:
    """Per-sample lambda * phi(margin - r): ReFL.py's `F.relu(-rewards + 2) * grad_scale` for phi='relu'."""
    if phi == "relu":
        return scale * torch.relu(margin - reward)
    if phi == "identity":
        return scale * (margin - reward)
    raise ConfigError(f"refl_loss must be 'relu' or 'identity', got {phi!r}")


def direct_align_x0(x_noisy: torch.Tensor, v: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor | float,
                    sigma_next: torch.Tensor | float) -> torch.Tensor:
    """SRPO's Direct-Align recovery from x_noisy = sigma noise + (1 - sigma) x0 with the noise known: one Euler step
    x_next = x_noisy + (sigma_next - sigma) v, then x0_hat = (x_next - sigma_next noise) / (1 - sigma_next)
    (Tencent-Hunyuan/SRPO SRPO_Qwen.py, "Direct-Align step 2/3"). A perfect v = noise - x0 gives x0 exactly."""
    x_noisy, v, noise = x_noisy.float(), v.float(), noise.float()
    s, s_next = _per_item(sigma, x_noisy), _per_item(sigma_next, x_noisy)
    if bool((s_next >= 1).any()):
        raise ConfigError("direct_align: the step's next sigma must be below 1 to recover x0 (pick a later step)")
    x_next = x_noisy + (s_next - s) * v
    return (x_next - s_next * noise) / (1 - s_next)


def _sample_without_grad(adapter: PipelineAdapter, model: torch.nn.Module, x: torch.Tensor, embeds: PromptEmbeds,
                         pids: list[int], sids: list[int], steps: int, *, schedule: Schedule, guidance_scale: float,
                         kernel: Kernel, seed: int, epoch: int) -> torch.Tensor:
    """The first `steps` sampling steps on the rollout's counter-based noise, detached: no gradient reaches them."""
    shape, device, n = adapter.latent_shape(), adapter.device, len(pids)
    with torch.no_grad():
        for j in range(steps):
            t = schedule.timesteps[j].to(device).expand(n)
            noise = counter_noise(shape, seed, epoch, pids, sids, j, device) if kernel.noise_level > 0 else None
            out = adapter.predict(model, x, t, embeds, guidance_scale)
            x = kernel.step(x, out, schedule.a[j].expand(n).to(device), schedule.b[j].expand(n).to(device),
                            noise=noise).prev_sample
    return x.detach()


def sample_one_step_x0(
    adapter: PipelineAdapter,
    model: torch.nn.Module,
    embeds: PromptEmbeds,
    prompt_ids: Sequence[int],
    sample_ids: Sequence[int],
    *,
    num_steps: int,
    guidance_scale: float,
    kernel: Kernel,
    grad_step: int,
    seed: int,
    epoch: int,
    decode_chunk_size: int | None = None,
) -> torch.Tensor:
    """Decoded one-step predictions x0_hat(x_j) whose graph reaches `model` only through the call at step j.

    Steps 0..j-1 run without grad on the rollout's counter-based noise (the same x_j `rollout` would reach)."""
    if not 0 <= grad_step < num_steps:
        raise ConfigError(f"grad_step must be in [0, num_steps={num_steps}), got {grad_step}")
    kernel = kernel_for(adapter, kernel)
    pids, sids = list(prompt_ids), list(sample_ids)
    device, n = adapter.device, len(pids)
    schedule = adapter.schedule(num_steps)
    x_T = counter_noise(adapter.latent_shape(), seed, epoch, pids, sids, -1, device).to(kernel.dtype)
    x = _sample_without_grad(adapter, model, x_T * adapter.initial_noise_scale(), embeds, pids, sids, grad_step,
                             schedule=schedule, guidance_scale=guidance_scale, kernel=kernel, seed=seed, epoch=epoch)
    t = schedule.timesteps[grad_step].to(device).expand(n)
    out = adapter.predict(model, x, t, embeds, guidance_scale)
    x0_hat = predict_x0(x, out, schedule.a[grad_step].expand(n).to(device), is_flow=adapter.is_flow,
                        prediction_type=kernel.prediction_type, clip_sample_range=kernel.clip_sample_range,
                        dtype=kernel.dtype)
    return decode_chunked(adapter, x0_hat, decode_chunk_size, keep_graph=True)


def sample_direct_align(
    adapter: PipelineAdapter,
    model: torch.nn.Module,
    embeds: PromptEmbeds,
    prompt_ids: Sequence[int],
    sample_ids: Sequence[int],
    *,
    num_steps: int,
    guidance_scale: float,
    kernel: Kernel,
    grad_step: int,
    seed: int,
    epoch: int,
    decode_chunk_size: int | None = None,
) -> torch.Tensor:
    """SRPO's online Direct-Align: sample x0 without grad from x_T, re-noise it with the same x_T to sigma_j,
    take one Euler step with grad to sigma_{j+1} and recover x0 with the known noise (`direct_align_x0`)."""
    if not adapter.is_flow:
        raise ConfigError(f"refl.mode 'direct_align' interpolates noise and image on the flow path; the "
                          f"{adapter.family} pipeline is not a flow model: use refl.mode 'refl'")
    if not 0 <= grad_step < num_steps:
        raise ConfigError(f"grad_step must be in [0, num_steps={num_steps}), got {grad_step}")
    kernel = kernel_for(adapter, kernel)
    pids, sids = list(prompt_ids), list(sample_ids)
    device, n = adapter.device, len(pids)
    schedule = adapter.schedule(num_steps)
    x_T = counter_noise(adapter.latent_shape(), seed, epoch, pids, sids, -1, device).to(kernel.dtype)
    x0 = _sample_without_grad(adapter, model, x_T, embeds, pids, sids, num_steps, schedule=schedule,
                              guidance_scale=guidance_scale, kernel=kernel, seed=seed, epoch=epoch)
    sigma = schedule.a[grad_step].to(device, torch.float32)
    x_noisy = sigma * x_T + (1 - sigma) * x0  # detached: the graph starts at the one step below
    t = schedule.timesteps[grad_step].to(device).expand(n)
    v = adapter.predict(model, x_noisy, t, embeds, guidance_scale)
    x0_hat = direct_align_x0(x_noisy, v, x_T, sigma, schedule.b[grad_step].to(device, torch.float32))
    return decode_chunked(adapter, x0_hat, decode_chunk_size, keep_graph=True)


class ReFL(DRaFT):
    """Reward feedback learning (see the module docstring): DRaFT's stages (the rollout hands the inputs on,
    the report gathers the rewards), with `update` sampling one-step predictions x0_hat per micro-batch."""

    name = "refl"

    def update(self, samples: RewardBackpropSamples, run: Run) -> dict[str, float]:
        """Per micro-batch: x0_hat with grad through step j, score, backward; then one optimizer step. The
        (detached) x0_hat images go on `samples.images`."""
        it, prompts, embeds, slots, sample_ids = (samples.inputs.it, samples.inputs.prompts, samples.inputs.embeds,
                                                  samples.inputs.slots, samples.inputs.sample_ids)
        policy, adapter, kernel = run.policy, run.adapter, run.kernel
        cfg, acc, model = self.cfg, policy.accelerator, policy.model
        tc = cfg.train
        j = draw_grad_step(cfg.refl.step_range, cfg.sample.num_steps, tc.seed, it)
        weights = cfg.reward.rewards
        model.train()
        n = len(prompts)
        chunks = list(torch.split(torch.arange(n), tc.micro_batch_size))
        rewards: dict[str, list[torch.Tensor]] = {name: [] for name in self.rewards}
        samples.rewards = rewards
        losses, images_all = [], []
        for c, idx in enumerate(chunks):
            # gradients are averaged over processes once, on the last micro-batch
            with contextlib.nullcontext() if c == len(chunks) - 1 else acc.no_sync(model):
                with acc.autocast():
                    sampler = sample_direct_align if cfg.refl.mode == "direct_align" else sample_one_step_x0
                    images = sampler(
                        adapter, model, embeds.index(idx), slots[idx].tolist(), sample_ids[idx].tolist(),
                        num_steps=cfg.sample.num_steps, guidance_scale=cfg.sample.guidance_scale, kernel=kernel,
                        grad_step=j, seed=tc.seed, epoch=it, decode_chunk_size=cfg.sample.decode_chunk_size)
                chunk_prompts = [prompts[i] for i in idx.tolist()]
                total = torch.zeros(len(idx), device=acc.device)
                for name, reward in self.rewards.items():
                    r = reward.score(chunk_prompts, images).scores.to(acc.device)
                    rewards[name].append(r.detach())
                    total = total + weights[name] * (1.0 if reward.higher_is_better else -1.0) * r
                # mean over the local batch (ReFL.py: loss.mean()); DDP averages over processes
                loss = refl_loss(total, margin=cfg.refl.margin, scale=cfg.refl.scale, phi=cfg.refl.loss).sum() / n
                acc.backward(loss)
            losses.append(float(loss.detach()))
            images_all.append(images.detach().cpu())
        grad_norm = policy.step()
        metrics: dict[str, float] = {"train/loss": sum(losses), "train/grad_step": float(j)}
        if grad_norm is not None:
            metrics["train/grad_norm"] = grad_norm
        samples.images = torch.cat(images_all)
        return metrics
