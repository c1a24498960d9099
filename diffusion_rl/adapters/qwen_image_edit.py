"""diffusers' `QwenImageEditPipeline`. The source image enters the condition twice, as the pipeline does it:
- the prompt: Qwen2.5-VL reads the pipeline's edit template with the source image (resized to about 1024x1024
  pixels at its aspect ratio, the pipeline's `calculate_dimensions`) and the instruction; its last hidden states
  after the template's first 64 tokens are the text condition, with their attention mask. Each prompt's states
  are zero-padded to `max_sequence_length` tokens (default 1024, the pipeline's tokenizer_max_length) with the
  mask marking the padding, so per-prompt embeddings (the trainer caches them) stack into batches; the
  transformer's joint attention mask makes the padding invisible;
- the latents: the source image, normalised at that size, VAE-encoded with the mode and the VAE's per-channel
  mean/std, packed into 2x2 patches and concatenated after the noisy tokens (`img_shapes` tells the rotary
  embedding both grids); the output is cut back to the noisy tokens.
CFG is the pipeline's true CFG with the negative prompt " " (the official example's) on the same source,
rescaled to the conditional prediction's norm; the schedule is the pipeline's (sigmas linspace(1, 1/N, N),
dynamic shift by the noisy sequence length); decoding un-normalises with the VAE's mean/std. The ODE rollout
is then exactly `QwenImageEditPipeline(image=source, height=..., width=...)` (+ negative_prompt=" ", true_cfg).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from diffusion_rl.adapters.base import PipelineAdapter, PromptEmbeds, Schedule, flow_schedule, prompt_list
from mmreward.errors import ConfigError

QWEN_EDIT_NEGATIVE_PROMPT = " "
QWEN_EDIT_MAX_SEQUENCE_LENGTH = 1024
QWEN_EDIT_SOURCE_AREA = 1024 * 1024


class QwenImageEditAdapter(PipelineAdapter):
    """diffusers' QwenImageEditPipeline: the source image in the VLM prompt and as latents beside the noisy ones."""

    family = "qwen_image_edit"
    block_classes = ("QwenImageTransformerBlock",)
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
        return flow_schedule(sched)

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
        for p in prompt_list(prompts):
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
