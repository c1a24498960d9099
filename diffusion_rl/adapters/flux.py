"""FluxPipeline (FLUX.1 dev / schnell): flow matching on packed 2x2 latent patches (sequence, 4C), sigmas
linspace(1, 1/N, N) shifted by `mu` from the sequence length; guidance-distilled checkpoints take the guidance
scale as an input (no CFG), the others get true CFG with the empty prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from diffusion_rl.adapters.base import PipelineAdapter, PromptEmbeds, Schedule, flow_schedule, prompt_list


class FluxAdapter(PipelineAdapter):
    """FLUX.1: packed 2x2 latent patches; guidance-distilled checkpoints take the guidance scale as an
    input (no CFG), others get true CFG with the empty prompt when guidance_scale > 1."""

    family = "flux"
    block_classes = ("FluxTransformerBlock", "FluxSingleTransformerBlock")

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
        pe, pooled, _ = self.pipeline.encode_prompt(prompt=prompt_list(prompts), prompt_2=None, device=self.device, **kw)
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
        return flow_schedule(sched)

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
