"""Qwen-Image text-to-image: diffusers' `QwenImagePipeline` (Qwen/Qwen-Image, Qwen/Qwen-Image-2512).

The pipeline shares everything but the condition with Qwen-Image-Edit, so `QwenImageAdapter` is the edit
adapter without the source image:

- prompts: Qwen2.5-VL reads each prompt in the pipeline's template (`prompt_template_encode`, a system turn
  asking to describe the image), and its last hidden states after the template's first
  `prompt_template_encode_start_idx` (34) tokens are the condition, with their attention mask. Encoding is the
  pipeline's own `encode_prompt`, cut at `max_sequence_length` tokens as the pipeline does (default 512, its
  `__call__` default). Each prompt's states are then zero-padded to `max_sequence_length` with the mask marking
  the padding, so that per-prompt embeddings (the trainer caches them) stack into batches; at every forward the
  batch is cut back to its longest prompt, which is the padding the pipeline itself makes for a batch
  (`_get_qwen_prompt_embeds` pads to the longest prompt), and the mask is dropped when nothing is padded, as
  `encode_prompt` does.
- latents: (B, H/16 * W/16, 4 z) packed 2x2 patches, `img_shapes` [(1, H/16, W/16)] per sample (the
  transformer's rotary grid; the text positions follow from the mask, so no `txt_seq_lens`).
- schedule: sigmas linspace(1, 1/N, N) with the dynamic shift mu = calculate_shift(image_seq_len) (the edit
  adapter's `schedule`, which is the pipeline's step 5).
- CFG: the pipeline's true CFG, enabled by `true_cfg_scale > 1` with a negative prompt; rollouts use the
  negative prompt " " (the model card's example), and the combined prediction is rescaled per token to the
  conditional prediction's norm: comb * ||cond|| / ||comb|| over the packed channel axis. `guidance_scale` here is
  the pipeline's `true_cfg_scale`; a guidance-distilled transformer (`guidance_embeds`) takes it as an input
  instead, one forward per step.
- decoding: un-normalised with the VAE's per-channel latents mean/std, first (only) frame, [0, 1].

The ODE rollout is then `QwenImagePipeline(prompt, negative_prompt=" ", true_cfg_scale=g, height, width,
num_inference_steps=N, latents=x_T)`.

`QwenImage21Pipeline` (Qwen-Image-2.1) has another transformer (single stream, `img_mask`, block-causal attention),
unpatched latents and plain true CFG without the norm rescale: `diffusion_rl.adapters.qwen_image21` subclasses this
adapter for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffusion_rl.adapters.base import PromptEmbeds, prompt_list
from diffusion_rl.adapters.qwen_image_edit import QwenImageEditAdapter
from diffusion_rl.adapters.registry import register_adapter
from mmreward.errors import ConfigError

QWEN_IMAGE_NEGATIVE_PROMPT = " "  # the model card's negative prompt when there is no concept to remove
QWEN_IMAGE_MAX_SEQUENCE_LENGTH = 512  # QwenImagePipeline.__call__'s default
# the transformer's joint attention: image and text projections, as FLUX (the Flow-GRPO / DiffusionNFT targets);
# QWEN_IMAGE_MLP_LORA_TARGETS adds the feed-forward layers of both streams
QWEN_IMAGE_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
QWEN_IMAGE_MLP_LORA_TARGETS = ["img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2"]


def true_cfg_norm_rescale(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Qwen-Image's true CFG: uncond + s (cond - uncond), rescaled per token (last axis) to the norm of cond."""
    comb = uncond + scale * (cond - uncond)
    return comb * (cond.norm(dim=-1, keepdim=True) / comb.norm(dim=-1, keepdim=True))


class QwenImageAdapter(QwenImageEditAdapter):
    """diffusers' QwenImagePipeline: Qwen-Image text-to-image (see the module docstring)."""

    family = "qwen_image"
    is_edit = False

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None) -> None:
        if (height is not None and int(height) <= 0) or (width is not None and int(width) <= 0):
            raise ConfigError(f"height/width must be positive for {type(pipeline).__name__}, got {height}x{width}")
        if max_sequence_length is not None and int(max_sequence_length) < 1:
            raise ConfigError(f"max_sequence_length must be >= 1 (prompt tokens kept), got {max_sequence_length}")
        super().__init__(pipeline, height, width, max_sequence_length or QWEN_IMAGE_MAX_SEQUENCE_LENGTH)

    # -- conditioning -------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        from mmreward.edit import EditPrompt

        prompts = prompt_list(prompts)
        edits = [p for p in prompts if isinstance(p, EditPrompt)]
        if edits:
            raise ConfigError(f"prompt {str(edits[0])!r} comes with a source image, but QwenImagePipeline makes images "
                              "from text; edit with QwenImageEditPipeline (Qwen/Qwen-Image-Edit) or give text prompts")
        pe, mask = self.pipeline.encode_prompt(prompt=[str(p) for p in prompts], device=self.device,
                                               max_sequence_length=self.max_sequence_length)
        pe, mask = self._pad(pe, mask)
        return PromptEmbeds({"prompt_embeds": pe, "prompt_embeds_mask": mask})

    def negative(self) -> PromptEmbeds:
        if self._negative is None:
            self._negative = self.encode([QWEN_IMAGE_NEGATIVE_PROMPT])
        return self._negative

    # -- denoiser -----------------------------------------------------------------------------
    def predict(self, model, x, t, embeds, guidance_scale):
        x = x.to(self.model_dtype)
        if not self.uses_cfg(guidance_scale):
            return self._forward(model, x, t, embeds, guidance_scale).float()
        both = PromptEmbeds.cat([self.negative().expand(len(embeds)), embeds])
        uncond, cond = self._forward(model, torch.cat([x, x]), torch.cat([t, t]), both, guidance_scale).float().chunk(2)
        return true_cfg_norm_rescale(cond, uncond, guidance_scale)

    def _forward(self, model, x, t, embeds, guidance_scale):
        h, w = self._latent_hw()
        mask = embeds.tensors["prompt_embeds_mask"].bool()
        # cut the per-prompt padding back to the batch's longest prompt (its last real token), the padding the
        # pipeline's own batch encoding has; without padding the pipeline passes no mask at all
        positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
        length = max(1, int((mask * positions).max()))
        mask = mask[:, :length]
        guidance = None
        if self.guidance_embeds:
            guidance = torch.full((x.shape[0],), float(guidance_scale), device=x.device, dtype=torch.float32)
        return model(hidden_states=x, timestep=t.to(x.dtype) / 1000, guidance=guidance,
                     encoder_hidden_states_mask=None if bool(mask.all()) else mask,
                     encoder_hidden_states=embeds.tensors["prompt_embeds"][:, :length].to(x.dtype),
                     img_shapes=[[(1, h // 2, w // 2)]] * x.shape[0], return_dict=False)[0]


register_adapter("QwenImagePipeline", "qwen_image", QwenImageAdapter, QWEN_IMAGE_LORA_TARGETS)
