"""diffusers' LTXPipeline (LTX-Video). Latents are presented as (B, C, T', H', W') whatever layout the pipeline
keeps internally (`VideoAdapter`),
so the kernels, the counter-based noise and the log-probs (mean over every latent element) are the same code as
for images and Wan; `decode` returns videos (B, T, 3, H, W) in [0, 1].

LTX-Video (0.9.x):
- the transformer takes packed tokens (`LTXPipeline._pack_latents`); `_forward` packs the (B, C, T', H', W')
  latents, passes the latent grid and `rope_interpolation_scale` = (temporal / frame_rate, spatial, spatial)
  as the pipeline does, and unpacks the velocity;
- flow matching with the pipeline's FlowMatchEulerDiscreteScheduler, sigmas linspace(1, 1/N, N) shifted by
  `mu` from the video sequence length (and `shift_terminal` when configured): the Flow-SDE / Dance-SDE / ODE
  kernels apply, and the ODE path is exactly LTXPipeline's sampling;
- prompts: T5 padded to `max_sequence_length` (128 by default) with the attention mask the transformer takes;
- decoding denormalises with the VAE's `latents_mean` / `latents_std` and scaling factor; a
  timestep-conditioned decoder (0.9.1+) gets `decode_timestep` (the pipeline's default 0.0), with
  `decode_noise_scale` (default: the decode timestep) of fixed-seed noise mixed in, as the pipeline does when
  those are set.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from diffusion_rl.adapters.base import PromptEmbeds, Schedule, VideoAdapter, flow_schedule, prompt_list
from mmreward.errors import ConfigError

LTX_DEFAULT_HEIGHT, LTX_DEFAULT_WIDTH, LTX_DEFAULT_FRAMES, LTX_DEFAULT_FRAME_RATE = 512, 704, 161, 25  # __call__'s
LTX_MAX_SEQUENCE_LENGTH = 128  # LTXPipeline.encode_prompt's default


class LTXAdapter(VideoAdapter):
    """diffusers' LTXPipeline: flow matching on packed video tokens (see the module docstring)."""

    family = "ltx"
    block_classes = ("LTXVideoTransformerBlock",)
    is_flow = True

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None,
                 frame_rate: float = LTX_DEFAULT_FRAME_RATE, decode_timestep: float = 0.0,
                 decode_noise_scale: float | None = None) -> None:
        spatial = int(pipeline.vae_spatial_compression_ratio)
        temporal = int(pipeline.vae_temporal_compression_ratio)
        patch, patch_t = int(pipeline.transformer_spatial_patch_size), int(pipeline.transformer_temporal_patch_size)
        self._init_video(pipeline, height or LTX_DEFAULT_HEIGHT, width or LTX_DEFAULT_WIDTH,
                         num_frames or LTX_DEFAULT_FRAMES, max_sequence_length, spatial, temporal, spatial * patch)
        if frame_rate <= 0:
            raise ConfigError(f"frame_rate must be > 0 (frames per second, LTXPipeline's default 25), got {frame_rate}")
        self.frame_rate = float(frame_rate)
        self._patch, self._patch_t = patch, patch_t
        self.decode_timestep = float(decode_timestep)
        self.decode_noise_scale = float(decode_timestep if decode_noise_scale is None else decode_noise_scale)

    @property
    def fps(self) -> float:  # LTX conditions its rotary positions on the clip's own frame rate
        return self.frame_rate

    @fps.setter
    def fps(self, value: float) -> None:
        self.frame_rate = float(value)

    def latent_shape(self) -> tuple[int, ...]:
        # the channels LTXPipeline.prepare_latents draws noise for, before packing
        return (int(self.denoiser.config.in_channels), self.latent_frames, self.height // self._spatial,
                self.width // self._spatial)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        pe, mask, _, _ = self.pipeline.encode_prompt(
            prompt=prompt_list(prompts), do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length or LTX_MAX_SEQUENCE_LENGTH,
        )
        return PromptEmbeds({"prompt_embeds": pe, "prompt_attention_mask": mask})

    def schedule(self, num_steps: int) -> Schedule:
        from diffusers import FlowMatchEulerDiscreteScheduler
        from diffusers.pipelines.ltx.pipeline_ltx import calculate_shift

        sched = self.pipeline.scheduler
        if not isinstance(sched, FlowMatchEulerDiscreteScheduler):
            sched = FlowMatchEulerDiscreteScheduler.from_config(sched.config)
        _, frames, h, w = self.latent_shape()
        cfg = sched.config
        mu = calculate_shift(frames * h * w, cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096),
                             cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15))
        sched.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
        return flow_schedule(sched)

    def _forward(self, model, x, t, embeds, guidance_scale):
        _, _, frames, h, w = x.shape
        packed = self.pipeline._pack_latents(x, self._patch, self._patch_t)
        scale = (self._temporal / self.frame_rate, self._spatial, self._spatial)
        out = model(hidden_states=packed, encoder_hidden_states=embeds.tensors["prompt_embeds"], timestep=t,
                    encoder_attention_mask=embeds.tensors["prompt_attention_mask"], num_frames=frames // self._patch_t,
                    height=h // self._patch, width=w // self._patch, rope_interpolation_scale=scale,
                    return_dict=False)[0]
        return self.pipeline._unpack_latents(out, frames // self._patch_t, h // self._patch, w // self._patch,
                                             self._patch, self._patch_t)

    def default_decode_chunk_size(self, batch: int) -> int:
        # with decode noise, LTXPipeline draws it once over the whole batch; chunks would each draw it again
        if self.decode_noise_scale and self.pipeline.vae.config.timestep_conditioning:
            return max(1, int(batch))
        return super().default_decode_chunk_size(batch)

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        latents = self.pipeline._denormalize_latents(latents, vae.latents_mean, vae.latents_std,
                                                     vae.config.scaling_factor)
        timestep = None
        if vae.config.timestep_conditioning:
            n = latents.shape[0]
            timestep = torch.full((n,), self.decode_timestep, device=latents.device, dtype=latents.dtype)
            if self.decode_noise_scale:
                # fixed-seed noise, so a sample decodes the same way every time it is scored
                gen = torch.Generator("cpu").manual_seed(0)
                noise = torch.randn(latents.shape, generator=gen, dtype=torch.float32).to(latents.device, latents.dtype)
                latents = (1 - self.decode_noise_scale) * latents + self.decode_noise_scale * noise
        video = vae.decode(latents, timestep, return_dict=False)[0]  # (B, 3, T, H, W) in [-1, 1]
        return video.permute(0, 2, 1, 3, 4)
