"""Diffusers pipelines seen through one interface: prompt embeddings, sampling schedules and adapters.

An *adapter* wraps one pipeline family and exposes the four things a policy-gradient method needs:
prompt embeddings (computed once per prompt and reused for every step and every update), the sampling
schedule, the denoiser's output at a batch of states (with classifier-free guidance when asked), and
decoding latents to images.

Supported: StableDiffusionPipeline (SD 1.x/2.x) and StableDiffusionXLPipeline (UNet + DDIM; the
pipeline's scheduler is converted to DDIM as DDPO does), StableDiffusion3Pipeline (SD3/SD3.5) and
FluxPipeline (flow matching, FlowMatchEulerDiscreteScheduler), and for video WanPipeline (Wan 2.1 / 2.2 TI2V,
flow matching on (C, T', H', W') latents; see `WanAdapter`), CogVideoXPipeline and LTXPipeline (in
`diffusion_rl.video_adapters`, same latent convention). `pipeline_family` is the one place that
tells the families apart; the inference code (`diffusion_rl.inference`) uses it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from diffusion_rl.adapter_base import (  # noqa: F401 - the shared pieces, re-exported for callers
    DTYPES,
    PipelineAdapter,
    PromptEmbeds,
    Schedule,
    _flow_schedule,
    _prompt_list,
    decode_chunked,
)
from diffusion_rl.kernels import ddim_alphas
from mmreward.errors import CheckpointError, ConfigError


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
    denoiser_attr = "unet"

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


# ----------------------------------------------------------------------------------------------
# video: Wan
# ----------------------------------------------------------------------------------------------
# Video pipelines behind the same adapter interface: Wan 2.1 / 2.2 (diffusers' `WanPipeline`).
#
# Latents are (C, T', H', W') per sample with T' = (T - 1) / 4 + 1 and H' = H / 8 for Wan's VAE, so the
# rollout, the kernels and the log-probs (mean over every latent element, as for images) run unchanged on
# (B, C, T', H', W') tensors. What differs from the image families:
#
# - prompts go through the pipeline's own `encode_prompt` (UMT5, padded to `max_sequence_length` with zeros
#   after each prompt's length, as WanPipeline does), CFG uses the empty prompt like WanPipeline's default;
# - the denoiser is called as WanPipeline calls it: `hidden_states`, `timestep` (the scheduler's 0..1000
#   scale; one per token when the pipeline has `expand_timesteps`, as Wan 2.2 TI2V), `encoder_hidden_states`;
# - the schedule: the official pipeline samples with UniPC; rollouts use the flow-matching Euler sigmas of
#   `FlowMatchEulerDiscreteScheduler` with the pipeline's `flow_shift`, so the Flow-SDE / Dance-SDE kernels
#   and their log-probs apply (the ODE path is then exactly WanPipeline run with that Euler scheduler);
# - decoding un-normalises with the VAE's per-channel `latents_mean` / `latents_std` and returns videos
#   (B, T, 3, H, W) in [0, 1], the layout video rewards take.
#
# Wan 2.2 A14B's two-expert denoising (`transformer_2` with `boundary_ratio`) is not supported yet: the policy
# trains one denoiser, so such a pipeline is refused with a ConfigError.
WAN_DEFAULT_HEIGHT, WAN_DEFAULT_WIDTH, WAN_DEFAULT_FRAMES = 480, 832, 81  # WanPipeline.__call__'s defaults
WAN_MAX_SEQUENCE_LENGTH = 226  # WanPipeline.encode_prompt's default


class WanAdapter(PipelineAdapter):
    """diffusers' WanPipeline (Wan 2.1 T2V, Wan 2.2 TI2V-5B): flow matching on 5-D video latents."""

    family = "wan"
    is_flow = True
    modality = "video"
    fps = 16.0  # WanPipeline's examples export at 16 fps (Wan 2.1); Wan 2.2 TI2V-5B at 24: set adapter.fps

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None) -> None:
        if getattr(pipeline, "transformer", None) is None or getattr(pipeline, "transformer_2", None) is not None:
            raise ConfigError(
                f"{type(pipeline).__name__}: two-expert Wan 2.2 pipelines (transformer + transformer_2 with a "
                "boundary_ratio) are not supported for reward fine-tuning yet; use a single-transformer Wan "
                "checkpoint (Wan 2.1 T2V or Wan 2.2 TI2V-5B)"
            )
        self.pipeline = pipeline
        self.height = int(height or WAN_DEFAULT_HEIGHT)
        self.width = int(width or WAN_DEFAULT_WIDTH)
        self.num_frames = int(num_frames or WAN_DEFAULT_FRAMES)
        multiple = self._size_multiple()
        if self.height % multiple or self.width % multiple or self.height <= 0 or self.width <= 0:
            raise ConfigError(
                f"height/width must be positive multiples of {multiple} for {type(pipeline).__name__} (the VAE's "
                f"spatial factor {self._spatial} x the patch size), got {self.height}x{self.width}; e.g. "
                f"{max(multiple, self.height // multiple * multiple)}x{max(multiple, self.width // multiple * multiple)}"
            )
        temporal = self._temporal
        if self.num_frames < 1 or (self.num_frames - 1) % temporal:
            lower = max(1, (self.num_frames - 1) // temporal * temporal + 1)
            raise ConfigError(
                f"num_frames={self.num_frames} cannot be made by {type(pipeline).__name__}: its VAE compresses time "
                f"by {temporal}, so num_frames - 1 must be a multiple of {temporal} (e.g. {lower} or {lower + temporal})"
            )
        self.max_sequence_length = max_sequence_length
        self._negative: PromptEmbeds | None = None
        self._euler = None

    # -- geometry -----------------------------------------------------------------------------
    @property
    def _spatial(self) -> int:
        return int(self.pipeline.vae_scale_factor_spatial)

    @property
    def _temporal(self) -> int:
        return int(self.pipeline.vae_scale_factor_temporal)

    def _size_multiple(self) -> int:
        return self._spatial * int(self.denoiser.config.patch_size[1])

    def latent_shape(self) -> tuple[int, ...]:
        frames = (self.num_frames - 1) // self._temporal + 1
        return (int(self.denoiser.config.in_channels), frames, self.height // self._spatial, self.width // self._spatial)

    # -- conditioning -------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        pe, _ = self.pipeline.encode_prompt(
            prompt=_prompt_list(prompts), do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length or WAN_MAX_SEQUENCE_LENGTH,
        )
        return PromptEmbeds({"prompt_embeds": pe})

    def schedule(self, num_steps: int) -> Schedule:
        from diffusers import FlowMatchEulerDiscreteScheduler

        sched = self.pipeline.scheduler
        if not isinstance(sched, FlowMatchEulerDiscreteScheduler):
            # UniPC (the official sampler) keeps its shift as `flow_shift`; the Euler sigmas use the same shift
            if self._euler is None:
                shift = float(sched.config.get("flow_shift", None) or sched.config.get("shift", 1.0) or 1.0)
                self._euler = FlowMatchEulerDiscreteScheduler(
                    num_train_timesteps=int(sched.config.get("num_train_timesteps", 1000)), shift=shift)
            sched = self._euler
        sched.set_timesteps(num_steps)
        return _flow_schedule(sched)

    def _forward(self, model, x, t, embeds, guidance_scale):
        timestep = t.to(x.dtype)
        if self.pipeline.config.get("expand_timesteps", False):
            # Wan 2.2 TI2V: one timestep per latent token (frames x H'/2 x W'/2); all equal for text-to-video
            tokens = x.shape[2] * (x.shape[3] // 2) * (x.shape[4] // 2)
            timestep = timestep[:, None].expand(-1, tokens)
        return model(hidden_states=x, timestep=timestep, encoder_hidden_states=embeds.tensors["prompt_embeds"],
                     return_dict=False)[0]

    # -- decoding -----------------------------------------------------------------------------
    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        z = int(vae.config.z_dim)
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        video = vae.decode(latents * std + mean, return_dict=False)[0]  # (B, 3, T, H, W) in [-1, 1]
        return video.permute(0, 2, 1, 3, 4)  # (B, T, 3, H, W): the layout of video rewards

    def decode(self, latents: torch.Tensor, *, keep_graph: bool = False) -> torch.Tensor:
        """Videos in [0, 1], (B, T, 3, H, W), fp32 (see PipelineAdapter.decode)."""
        if latents.ndim != 5:
            raise ConfigError(f"latents: expected (B, C, T', H', W') video latents, got shape {tuple(latents.shape)}")
        return super().decode(latents, keep_graph=keep_graph)


# ----------------------------------------------------------------------------------------------
# video: HunyuanVideo
# ----------------------------------------------------------------------------------------------
# diffusers' `HunyuanVideoPipeline` (hunyuanvideo-community/HunyuanVideo), DanceGRPO's headline video model.
# Same latent geometry as Wan ((C, T', H', W') with T' = (T - 1) / 4 + 1, H' = H / 8), so it reuses WanAdapter's
# checks and shapes; what differs:
#
# - two text encoders through the pipeline's own `encode_prompt`: the Llama encoder's third-to-last hidden
#   states under the pipeline's prompt template (DEFAULT_PROMPT_TEMPLATE, the template cropped off at
#   `crop_start`), its attention mask (the transformer attends to the prompt's real tokens only), and CLIP's
#   pooled output;
# - the checkpoint is guidance-distilled like FLUX.1-dev: `guidance_scale` is an input of the transformer
#   (embedded as guidance_scale x 1000, as the pipeline does), one forward per step and no CFG;
# - the schedule is the pipeline's own: FlowMatchEulerDiscreteScheduler (shift 7 for the released model) at
#   sigmas linspace(1, 0, N + 1)[:-1], so the ODE rollout is exactly HunyuanVideoPipeline's sampling;
# - decoding divides by the VAE's `scaling_factor` (no per-channel statistics).
HUNYUAN_DEFAULT_HEIGHT, HUNYUAN_DEFAULT_WIDTH, HUNYUAN_DEFAULT_FRAMES = 720, 1280, 129  # the pipeline's defaults
HUNYUAN_MAX_SEQUENCE_LENGTH = 256  # HunyuanVideoPipeline.encode_prompt's default (tokens after the template)


class HunyuanVideoAdapter(WanAdapter):
    """diffusers' HunyuanVideoPipeline: guidance-distilled flow matching on 5-D video latents."""

    family = "hunyuan_video"
    fps = 24.0  # the official HunyuanVideo sampler saves its clips at 24 fps

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None) -> None:
        super().__init__(pipeline, height or HUNYUAN_DEFAULT_HEIGHT, width or HUNYUAN_DEFAULT_WIDTH,
                         max_sequence_length, num_frames or HUNYUAN_DEFAULT_FRAMES)

    def _size_multiple(self) -> int:
        return self._spatial * int(self.denoiser.config.patch_size)  # 8 x 2 = 16, the pipeline's own check

    @property
    def guidance_embeds(self) -> bool:
        return bool(getattr(self.denoiser.config, "guidance_embeds", False))

    def uses_cfg(self, guidance_scale: float) -> bool:
        # the pipeline's true CFG needs an explicit negative prompt and true_cfg_scale > 1; by default (and in
        # DanceGRPO) it samples with the embedded guidance only, and so do rollouts; a checkpoint without
        # guidance embeddings gets CFG with the empty prompt when guidance_scale > 1, as FLUX's non-distilled ones
        return guidance_scale > 1.0 and not self.guidance_embeds

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

        pe, pooled, mask = self.pipeline.encode_prompt(
            prompt=_prompt_list(prompts), prompt_template=DEFAULT_PROMPT_TEMPLATE, device=self.device,
            max_sequence_length=self.max_sequence_length or HUNYUAN_MAX_SEQUENCE_LENGTH,
        )
        return PromptEmbeds({"prompt_embeds": pe, "pooled_prompt_embeds": pooled, "prompt_attention_mask": mask})

    def schedule(self, num_steps: int) -> Schedule:
        sched = self.pipeline.scheduler
        sched.set_timesteps(sigmas=np.linspace(1.0, 0.0, num_steps + 1)[:-1])  # what the pipeline passes
        return _flow_schedule(sched)

    def _forward(self, model, x, t, embeds, guidance_scale):
        guidance = None
        if self.guidance_embeds:  # the pipeline: tensor([g] * B, dtype=transformer dtype) * 1000
            guidance = torch.full((x.shape[0],), float(guidance_scale), device=x.device, dtype=x.dtype) * 1000.0
        tensors = embeds.tensors
        return model(hidden_states=x, timestep=t.to(x.dtype), encoder_hidden_states=tensors["prompt_embeds"].to(x.dtype),
                     encoder_attention_mask=tensors["prompt_attention_mask"].to(x.dtype),
                     pooled_projections=tensors["pooled_prompt_embeds"].to(x.dtype), guidance=guidance,
                     return_dict=False)[0]

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        video = vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]  # (B, 3, T, H, W) in [-1, 1]
        return video.permute(0, 2, 1, 3, 4)


# ----------------------------------------------------------------------------------------------
# image editing: FLUX.1 Kontext
# ----------------------------------------------------------------------------------------------
# diffusers' `FluxKontextPipeline`: FLUX with the source image as part of the condition. Prompts are edit
# records (`mmreward.edit.EditPrompt`: the instruction bound to its source image); `encode` adds the source's
# latents to the prompt embedding, so the trainer's per-prompt cache holds them once per (instruction, source):
# - the source image is resized to the adapter's height x width and normalised by the pipeline's own image
#   processor, VAE-encoded with the distribution's mode (the pipeline's `sample_mode="argmax"`), shifted and
#   scaled, and packed into 2x2 patches like the noise latents;
# - at every step the packed source latents are concatenated after the noisy latents along the sequence, with
#   position ids whose first coordinate is 1 (the pipeline's `image_ids[..., 0] = 1`), and the denoiser's
#   output is cut back to the noisy tokens;
# - the schedule, guidance embedding and decoding are FLUX's (`FluxAdapter`).
# The ODE rollout is then exactly `FluxKontextPipeline(image=source, _auto_resize=False, max_area=height*width)`.
class FluxKontextAdapter(FluxAdapter):
    """diffusers' FluxKontextPipeline: instruction editing with the source image's latents in the condition."""

    family = "flux_kontext"
    is_edit = True

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        from mmreward.edit import EditPrompt, load_source_image

        prompts = _prompt_list(prompts)
        plain = [p for p in prompts if not isinstance(p, EditPrompt)]
        if plain:
            raise ConfigError(
                f"prompt {plain[0]!r} has no source image, but a {self.family} pipeline edits images: give edit "
                "records ({\"source_image\": PATH, \"instruction\": ...} rows, see mmreward.edit) as prompts"
            )
        text = super().encode([str(p) for p in prompts])
        images = torch.stack([load_source_image(p.source) for p in prompts])
        return PromptEmbeds({**text.tensors, "image_latents": self.encode_source(images)})

    @torch.no_grad()
    def encode_source(self, images: torch.Tensor) -> torch.Tensor:
        """Packed VAE latents (B, seq, 4C) of source images (B, 3, H, W) in [0, 1], as the pipeline makes them."""
        pipe = self.pipeline
        pixels = pipe.image_processor.preprocess(images.float(), self.height, self.width)
        latents = pipe._encode_vae_image(pixels.to(self.device, pipe.vae.dtype), generator=None)
        b, c, h, w = latents.shape
        return pipe._pack_latents(latents, b, c, h, w)

    def negative(self) -> PromptEmbeds:
        if self._negative is None:
            self._negative = FluxAdapter.encode(self, [""])  # text only: the source latents come with each row
        return self._negative

    def predict(self, model, x, t, embeds, guidance_scale):
        if not self.uses_cfg(guidance_scale):
            return super().predict(model, x, t, embeds, guidance_scale)
        # true CFG as the pipeline does it: the negative prompt sees the same source image
        neg = PromptEmbeds({**self.negative().expand(len(embeds)).tensors,
                            "image_latents": embeds.tensors["image_latents"]})
        both = PromptEmbeds.cat([neg, embeds])
        x = x.to(self.model_dtype)
        uncond, cond = self._forward(model, torch.cat([x, x]), torch.cat([t, t]), both, guidance_scale).float().chunk(2)
        return uncond + guidance_scale * (cond - uncond)

    def _forward(self, model, x, t, embeds, guidance_scale):
        h, w = self._latent_hw()
        pipe = self.pipeline
        source = embeds.tensors["image_latents"].to(x.dtype)
        latent_ids = pipe._prepare_latent_image_ids(x.shape[0], h // 2, w // 2, x.device, x.dtype)
        image_ids = latent_ids.clone()
        image_ids[..., 0] = 1
        pe = embeds.tensors["prompt_embeds"]
        txt_ids = torch.zeros(pe.shape[1], 3, device=x.device, dtype=x.dtype)
        guidance = None
        if self.guidance_embeds:
            guidance = torch.full((x.shape[0],), float(guidance_scale), device=x.device, dtype=torch.float32)
        out = model(hidden_states=torch.cat([x, source], dim=1), timestep=t.to(x.dtype) / 1000, guidance=guidance,
                    pooled_projections=embeds.tensors["pooled_prompt_embeds"], encoder_hidden_states=pe,
                    txt_ids=txt_ids, img_ids=torch.cat([latent_ids, image_ids], dim=0), return_dict=False)[0]
        return out[:, : x.shape[1]]


# ----------------------------------------------------------------------------------------------
# image editing: Qwen-Image-Edit
# ----------------------------------------------------------------------------------------------
# diffusers' `QwenImageEditPipeline`. The source image enters the condition twice, as the pipeline does it:
# - the prompt: Qwen2.5-VL reads the pipeline's edit template with the source image (resized to about 1024x1024
#   pixels at its aspect ratio, the pipeline's `calculate_dimensions`) and the instruction; its last hidden states
#   after the template's first 64 tokens are the text condition, with their attention mask. Each prompt's states
#   are zero-padded to `max_sequence_length` tokens (default 1024, the pipeline's tokenizer_max_length) with the
#   mask marking the padding, so per-prompt embeddings (the trainer caches them) stack into batches; the
#   transformer's joint attention mask makes the padding invisible;
# - the latents: the source image, normalised at that size, VAE-encoded with the mode and the VAE's per-channel
#   mean/std, packed into 2x2 patches and concatenated after the noisy tokens (`img_shapes` tells the rotary
#   embedding both grids); the output is cut back to the noisy tokens.
# CFG is the pipeline's true CFG with the negative prompt " " (the official example's) on the same source,
# rescaled to the conditional prediction's norm; the schedule is the pipeline's (sigmas linspace(1, 1/N, N),
# dynamic shift by the noisy sequence length); decoding un-normalises with the VAE's mean/std. The ODE rollout
# is then exactly `QwenImageEditPipeline(image=source, height=..., width=...)` (+ negative_prompt=" ", true_cfg).
QWEN_EDIT_NEGATIVE_PROMPT = " "
QWEN_EDIT_MAX_SEQUENCE_LENGTH = 1024
QWEN_EDIT_SOURCE_AREA = 1024 * 1024


class QwenImageEditAdapter(PipelineAdapter):
    """diffusers' QwenImageEditPipeline: the source image in the VLM prompt and as latents beside the noisy ones."""

    family = "qwen_image_edit"
    is_edit = True

    def _default_size(self) -> int:
        return int(self.pipeline.default_sample_size) * int(self.pipeline.vae_scale_factor)

    def _size_multiple(self) -> int:
        return int(self.pipeline.vae_scale_factor) * 2

    @property
    def guidance_embeds(self) -> bool:
        return bool(getattr(self.denoiser.config, "guidance_embeds", False))

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0 and not self.guidance_embeds

    def _latent_hw(self) -> tuple[int, int]:
        vsf = self.pipeline.vae_scale_factor
        return 2 * (self.height // (vsf * 2)), 2 * (self.width // (vsf * 2))

    def latent_shape(self):
        h, w = self._latent_hw()
        return ((h // 2) * (w // 2), self.denoiser.config.in_channels)

    def schedule(self, num_steps: int) -> Schedule:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_shift

        sched = self.pipeline.scheduler
        mu = calculate_shift(self.latent_shape()[0], sched.config.get("base_image_seq_len", 256),
                             sched.config.get("max_image_seq_len", 4096), sched.config.get("base_shift", 0.5),
                             sched.config.get("max_shift", 1.15))
        sched.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
        return _flow_schedule(sched)

    # -- conditioning -------------------------------------------------------------------------
    def _pad(self, pe: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        length = self.max_sequence_length or QWEN_EDIT_MAX_SEQUENCE_LENGTH
        if mask is None:
            mask = torch.ones(pe.shape[:2], dtype=torch.long, device=pe.device)
        if pe.shape[1] > length:
            raise ConfigError(f"an encoded edit prompt (template, source image tokens and instruction) has {pe.shape[1]} "
                              f"tokens, more than model.max_sequence_length={length}; raise it")
        pad = length - pe.shape[1]
        return (torch.cat([pe, pe.new_zeros(pe.shape[0], pad, pe.shape[2])], 1),
                torch.cat([mask.long(), mask.new_zeros(mask.shape[0], pad).long()], 1))

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions
        from PIL import Image

        from mmreward.edit import EditPrompt

        pipe = self.pipeline
        rows = []
        for p in _prompt_list(prompts):
            if not isinstance(p, EditPrompt):
                raise ConfigError(
                    f"prompt {p!r} has no source image, but a {self.family} pipeline edits images: give edit records "
                    "({\"source_image\": PATH, \"instruction\": ...} rows, see mmreward.edit) as prompts"
                )
            with Image.open(p.source) as img:
                image = img.convert("RGB")
            w, h, _ = calculate_dimensions(QWEN_EDIT_SOURCE_AREA, image.size[0] / image.size[1])
            prompt_image = pipe.image_processor.resize(image, h, w)
            pixels = pipe.image_processor.preprocess(prompt_image, h, w).unsqueeze(2)
            latents = pipe._encode_vae_image(pixels.to(self.device, pipe.vae.dtype), generator=None)
            b, c, _, lh, lw = latents.shape
            pe, mask = self._pad(*pipe.encode_prompt(prompt=[str(p)], image=prompt_image, device=self.device))
            neg, neg_mask = self._pad(*pipe.encode_prompt(prompt=[QWEN_EDIT_NEGATIVE_PROMPT], image=prompt_image,
                                                          device=self.device))
            rows.append(PromptEmbeds({
                "prompt_embeds": pe, "prompt_embeds_mask": mask, "negative_prompt_embeds": neg,
                "negative_prompt_embeds_mask": neg_mask, "image_latents": pipe._pack_latents(latents, b, c, lh, lw),
                "source_hw": torch.tensor([[h, w]], device=self.device),
            }))
        return PromptEmbeds.cat(rows)

    def negative(self) -> PromptEmbeds:
        raise ConfigError("qwen_image_edit encodes its negative prompt with each source image (see encode)")

    def predict(self, model, x, t, embeds, guidance_scale):
        x = x.to(self.model_dtype)
        if not self.uses_cfg(guidance_scale):
            return self._forward(model, x, t, embeds, guidance_scale).float()
        tensors = embeds.tensors
        neg = PromptEmbeds({**tensors, "prompt_embeds": tensors["negative_prompt_embeds"],
                            "prompt_embeds_mask": tensors["negative_prompt_embeds_mask"]})
        both = PromptEmbeds.cat([neg, embeds])
        uncond, cond = self._forward(model, torch.cat([x, x]), torch.cat([t, t]), both, guidance_scale).float().chunk(2)
        comb = uncond + guidance_scale * (cond - uncond)
        # the pipeline keeps the conditional prediction's norm per token
        return comb * (cond.norm(dim=-1, keepdim=True) / comb.norm(dim=-1, keepdim=True))

    def _forward(self, model, x, t, embeds, guidance_scale):
        h, w = self._latent_hw()
        vsf = self.pipeline.vae_scale_factor
        tensors = embeds.tensors
        img_shapes = [[(1, h // 2, w // 2), (1, int(sh) // vsf // 2, int(sw) // vsf // 2)]
                      for sh, sw in tensors["source_hw"].tolist()]
        mask = tensors["prompt_embeds_mask"]
        guidance = None
        if self.guidance_embeds:
            guidance = torch.full((x.shape[0],), float(guidance_scale), device=x.device, dtype=torch.float32)
        out = model(hidden_states=torch.cat([x, tensors["image_latents"].to(x.dtype)], dim=1),
                    timestep=t.to(x.dtype) / 1000, guidance=guidance,
                    encoder_hidden_states_mask=None if bool(mask.all()) else mask,
                    encoder_hidden_states=tensors["prompt_embeds"].to(x.dtype), img_shapes=img_shapes,
                    return_dict=False)[0]
        return out[:, : x.shape[1]]

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        pipe, vae = self.pipeline, self.pipeline.vae
        z = int(vae.config.z_dim)
        latents = pipe._unpack_latents(latents, self.height, self.width, pipe.vae_scale_factor)
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        return vae.decode(latents * std + mean, return_dict=False)[0][:, :, 0]


def pipeline_family(pipe: Any, purpose: str = "") -> str:
    """'wan' | 'hunyuan_video' | 'flux' | 'sd3' | 'sdxl' | 'sd' from the pipeline's class hierarchy, so subclasses
    (e.g. ReNO-style wrappers) count; matched by class name so that a caller need not import diffusers first."""
    names = {c.__name__ for c in type(pipe).__mro__}
    for cls, family in (("WanPipeline", "wan"), ("HunyuanVideoPipeline", "hunyuan_video"),
                        ("FluxKontextPipeline", "flux_kontext"), ("QwenImageEditPipeline", "qwen_image_edit"),
                        ("FluxPipeline", "flux"), ("StableDiffusion3Pipeline", "sd3"),
                        ("StableDiffusionXLPipeline", "sdxl"), ("StableDiffusionPipeline", "sd"),
                        ("CogVideoXPipeline", "cogvideox"), ("LTXPipeline", "ltx")):
        if cls in names:
            return family
    raise ConfigError(
        f"pipeline: {type(pipe).__name__} is not supported{purpose}; expected a StableDiffusionPipeline, "
        "StableDiffusionXLPipeline, StableDiffusion3Pipeline, FluxPipeline, WanPipeline, HunyuanVideoPipeline, "
        "CogVideoXPipeline or LTXPipeline (or a subclass). Load one with DiffusionPipeline.from_pretrained(...)"
    )


ADAPTERS: dict[str, type[PipelineAdapter]] = {"sd3": SD3Adapter, "flux": FluxAdapter, "sdxl": SDXLAdapter,
                                              "sd": SDAdapter, "wan": WanAdapter,
                                              "hunyuan_video": HunyuanVideoAdapter,
                                              "flux_kontext": FluxKontextAdapter,
                                              "qwen_image_edit": QwenImageEditAdapter}
# LoRA target modules per family: the attention projections, as the Flow-GRPO / DanceGRPO / DDPO code trains
DEFAULT_LORA_TARGETS: dict[str, list[str]] = {
    "sd": ["to_q", "to_k", "to_v", "to_out.0"],
    "sdxl": ["to_q", "to_k", "to_v", "to_out.0"],
    "sd3": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"],
    "flux": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"],
    "wan": ["to_q", "to_k", "to_v", "to_out.0"],  # self- (attn1) and cross-attention (attn2) of every Wan block
    # HunyuanVideo: the joint attention of the dual-stream blocks (image and text projections, as FLUX), the
    # q/k/v of the single-stream blocks, and the token refiner's self-attention (same names inside it)
    "hunyuan_video": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"],
    # CogVideoX: the joint text+video attention (attn1) of every block, as diffusers' train_cogvideox_lora.py
    "cogvideox": ["to_q", "to_k", "to_v", "to_out.0"],
    "ltx": ["to_q", "to_k", "to_v", "to_out.0"],  # self- (attn1) and cross-attention (attn2) of every LTX block
    "flux_kontext": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"],
    # Qwen-Image's dual-stream blocks: image and text projections of the joint attention, as FLUX
    "qwen_image_edit": ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"],
}
VIDEO_FAMILIES = ("wan", "hunyuan_video", "cogvideox", "ltx")  # the families whose adapters make videos (B, T, 3, H, W)


def check_reward_modalities(adapter: PipelineAdapter, rewards: dict[str, Any], train_prompts: Sequence[str] = (),
                            eval_prompts: Sequence[str] = ()) -> None:
    """ConfigError naming each reward that cannot score what the pipeline makes (a video reward on an image
    pipeline, or an image reward on a video one), before any sampling. Video rewards are told the
    pipeline's frame rate, so the ones that sample by time (`card_fps`) keep the frames their card asks for.
    With the prompts: an editing pipeline or edit reward needs edit records (`mmreward.edit.check_edit_run`)."""
    from mmreward.edit import check_edit_run

    check_edit_run(adapter.family, {"train": train_prompts, "eval": eval_prompts},
                   [n for n, r in rewards.items() if r is not None])
    bad = [name for name, r in rewards.items() if r is not None and adapter.modality not in r.modalities]
    if bad:
        hint = ("score videos with video rewards, or wrap an image reward per frame (mmreward's video-frames)"
                if adapter.modality == "video" else "use image rewards, or a video pipeline (WanPipeline)")
        raise ConfigError(f"reward(s) {bad} cannot score the {adapter.modality}s a {adapter.family} pipeline makes "
                          f"({', '.join(f'{n}: {list(rewards[n].modalities)}' for n in bad)}); {hint}")
    if adapter.modality == "video":
        for reward in rewards.values():
            if reward is not None and hasattr(reward, "set_clip_fps"):
                reward.set_clip_fps(adapter.fps)


def check_token_limit(pipeline: Any, max_sequence_length: int | None) -> None:
    """A sequence longer than the text encoder's position table fails deep in its forward; say so first."""
    from diffusion_rl.model_card import text_token_limit

    limit = text_token_limit(pipeline)
    if max_sequence_length is not None and limit is not None and max_sequence_length > limit[1]:
        raise ConfigError(f"max_sequence_length={max_sequence_length} is more than {type(pipeline).__name__}'s "
                          f"{limit[0]} can take ({limit[1]} positions); set max_sequence_length <= {limit[1]}")


def make_adapter(pipeline: Any, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None) -> PipelineAdapter:
    """The adapter for a diffusers pipeline instance (by family, so subclasses work too); `num_frames` is
    for video pipelines and an error for image ones."""
    family = pipeline_family(pipeline, " for reward fine-tuning")
    # settings left unset come from the folder's card (load_pipeline reads it), then from the adapter's defaults
    card = getattr(pipeline, "generation_defaults", None) or {}
    height = height if height is not None else card.get("height")
    width = width if width is not None else card.get("width")
    max_sequence_length = max_sequence_length if max_sequence_length is not None else card.get("max_sequence_length")
    video = family in ("cogvideox", "ltx") or ADAPTERS[family].modality == "video"
    if num_frames is None and video:
        num_frames = card.get("num_frames")
    check_token_limit(pipeline, max_sequence_length)
    if family in ("cogvideox", "ltx"):  # kept in their own module (diffusion_rl.video_adapters)
        from diffusion_rl.video_adapters import VIDEO_ADAPTERS

        return VIDEO_ADAPTERS[family](pipeline, height, width, max_sequence_length, num_frames)
    if ADAPTERS[family].modality == "video":
        return ADAPTERS[family](pipeline, height, width, max_sequence_length, num_frames)
    if num_frames is not None:
        raise ConfigError(f"num_frames={num_frames} was given for {type(pipeline).__name__}, which makes images; "
                          "leave num_frames unset or use a video pipeline (WanPipeline)")
    return ADAPTERS[family](pipeline, height, width, max_sequence_length)


def adapter_for_config(pipeline: Any, model_cfg: Any) -> PipelineAdapter:
    """`make_adapter` with a run's `model` section (height, width, max_sequence_length, num_frames), so that the
    trainer and the scripts build the adapter from the config the same way."""
    adapter = make_adapter(pipeline, model_cfg.height, model_cfg.width, model_cfg.max_sequence_length,
                           model_cfg.num_frames)
    fps = getattr(model_cfg, "fps", None)
    if fps is not None:
        if adapter.modality != "video":
            raise ConfigError(f"model.fps={fps} was given for {type(pipeline).__name__}, which makes images; "
                              "leave model.fps unset or use a video pipeline")
        adapter.fps = float(fps)
    return adapter


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
                  attention: str = "auto", what: str = "model.pretrained"):
    """A diffusers pipeline from a local folder or hub id (official layout), frozen, on `device`, with every
    attention module running the `attention` choice (see `mmreward.attention`). `what` names the setting the
    source came from in error messages."""
    from mmreward.attention import apply_to_pipeline, check_choice

    check_choice(attention, "model.attention")  # before the (slow) load
    from diffusion_rl.model_card import read_generation_defaults

    pipe = pipeline_from_pretrained(pretrained, what, dtype=dtype)
    pipe.generation_defaults = read_generation_defaults(pretrained)  # the folder's card: make_adapter's defaults
    pipe.set_progress_bar_config(disable=True)
    for name in ("vae", "text_encoder", "text_encoder_2", "text_encoder_3", "unet", "transformer"):
        module = getattr(pipe, name, None)
        if isinstance(module, torch.nn.Module):
            module.requires_grad_(False)
    pipe = pipe.to(device)
    apply_to_pipeline(pipe, attention)
    return pipe


def run_pipeline(model_cfg: Any, device: str | torch.device, pipeline: Any = None) -> Any:
    """The run's pipeline: `model.pretrained` loaded frozen on `device`, or the one passed in; either way with
    the configured attention backend and no progress bars."""
    if pipeline is None:
        if not model_cfg.pretrained.strip():
            raise ConfigError("model.pretrained is empty: set it to a diffusers pipeline folder or hub id")
        pipeline = load_pipeline(model_cfg.pretrained, DTYPES[model_cfg.dtype], device, model_cfg.attention)
    else:  # a pipeline passed in runs the configured attention too
        from mmreward.attention import apply_to_pipeline

        apply_to_pipeline(pipeline, model_cfg.attention)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline
