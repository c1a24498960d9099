"""diffusers' `QwenImageEditPlusPipeline` (Qwen-Image-Edit-2509 / 2511): edits conditioned on one or more images.

Each edit record's source images (`EditPrompt.sources`, from {"source_images": [PATH, ...]} rows; a one-image
record works too) enter the condition as the pipeline puts them:
- the prompt: each image resized to about 384x384 pixels at its aspect ratio (`CONDITION_IMAGE_SIZE`,
  `calculate_dimensions`) and announced in the template as "Picture k: <|vision_start|><|image_pad|>
  <|vision_end|>" before the instruction; Qwen2.5-VL's last hidden states after the template's first 64 tokens
  are the text condition. As in `QwenImageEditAdapter` they are zero-padded to `max_sequence_length` with the
  mask marking the padding, so per-prompt rows (the trainer caches them) stack into batches;
- the latents: each image, normalised at about 1024x1024 pixels (`VAE_IMAGE_SIZE`), VAE-encoded (mode, the
  VAE's per-channel mean/std), packed into 2x2 patches; all of them concatenated after the noisy tokens in order,
  and `img_shapes` gives the rotary embedding the noisy grid followed by each condition grid.
CFG, the schedule and decoding are the single-image edit pipeline's (true CFG on the negative prompt " " with the
same images, rescaled to the conditional prediction's norm), so those parts are inherited. The pipeline samples
one prompt per call; batching rows here needs the same number and sizes of condition images in a batch (the
token sequences are concatenated), which a run's edit records at one resolution give.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffusion_rl.adapters.base import PromptEmbeds, open_source_image, prompt_list
from diffusion_rl.adapters.qwen_image_edit import QWEN_EDIT_NEGATIVE_PROMPT, QwenImageEditAdapter
from diffusion_rl.adapters.registry import register_adapter
from mmreward.errors import ConfigError


class QwenImageEditPlusAdapter(QwenImageEditAdapter):
    """QwenImageEditPlusPipeline: every source image in the VLM prompt and as latents beside the noisy ones."""

    family = "qwen_image_edit_plus"
    source_images = "same_count"
    is_edit = True

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
            CONDITION_IMAGE_SIZE,
            VAE_IMAGE_SIZE,
            calculate_dimensions,
        )

        from mmreward.edit import EditPrompt

        pipe = self.pipeline
        rows = []
        for p in prompt_list(prompts):
            if not isinstance(p, EditPrompt):
                raise ConfigError(
                    f"prompt {p!r} has no source image, but a {self.family} pipeline edits images: give edit records "
                    "({\"source_images\": [PATH, ...], \"instruction\": ...} or {\"source_image\": PATH, ...} rows, "
                    "see mmreward.edit) as prompts"
                )
            condition_images, latents, vae_hw = [], [], []
            for path in p.sources:
                image = open_source_image(path, self.family)
                ratio = image.size[0] / image.size[1]
                cw, ch = calculate_dimensions(CONDITION_IMAGE_SIZE, ratio)
                vw, vh = calculate_dimensions(VAE_IMAGE_SIZE, ratio)
                # the VLM sees a small copy; the VAE the original resized to the output-scale area
                condition_images.append(pipe.image_processor.resize(image, ch, cw))
                pixels = pipe.image_processor.preprocess(image, vh, vw).unsqueeze(2)
                lat = pipe._encode_vae_image(pixels.to(self.device, pipe.vae.dtype), generator=None)
                b, c, _, lh, lw = lat.shape
                latents.append(pipe._pack_latents(lat, b, c, lh, lw))
                vae_hw.append([vh, vw])
            pe, mask = self._pad(*pipe.encode_prompt(prompt=[str(p)], image=condition_images, device=self.device))
            neg, neg_mask = self._pad(*pipe.encode_prompt(prompt=[QWEN_EDIT_NEGATIVE_PROMPT], image=condition_images,
                                                          device=self.device))
            rows.append(PromptEmbeds({
                "prompt_embeds": pe, "prompt_embeds_mask": mask, "negative_prompt_embeds": neg,
                "negative_prompt_embeds_mask": neg_mask, "image_latents": torch.cat(latents, dim=1),
                "source_hw": torch.tensor([vae_hw], device=self.device),  # (1, K, 2): each image's VAE size
            }))
        if len({tuple(r.tensors["source_hw"].flatten().tolist()) for r in rows}) > 1:
            raise ConfigError(f"{self.family}: the prompts of one batch have different numbers or sizes of source "
                              "images; their condition tokens cannot be stacked. Encode them separately, or give "
                              "every edit record the same number of images at one aspect ratio")
        return PromptEmbeds.cat(rows)

    def negative(self) -> PromptEmbeds:
        raise ConfigError(f"{self.family} encodes its negative prompt with each prompt's source images (see encode)")

    def _forward(self, model, x, t, embeds, guidance_scale):
        h, w = self._latent_hw()
        vsf = self.pipeline.vae_scale_factor
        tensors = embeds.tensors
        # the noisy grid first, then each condition image's grid, as the pipeline's img_shapes
        img_shapes = [[(1, h // 2, w // 2), *[(1, int(sh) // vsf // 2, int(sw) // vsf // 2) for sh, sw in row]]
                      for row in tensors["source_hw"].tolist()]
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


# Qwen-Image's dual-stream blocks: image and text projections of the joint attention, as QwenImageEditPipeline
register_adapter("QwenImageEditPlusPipeline", "qwen_image_edit_plus", QwenImageEditPlusAdapter,
                 ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"])
