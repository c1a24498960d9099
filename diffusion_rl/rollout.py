"""Trajectories with log-probs from diffusers pipelines.

An *adapter* wraps one pipeline family and exposes the four things a policy-gradient method needs:
prompt embeddings (computed once per prompt and reused for every step and every update), the sampling
schedule, the denoiser's output at a batch of states (with classifier-free guidance when asked), and
decoding latents to images. `rollout` runs a kernel (`diffusion_rl.kernels`) over the schedule — SDE
on a chosen window of steps, deterministic elsewhere — and `step_log_prob` recomputes one step's
log-prob on the training path with exactly the same code, so the first PPO ratio is 1.

Supported: StableDiffusionPipeline (SD 1.x/2.x) and StableDiffusionXLPipeline (UNet + DDIM; the
pipeline's scheduler is converted to DDIM as DDPO does), StableDiffusion3Pipeline (SD3/SD3.5) and
FluxPipeline (flow matching, FlowMatchEulerDiscreteScheduler).

Noise is counter-based: the noise of sample i of prompt p at step t is drawn from a generator seeded by
a hash of (seed, epoch, p, i, t) — initial noise uses t = -1 — so the images do not depend on the number
of processes or the batch layout, and two samples of a group never share noise by accident.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from diffusion_rl.kernels import Kernel, StepResult, ddim_alphas
from mmreward.errors import DIFFUSION_EXTRA, CheckpointError, ConfigError, require_installed

# every rollout drives a diffusers pipeline: name the extra at import instead of failing deep inside a run
require_installed("diffusers", DIFFUSION_EXTRA, "diffusion_rl (reward fine-tuning of diffusers pipelines)")

# ----------------------------------------------------------------------------------------------
# counter-based noise
# ----------------------------------------------------------------------------------------------
_MASK64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def noise_key(*counters: int) -> int:
    """A 63-bit seed that depends on every counter (order matters); collisions are astronomically unlikely."""
    h = 0x6A09E667F3BCC909
    for c in counters:
        h = _splitmix64(h ^ (int(c) & _MASK64))
    return h >> 1


def counter_noise(
    shape: Sequence[int],
    seed: int,
    epoch: int,
    prompt_ids: Sequence[int],
    sample_ids: Sequence[int],
    step: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Standard normal noise of shape (B, *shape); row b depends only on (seed, epoch, prompt_ids[b], sample_ids[b], step)."""
    rows = []
    gen = torch.Generator(device="cpu")
    for p, i in zip(prompt_ids, sample_ids):
        gen.manual_seed(noise_key(seed, epoch, p, i, step))
        rows.append(torch.randn(tuple(shape), generator=gen))
    return torch.stack(rows).to(device)


# ----------------------------------------------------------------------------------------------
# prompt embeddings and schedules
# ----------------------------------------------------------------------------------------------
@dataclass
class PromptEmbeds:
    """Named conditioning tensors, batch first (what the denoiser needs besides x and t)."""

    tensors: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return int(next(iter(self.tensors.values())).shape[0])

    def index(self, idx: torch.Tensor | Sequence[int] | slice) -> PromptEmbeds:
        if not isinstance(idx, slice):
            idx = torch.as_tensor(idx, dtype=torch.long, device=next(iter(self.tensors.values())).device)
        return PromptEmbeds({k: v[idx] for k, v in self.tensors.items()})

    def repeat_interleave(self, n: int) -> PromptEmbeds:
        return PromptEmbeds({k: v.repeat_interleave(n, dim=0) for k, v in self.tensors.items()})

    def expand(self, n: int) -> PromptEmbeds:
        """A one-row embedding (e.g. the empty prompt) repeated to n rows."""
        return PromptEmbeds({k: v.expand(n, *v.shape[1:]) for k, v in self.tensors.items()})

    def to(self, device=None, dtype=None) -> PromptEmbeds:
        return PromptEmbeds({k: v.to(device=device, dtype=dtype if v.is_floating_point() else None)
                             for k, v in self.tensors.items()})

    @staticmethod
    def cat(parts: Sequence[PromptEmbeds]) -> PromptEmbeds:
        return PromptEmbeds({k: torch.cat([p.tensors[k] for p in parts]) for k in parts[0].tensors})


@dataclass
class Schedule:
    """Per-step values: `timesteps` as the denoiser sees them, and the kernel's (a, b) pair:
    (sigma, sigma_next) for flow models, (alpha_prod_t, alpha_prod_t_prev) for DDIM."""

    timesteps: torch.Tensor  # (T,)
    a: torch.Tensor  # (T,) float64
    b: torch.Tensor  # (T,) float64

    def __len__(self) -> int:
        return int(self.timesteps.shape[0])


# ----------------------------------------------------------------------------------------------
# adapters
# ----------------------------------------------------------------------------------------------
class PipelineAdapter:
    """Common interface of a diffusers pipeline family; see the module docstring."""

    family: str = ""
    is_flow: bool = True

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None) -> None:
        self.pipeline = pipeline
        default = self._default_size()
        self.height = int(height or default)
        self.width = int(width or default)
        multiple = self._size_multiple()
        if self.height % multiple or self.width % multiple:
            raise ConfigError(
                f"height/width must be multiples of {multiple} for {type(pipeline).__name__}, "
                f"got {self.height}x{self.width}"
            )
        self.max_sequence_length = max_sequence_length
        self._negative: PromptEmbeds | None = None

    # -- model access -------------------------------------------------------------------------
    @property
    def denoiser(self) -> torch.nn.Module:
        return getattr(self.pipeline, self._denoiser_attr)

    @denoiser.setter
    def denoiser(self, module: torch.nn.Module) -> None:
        setattr(self.pipeline, self._denoiser_attr, module)

    _denoiser_attr = "transformer"

    @property
    def device(self) -> torch.device:
        return next(self.denoiser.parameters()).device

    @property
    def model_dtype(self) -> torch.dtype:
        return next(self.denoiser.parameters()).dtype

    def _default_size(self) -> int:
        return int(self.denoiser.config.sample_size) * int(self.pipeline.vae_scale_factor)

    def _size_multiple(self) -> int:
        return int(self.pipeline.vae_scale_factor)

    # -- to implement ------------------------------------------------------------------------
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        raise NotImplementedError

    def latent_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def schedule(self, num_steps: int) -> Schedule:
        raise NotImplementedError

    def _forward(self, model, x, t, embeds: PromptEmbeds, guidance_scale: float) -> torch.Tensor:
        raise NotImplementedError

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------
    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0

    def negative(self) -> PromptEmbeds:
        """The empty-prompt embedding the pipelines use for CFG when no negative prompt is given."""
        if self._negative is None:
            self._negative = self.encode([""])
        return self._negative

    def predict(
        self, model: torch.nn.Module, x: torch.Tensor, t: torch.Tensor, embeds: PromptEmbeds, guidance_scale: float
    ) -> torch.Tensor:
        """Denoiser output at states x (B, ...) and per-item timesteps t (B,), with CFG as the pipeline does it."""
        x = x.to(self.model_dtype)
        if self.uses_cfg(guidance_scale):
            neg = self.negative().expand(len(embeds))
            both = PromptEmbeds.cat([neg, embeds])
            out = self._forward(model, torch.cat([x, x]), torch.cat([t, t]), both, guidance_scale)
            uncond, cond = out.float().chunk(2)
            return uncond + guidance_scale * (cond - uncond)
        return self._forward(model, x, t, embeds, guidance_scale).float()

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1], (B, 3, H, W), fp32."""
        vae = self.pipeline.vae
        images = self._decode_latents(latents.to(vae.dtype))
        return (images.float() / 2 + 0.5).clamp(0, 1)

    def initial_noise_scale(self) -> float:
        return 1.0


def _prompt_list(prompts: Sequence[str]) -> list[str]:
    if isinstance(prompts, str):
        return [prompts]
    return list(prompts)


class SD3Adapter(PipelineAdapter):
    family = "sd3"

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        kw = {"max_sequence_length": self.max_sequence_length} if self.max_sequence_length else {}
        pe, _, pooled, _ = self.pipeline.encode_prompt(
            prompt=_prompt_list(prompts), prompt_2=None, prompt_3=None, device=self.device,
            do_classifier_free_guidance=False, **kw,
        )
        return PromptEmbeds({"prompt_embeds": pe, "pooled_prompt_embeds": pooled})

    def latent_shape(self):
        vsf = self.pipeline.vae_scale_factor
        return (self.denoiser.config.in_channels, self.height // vsf, self.width // vsf)

    def _size_multiple(self) -> int:
        return int(self.pipeline.vae_scale_factor) * int(self.denoiser.config.patch_size)

    def schedule(self, num_steps: int) -> Schedule:
        sched = self.pipeline.scheduler
        kw = {}
        if sched.config.get("use_dynamic_shifting", False):
            from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

            seq = (self.height // self.pipeline.vae_scale_factor // self.denoiser.config.patch_size) * (
                self.width // self.pipeline.vae_scale_factor // self.denoiser.config.patch_size)
            kw["mu"] = calculate_shift(seq, sched.config.get("base_image_seq_len", 256),
                                       sched.config.get("max_image_seq_len", 4096),
                                       sched.config.get("base_shift", 0.5), sched.config.get("max_shift", 1.16))
        sched.set_timesteps(num_steps, **kw)
        return _flow_schedule(sched)

    def _forward(self, model, x, t, embeds, guidance_scale):
        return model(hidden_states=x, timestep=t.to(x.dtype), encoder_hidden_states=embeds.tensors["prompt_embeds"],
                     pooled_projections=embeds.tensors["pooled_prompt_embeds"], return_dict=False)[0]

    def _decode_latents(self, latents):
        vae = self.pipeline.vae
        latents = latents / vae.config.scaling_factor + vae.config.shift_factor
        return vae.decode(latents, return_dict=False)[0]


def _flow_schedule(sched) -> Schedule:
    sigmas = sched.sigmas.to(torch.float64).cpu()
    return Schedule(sched.timesteps.clone().cpu(), sigmas[:-1].clone(), sigmas[1:].clone())


class FluxAdapter(PipelineAdapter):
    """FLUX.1: packed 2x2 latent patches; guidance-distilled checkpoints take the guidance scale as an
    input (no CFG), others get true CFG with the empty prompt when guidance_scale > 1."""

    family = "flux"

    def _default_size(self) -> int:
        return 128 * int(self.pipeline.vae_scale_factor)  # the pipeline's default_sample_size

    def _size_multiple(self) -> int:
        return int(self.pipeline.vae_scale_factor) * 2

    @property
    def guidance_embeds(self) -> bool:
        return bool(getattr(self.denoiser.config, "guidance_embeds", False))

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0 and not self.guidance_embeds

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        kw = {"max_sequence_length": self.max_sequence_length} if self.max_sequence_length else {}
        pe, pooled, _ = self.pipeline.encode_prompt(prompt=_prompt_list(prompts), prompt_2=None, device=self.device, **kw)
        return PromptEmbeds({"prompt_embeds": pe, "pooled_prompt_embeds": pooled})

    def _latent_hw(self) -> tuple[int, int]:
        vsf = self.pipeline.vae_scale_factor
        return 2 * (self.height // (vsf * 2)), 2 * (self.width // (vsf * 2))

    def latent_shape(self):
        h, w = self._latent_hw()
        c = self.denoiser.config.in_channels // 4
        return ((h // 2) * (w // 2), c * 4)

    def schedule(self, num_steps: int) -> Schedule:
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        sched = self.pipeline.scheduler
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        mu = calculate_shift(self.latent_shape()[0], sched.config.get("base_image_seq_len", 256),
                             sched.config.get("max_image_seq_len", 4096), sched.config.get("base_shift", 0.5),
                             sched.config.get("max_shift", 1.15))
        sched.set_timesteps(sigmas=sigmas, mu=mu)
        return _flow_schedule(sched)

    def _forward(self, model, x, t, embeds, guidance_scale):
        h, w = self._latent_hw()
        img_ids = self.pipeline._prepare_latent_image_ids(x.shape[0], h // 2, w // 2, x.device, x.dtype)
        pe = embeds.tensors["prompt_embeds"]
        txt_ids = torch.zeros(pe.shape[1], 3, device=x.device, dtype=x.dtype)
        guidance = None
        if self.guidance_embeds:
            guidance = torch.full((x.shape[0],), float(guidance_scale), device=x.device, dtype=torch.float32)
        return model(hidden_states=x, timestep=t.to(x.dtype) / 1000, guidance=guidance,
                     pooled_projections=embeds.tensors["pooled_prompt_embeds"], encoder_hidden_states=pe,
                     txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]

    def _decode_latents(self, latents):
        vae = self.pipeline.vae
        latents = self.pipeline._unpack_latents(latents, self.height, self.width, self.pipeline.vae_scale_factor)
        latents = latents / vae.config.scaling_factor + vae.config.shift_factor
        return vae.decode(latents, return_dict=False)[0]


class SDAdapter(PipelineAdapter):
    """SD 1.x/2.x: UNet + DDIM (any scheduler of the pipeline is replaced by DDIM from its config)."""

    family = "sd"
    is_flow = False
    _denoiser_attr = "unet"

    def __init__(self, pipeline, height=None, width=None, max_sequence_length=None) -> None:
        from diffusers import DDIMScheduler

        if not isinstance(pipeline.scheduler, DDIMScheduler):
            pipeline.scheduler = DDIMScheduler.from_config(pipeline.scheduler.config)
        super().__init__(pipeline, height, width, max_sequence_length)

    @property
    def prediction_type(self) -> str:
        return self.pipeline.scheduler.config.prediction_type

    @property
    def clip_sample_range(self) -> float | None:
        cfg = self.pipeline.scheduler.config
        return float(cfg.clip_sample_range) if cfg.clip_sample else None

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        pe, _ = self.pipeline.encode_prompt(_prompt_list(prompts), self.device, 1, False)
        return PromptEmbeds({"prompt_embeds": pe})

    def latent_shape(self):
        vsf = self.pipeline.vae_scale_factor
        return (self.denoiser.config.in_channels, self.height // vsf, self.width // vsf)

    def schedule(self, num_steps: int) -> Schedule:
        sched = self.pipeline.scheduler
        sched.set_timesteps(num_steps)
        a_t, a_prev = ddim_alphas(sched, sched.timesteps)
        return Schedule(sched.timesteps.clone().cpu(), a_t, a_prev)

    def initial_noise_scale(self) -> float:
        return float(self.pipeline.scheduler.init_noise_sigma)

    def _unet_kwargs(self, x, embeds) -> dict:
        return {}

    def _forward(self, model, x, t, embeds, guidance_scale):
        # DDIM's scale_model_input is the identity, so the latents go in as they are
        return model(x, t, encoder_hidden_states=embeds.tensors["prompt_embeds"],
                     return_dict=False, **self._unet_kwargs(x, embeds))[0]

    def _decode_latents(self, latents):
        vae = self.pipeline.vae
        return vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]


class SDXLAdapter(SDAdapter):
    """SDXL: two text encoders, pooled embeddings and size conditioning (original = target = our size, no crop)."""

    family = "sdxl"

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        pe, _, pooled, _ = self.pipeline.encode_prompt(prompt=_prompt_list(prompts), device=self.device,
                                                       num_images_per_prompt=1, do_classifier_free_guidance=False)
        return PromptEmbeds({"prompt_embeds": pe, "pooled_prompt_embeds": pooled})

    def negative(self) -> PromptEmbeds:
        if self._negative is None:
            neg = self.encode([""])
            if self.pipeline.config.get("force_zeros_for_empty_prompt", False):
                neg = PromptEmbeds({k: torch.zeros_like(v) for k, v in neg.tensors.items()})
            self._negative = neg
        return self._negative

    def _unet_kwargs(self, x, embeds):
        proj = self.pipeline.text_encoder_2.config.projection_dim
        size = (self.height, self.width)
        ids = self.pipeline._get_add_time_ids(size, (0, 0), size, dtype=x.dtype, text_encoder_projection_dim=proj)
        return {"added_cond_kwargs": {"text_embeds": embeds.tensors["pooled_prompt_embeds"],
                                      "time_ids": ids.to(x.device).expand(x.shape[0], -1)}}


def make_adapter(pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None) -> PipelineAdapter:
    """The adapter for a diffusers pipeline instance (by class, so subclasses work too)."""
    from diffusers import (
        FluxPipeline,
        StableDiffusion3Pipeline,
        StableDiffusionPipeline,
        StableDiffusionXLPipeline,
    )

    for cls, adapter in ((StableDiffusion3Pipeline, SD3Adapter), (FluxPipeline, FluxAdapter),
                         (StableDiffusionXLPipeline, SDXLAdapter), (StableDiffusionPipeline, SDAdapter)):
        if isinstance(pipeline, cls):
            return adapter(pipeline, height, width, max_sequence_length)
    raise ConfigError(
        f"pipeline: expected a StableDiffusionPipeline, StableDiffusionXLPipeline, StableDiffusion3Pipeline or "
        f"FluxPipeline, got {type(pipeline).__name__}. Load one with DiffusionPipeline.from_pretrained(...)"
    )


def pipeline_from_pretrained(source: str, what: str = "model.pretrained", **kwargs):
    """`DiffusionPipeline.from_pretrained` with a typed error that names the setting (`what`) and the fix
    when the source is empty, missing, not a pipeline folder, or not cached offline."""
    import os
    from pathlib import Path

    from diffusers import DiffusionPipeline

    source = str(source).strip()
    if not source:
        raise ConfigError(f"{what} is empty: set it to a diffusers pipeline folder (with model_index.json) or a hub id")
    local = Path(source).expanduser()
    looks_local = local.is_absolute() or source.startswith(".") or os.sep in source.strip("/").split("/", 1)[-1]
    if local.is_dir() and not (local / "model_index.json").is_file():
        raise CheckpointError(f"{what}: {source!r} has no model_index.json, so it is not a diffusers pipeline folder; "
                              "give the folder written by pipeline.save_pretrained(...)")
    if not local.exists() and looks_local:
        raise CheckpointError(f"{what}: {source!r} does not exist; give a diffusers pipeline folder or a hub id")
    try:
        return DiffusionPipeline.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:  # hub ids not cached offline, bad repo ids, missing component files
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{what}: cannot load a diffusers pipeline from {source!r} ({reason}); give a local "
                              "pipeline folder, or a hub id that is in the local cache when offline") from exc


def load_pipeline(pretrained: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                  attention: str = "auto"):
    """A diffusers pipeline from a local folder or hub id (official layout), frozen, on `device`, with every
    attention module running the `attention` choice (see `mmreward.attention`)."""
    from mmreward.attention import apply_to_pipeline, check_choice

    check_choice(attention, "model.attention")  # before the (slow) load
    pipe = pipeline_from_pretrained(pretrained, dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    for name in ("vae", "text_encoder", "text_encoder_2", "text_encoder_3", "unet", "transformer"):
        module = getattr(pipe, name, None)
        if isinstance(module, torch.nn.Module):
            module.requires_grad_(False)
    pipe = pipe.to(device)
    apply_to_pipeline(pipe, attention)
    return pipe


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
def rollout(
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
) -> Trajectory:
    """Sample one trajectory per row of `embeds`.

    `prompt_ids`/`sample_ids` are the counters of the noise (see module docstring); with
    `share_initial_noise` every sample of a prompt starts from the same x_T (sample id 0), as DanceGRPO's
    `init_same_noise`, while the per-step SDE noise stays distinct. `model` defaults to the pipeline's
    denoiser (pass the wrapped training model to sample from the current policy).
    """
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
    x = counter_noise(shape, seed, epoch, pids, init_ids, -1, device).to(kernel.dtype) * adapter.initial_noise_scale()
    latents, log_probs, means = [x], [], []
    steps = range(num_steps)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="rollout", leave=False)
    for j in steps:
        t = schedule.timesteps[j].to(device).expand(len(pids))
        out = adapter.predict(model, x, t, embeds, guidance_scale)
        k = kernel if mask[j] else deterministic
        noise = counter_noise(shape, seed, epoch, pids, sids, j, device) if mask[j] else None
        # per-item schedule values, exactly as `step_log_prob` passes them, so both paths round alike
        a = schedule.a[j].expand(len(pids)).to(device)
        b = schedule.b[j].expand(len(pids)).to(device)
        res = k.step(x, out, a, b, noise=noise)
        x = res.prev_sample
        latents.append(x)
        log_probs.append(res.log_prob)
        if store_means:
            means.append(res.mean)
    traj = Trajectory(
        latents=torch.stack(latents, dim=1), log_probs=torch.stack(log_probs, dim=1), sde_mask=mask,
        schedule=schedule, embeds=embeds, prompt_ids=torch.tensor(pids), sample_ids=torch.tensor(sids),
        means=torch.stack(means, dim=1) if store_means else None,
    )
    if decode:
        traj.images = adapter.decode(x)
    return traj
