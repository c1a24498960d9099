"""StableDiffusionXLPipeline: SD's UNet + DDIM (`SDAdapter`) with two text encoders, pooled embeddings and the
size conditioning (original = target = the adapter's size, no crop); the empty prompt's embedding is zeros
when the pipeline's `force_zeros_for_empty_prompt` says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffusion_rl.adapters.base import PromptEmbeds, prompt_list
from diffusion_rl.adapters.sd import SDAdapter


class SDXLAdapter(SDAdapter):
    """SDXL: two text encoders, pooled embeddings and size conditioning (original = target = our size, no crop)."""

    family = "sdxl"

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        pe, _, pooled, _ = self.pipeline.encode_prompt(prompt=prompt_list(prompts), device=self.device,
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
