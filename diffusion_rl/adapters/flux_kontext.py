"""diffusers' `FluxKontextPipeline`: FLUX with the source image as part of the condition. Prompts are edit
records (`mmreward.edit.EditPrompt`: the instruction bound to its source image); `encode` adds the source's
latents to the prompt embedding, so the trainer's per-prompt cache holds them once per (instruction, source):
- the source image is resized to the adapter's height x width and normalised by the pipeline's own image
  processor, VAE-encoded with the distribution's mode (the pipeline's `sample_mode="argmax"`), shifted and
  scaled, and packed into 2x2 patches like the noise latents;
- at every step the packed source latents are concatenated after the noisy latents along the sequence, with
  position ids whose first coordinate is 1 (the pipeline's `image_ids[..., 0] = 1`), and the denoiser's
  output is cut back to the noisy tokens;
- the schedule, guidance embedding and decoding are FLUX's (`FluxAdapter`).
The ODE rollout is then exactly `FluxKontextPipeline(image=source, _auto_resize=False, max_area=height*width)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffusion_rl.adapters.base import PromptEmbeds, prompt_list
from diffusion_rl.adapters.flux import FluxAdapter
from mmreward.errors import ConfigError


class FluxKontextAdapter(FluxAdapter):
    """diffusers' FluxKontextPipeline: instruction editing with the source image's latents in the condition."""

    family = "flux_kontext"
    is_edit = True

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        from mmreward.edit import EditPrompt, load_source_image

        prompts = prompt_list(prompts)
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
