"""StableDiffusionPipeline (SD 1.x / 2.x): UNet + DDIM. Any scheduler of the pipeline is replaced by DDIM built
from its config (as DDPO does), so the DDIM kernel and its log-probs apply; epsilon or v-prediction as the
scheduler's config says.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffusion_rl.adapters.base import PipelineAdapter, PromptEmbeds, Schedule, prompt_list
from diffusion_rl.kernels import ddim_alphas


class SDAdapter(PipelineAdapter):
    """SD 1.x/2.x: UNet + DDIM (any scheduler of the pipeline is replaced by DDIM from its config)."""

    family = "sd"
    block_classes = ("BasicTransformerBlock", "ResnetBlock2D")
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
        pe, _ = self.pipeline.encode_prompt(prompt_list(prompts), self.device, 1, False)
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
