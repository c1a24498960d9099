"""StableDiffusion3Pipeline (SD3 / SD3.5): flow matching with FlowMatchEulerDiscreteScheduler (dynamic
shift from the image sequence length when the scheduler asks for it), joint text attention over three
encoders' embeddings; latents (C, H/8, W/8) scaled and shifted by the VAE's factors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffusion_rl.adapters.base import PipelineAdapter, PromptEmbeds, Schedule, flow_schedule, prompt_list


class SD3Adapter(PipelineAdapter):
    family = "sd3"
    block_classes = ("JointTransformerBlock",)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        kw = {"max_sequence_length": self.max_sequence_length} if self.max_sequence_length else {}
        pe, _, pooled, _ = self.pipeline.encode_prompt(
            prompt=prompt_list(prompts), prompt_2=None, prompt_3=None, device=self.device,
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
        return flow_schedule(sched)

    def _forward(self, model, x, t, embeds, guidance_scale):
        return model(hidden_states=x, timestep=t.to(x.dtype), encoder_hidden_states=embeds.tensors["prompt_embeds"],
                     pooled_projections=embeds.tensors["pooled_prompt_embeds"], return_dict=False)[0]

    def _decode_latents(self, latents):
        vae = self.pipeline.vae
        latents = latents / vae.config.scaling_factor + vae.config.shift_factor
        return vae.decode(latents, return_dict=False)[0]
