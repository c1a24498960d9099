"""Qwen-Image-2.1 text-to-image and edits: diffusers' `QwenImage21Pipeline` (Qwen/Qwen-Image-2.1).

What it shares with Qwen-Image (`QwenImageAdapter`, subclassed here): the flow-matching schedule (sigmas
linspace(1, 1/N, N), dynamic shift mu = calculate_shift(image tokens) with the scheduler's base/max settings),
per-prompt embeddings zero-padded to `max_sequence_length` with a mask so that cached embeddings stack, the
negative prompt " " for true CFG, the VAE's per-channel mean/std un-normalisation, and the size rule (multiples of
2 x the VAE factor). What differs, as `QwenImage21Pipeline.__call__` (diffusers 0.42.1) samples:

- prompts: a Qwen3-VL reads the pipeline's t2i template; the condition is its last decoder layer's states before
  the final norm, after the system turn (`encode_prompt`, which has no length cut). Each prompt is encoded alone,
  which is what a one-prompt pipeline call encodes.
- latents: unpatched, (B, H/16 * W/16, C) -- one token per 16x16 pixel tile, `in_channels` (64 released) each.
- transformer: one joint sequence, text first and the target image's tokens after it, block-causal attention, the
  text modulated from t = 0 (`causal_condition`), and `img_mask` marking the VLM's image slots (one per 2x2 group
  of target tokens). The rotary frame position of the image follows the text length *including padding*, and the
  transformer reads one layout for the whole batch (`img_mask[0]`), so a padded batch is not what the model gives
  each prompt alone. `_forward` therefore runs one transformer call per distinct prompt length, each without
  padding or mask: every sample's prediction is the pipeline's for that prompt alone, whatever else is in the
  batch (the rollout's and the training path's batches differ). GRPO's groups share prompts, so a batch usually
  has a few lengths.
- CFG: plain true CFG, uncond + s (cond - uncond), no norm rescale (`PipelineAdapter.predict`); `guidance_scale`
  is the pipeline's `true_cfg_scale` (the model card samples without guidance: 1.0). The KV cache of the text
  prefix (`use_kv_cache`) is an inference speed-up whose outputs agree with the uncached forward to float
  rounding; the adapter runs the uncached forward, which is also what gradients flow through.
- schedule: the pipeline's `sample_sigmas` (model_index.json) when its length is the run's step count, else
  linspace(1, 1/N, N) -- what the pipeline does when called with `sigmas=` or without `sample_sigmas`.
- decoding: the VAE is RGBA. `decode` gives RGB in [0, 1] composited over white (what the image looks like on a
  page, and what the pipeline's own vision encoder does with RGBA inputs); `decode_rgba` keeps the alpha.

The ODE rollout is then `QwenImage21Pipeline(prompt, negative_prompt=" ", true_cfg_scale=g, height, width,
sigmas=..., latents=x_T, use_kv_cache=False)` per prompt.

Edits: prompts given as edit records (`mmreward.edit.EditPrompt`) get their source as the pipeline's condition
image, prepared as `__call__` prepares one at an input size of the output's height x width (the size
`output_resolution` gives a source of the output's shape; other sources are resized to it, so every row of a
batch has one condition grid): RGBA, resized for the Qwen3-VL (which reads it in the ti2i template, flattened on
white by `encode_prompt`), VAE-encoded to tokens placed before the noisy ones (`img_shapes` lists both grids,
`img_mask` marks the VLM's image slots). CFG's negative prompt " " is encoded with the same image, per row. The ODE
rollout then equals `QwenImage21Pipeline(prompt, image=source, output_resolution=H, height=H, width=W, ...)` for
an H x W source. All prompts of a batch are edit records or none (a mixed batch is a ConfigError); one condition
image per prompt (the pipeline takes up to 10).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from diffusion_rl.adapters.base import PipelineAdapter, PromptEmbeds, Schedule, flow_schedule, prompt_list
from diffusion_rl.adapters.qwen_image import QWEN_IMAGE_NEGATIVE_PROMPT, QwenImageAdapter
from diffusion_rl.adapters.registry import register_adapter
from mmreward.errors import ConfigError

QWEN_IMAGE21_DEFAULT_SIZE = 1024  # QwenImage21Pipeline.__call__'s output_resolution default
# the single-stream blocks' attention (diffusers' _tp_plan names them); QWEN_IMAGE21_MLP_LORA_TARGETS adds the SwiGLU
QWEN_IMAGE21_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
QWEN_IMAGE21_MLP_LORA_TARGETS = ["img_mlp.proj", "img_mlp.gate_layer", "img_mlp.out"]


class QwenImage21Adapter(QwenImageAdapter):
    """diffusers' QwenImage21Pipeline: Qwen-Image-2.1 text-to-image, and edits from edit records (see the module
    docstring)."""

    family = "qwen_image21"
    block_classes = ("QwenImage21TransformerBlock",)
    is_edit = False

    def _default_size(self) -> int:
        return QWEN_IMAGE21_DEFAULT_SIZE

    def latent_shape(self):
        h, w = self._latent_hw()
        return (h * w, int(self.denoiser.config.in_channels))

    def schedule(self, num_steps: int) -> Schedule:
        from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_shift

        sched = self.pipeline.scheduler
        sigmas = getattr(self.pipeline.config, "sample_sigmas", None)
        if sigmas is None or len(sigmas) != num_steps:
            sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        mu = calculate_shift(self.latent_shape()[0], sched.config.get("base_image_seq_len", 256),
                             sched.config.get("max_image_seq_len", 4096), sched.config.get("base_shift", 0.5),
                             sched.config.get("max_shift", 1.15))
        sched.set_timesteps(sigmas=list(sigmas), mu=mu)
        return flow_schedule(sched)

    # -- conditioning -------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        from mmreward.edit import EditPrompt

        prompts = prompt_list(prompts)
        edits = [isinstance(p, EditPrompt) for p in prompts]
        if any(edits) and not all(edits):
            raise ConfigError(f"{type(self.pipeline).__name__}: a batch mixes edit records (with a source image) and "
                              "plain prompts; give all prompts of a run as edit records or none")
        rows = []
        for p in prompts:
            if not isinstance(p, EditPrompt):
                rows.append(self._encode_text(str(p)))
                continue
            image, latents = self._condition(p.source)
            row = self._encode_text(str(p), image)
            neg = self._encode_text(QWEN_IMAGE_NEGATIVE_PROMPT, image)
            rows.append(PromptEmbeds({**row.tensors, "image_latents": latents,
                                      **{"negative_" + k: v for k, v in neg.tensors.items()}}))
        return PromptEmbeds.cat(rows)

    def _encode_text(self, text: str, image=None) -> PromptEmbeds:
        """One prompt (with its condition image) as the pipeline encodes it, padded to max_sequence_length."""
        pe, mask, pad_mask = self.pipeline.encode_prompt(prompt=[text], image=None if image is None else [image],
                                                         device=self.device)
        pe, mask = self._pad(pe, mask)
        pad_mask = torch.cat([pad_mask, pad_mask.new_zeros(1, mask.shape[1] - pad_mask.shape[1])], dim=1)
        return PromptEmbeds({"prompt_embeds": pe, "prompt_embeds_mask": mask, "image_pad_mask": pad_mask})

    def _condition(self, source):
        """The source as QwenImage21Pipeline.__call__ prepares a condition image at an input size of the output's
        height x width (what `output_resolution` gives a source of that shape): RGBA, resized for the Qwen3-VL,
        VAE-encoded (mode, the VAE's mean/std) and flattened into tokens for the transformer."""
        from PIL import Image

        pipe = self.pipeline
        with Image.open(source) as img:
            img = img.convert("RGBA")
        prompt_image = pipe.image_processor.resize(img, width=self.width, height=self.height)
        pixels = pipe.image_processor.preprocess(img, width=self.width, height=self.height).unsqueeze(2)
        latents = pipe._encode_vae_image(pixels.to(self.device, pipe.vae.dtype), generator=None)
        b, c, _, h, w = latents.shape
        return prompt_image, pipe._pack_latents(latents, b, c, h, w)

    def negative(self) -> PromptEmbeds:
        if self._negative is None:
            self._negative = self.encode([QWEN_IMAGE_NEGATIVE_PROMPT])
        return self._negative

    # -- denoiser -----------------------------------------------------------------------------
    def predict(self, model, x, t, embeds, guidance_scale):
        """Plain true CFG (no norm rescale) in one batched forward; edit rows carry their own negative prompt,
        encoded with their condition image as the pipeline encodes it."""
        tensors = embeds.tensors
        if not self.uses_cfg(guidance_scale) or "negative_prompt_embeds" not in tensors:
            return PipelineAdapter.predict(self, model, x, t, embeds, guidance_scale)
        x = x.to(self.model_dtype)
        neg = PromptEmbeds({**tensors, **{k: tensors["negative_" + k]
                                          for k in ("prompt_embeds", "prompt_embeds_mask", "image_pad_mask")}})
        both = PromptEmbeds.cat([neg, embeds])
        uncond, cond = self._forward(model, torch.cat([x, x]), torch.cat([t, t]), both, guidance_scale).float().chunk(2)
        return uncond + guidance_scale * (cond - uncond)

    def _forward(self, model, x, t, embeds, guidance_scale):
        h, w = self._latent_hw()
        tensors = embeds.tensors
        lengths = tensors["prompt_embeds_mask"].bool().sum(dim=1)
        pad_mask = tensors["image_pad_mask"].bool()
        condition = tensors.get("image_latents")
        # one call per sequence layout: prompt length and where the condition image's slots are
        layouts, which = torch.unique(torch.cat([lengths[:, None], pad_mask.long()], dim=1), dim=0, return_inverse=True)
        outs, order = [], []
        for k in range(layouts.shape[0]):
            rows = (which == k).nonzero().squeeze(1)
            n, length = int(rows.numel()), max(1, int(lengths[rows[0]]))
            img_mask = torch.cat([pad_mask[rows, :length],
                                  torch.ones(n, h * w // 4, dtype=torch.bool, device=x.device)], dim=1)
            hidden, shapes = x[rows], [(1, h, w)]
            if condition is not None:  # the condition image's tokens first, at the output's grid
                hidden, shapes = torch.cat([condition[rows].to(x.dtype), hidden], dim=1), [(1, h, w), (1, h, w)]
            out = model(hidden_states=hidden, timestep=t[rows].to(x.dtype) / 1000,
                        encoder_hidden_states=tensors["prompt_embeds"][rows, :length].to(x.dtype),
                        encoder_hidden_states_mask=None, img_shapes=[shapes] * n, img_mask=img_mask,
                        return_dict=False)[0]
            outs.append(out[:, -x.shape[1]:])
            order.append(rows)
        if len(outs) == 1:
            return outs[0]
        return torch.cat(outs)[torch.argsort(torch.cat(order))]

    # -- decoding -----------------------------------------------------------------------------
    def decode(self, latents: torch.Tensor, *, keep_graph: bool = False) -> torch.Tensor:
        """RGB images (B, 3, H, W) in [0, 1], the decoded RGBA composited over white."""
        rgba = self.decode_rgba(latents, keep_graph=keep_graph)
        if rgba.shape[1] != 4:
            return rgba
        alpha = rgba[:, 3:]
        return rgba[:, :3] * alpha + (1 - alpha)

    def decode_rgba(self, latents: torch.Tensor, *, keep_graph: bool = False) -> torch.Tensor:
        """What the VAE decodes, (B, 4, H, W) RGBA in [0, 1] (the pipeline's output_type="pt" images)."""
        return PipelineAdapter.decode(self, latents, keep_graph=keep_graph)

    # _decode_latents is Qwen-Image's: the pipeline's own _unpack_latents undoes 2.1's unpatched layout


register_adapter("QwenImage21Pipeline", "qwen_image21", QwenImage21Adapter, QWEN_IMAGE21_LORA_TARGETS)
