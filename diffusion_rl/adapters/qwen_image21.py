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

Edits: prompts given as edit records (`mmreward.edit.EditPrompt`) condition on their source images, one or several
(`EditPrompt.sources`, from {"source_image": PATH} or {"source_images": [PATH, ...]} rows, the record format of the
QwenImageEditPlus adapter), prepared as `QwenImage21Pipeline.__call__(image=[...], output_resolution=R)` prepares
its list of condition images, with R the output's side (round(sqrt(H x W)) for a non-square output, which
`calculate_dimensions` maps back to H x W):
- each image, as RGBA, at the input size `calculate_dimensions(R^2, its aspect ratio)`: resized (PIL) for the
  Qwen3-VL and VAE-encoded (mode, the VAE's mean/std) from the original (one batched VAE call; the pipeline
  encodes each image alone, which gives the same latents to float rounding);
- the prompt: the ti2i template with one "<imageK><|vision_start|><|image_pad|><|vision_end|>" block per image,
  space-separated, in order (`_get_qwen_prompt_embeds`, which flattens RGBA on white for the VLM); CFG's negative
  prompt " " is encoded with the same images, per row;
- the transformer: every image's tokens, in order, before the noisy ones, dropped into the VLM's image slots
  (`img_mask`), and `img_shapes` = [each condition grid, ..., the target grid].
The rows of a batch stack, so every condition image must have the output's aspect ratio (its input size is then H x
W; another ratio would give another grid): a source of another shape is a ConfigError naming the aspect ratio to
crop to (squashing it to H x W, as this adapter once did for its one image, is not what the pipeline does). Records with different numbers of images may share a batch:
the condition tokens are zero-padded to 4 x max_sequence_length (each VLM image slot stands for 2x2 tokens, so
the images of any record that fits the prompt budget fit) and each forward groups rows by layout and cuts its
rows' tokens back. Too many images for `model.max_sequence_length`, a missing or unreadable source, and an output
size whose grid the VLM's image processor reads differently (its min/max pixels) are ConfigErrors naming the fix.
The ODE rollout then equals `QwenImage21Pipeline(prompt, image=[sources...], output_resolution=R, height=H,
width=W, use_kv_cache=False, ...)` called per prompt. All prompts of a batch are edit records or none (a mixed
batch is a ConfigError).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from diffusion_rl.adapters.base import (
    PipelineAdapter,
    PromptEmbeds,
    Schedule,
    flow_schedule,
    open_source_image,
    prompt_list,
)
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
    source_images = "any"
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
            images, latents = self._conditions(p.sources)
            row = self._encode_text(str(p), images)
            neg = self._encode_text(QWEN_IMAGE_NEGATIVE_PROMPT, images)
            # zero-padded to a fixed length so that records with different numbers of images stack: the slot check
            # in _encode_text bounds the tokens (4 per slot, slots < max_sequence_length)
            latents = torch.cat([latents, latents.new_zeros(1, 4 * self.max_sequence_length - latents.shape[1],
                                                            latents.shape[2])], dim=1)
            rows.append(PromptEmbeds({**row.tensors, "image_latents": latents,
                                      **{"negative_" + k: v for k, v in neg.tensors.items()}}))
        return PromptEmbeds.cat(rows)

    def _encode_text(self, text: str, images: list | None = None) -> PromptEmbeds:
        """One prompt (with its condition images) as the pipeline encodes it, padded to max_sequence_length."""
        pe, mask, pad_mask = self.pipeline.encode_prompt(prompt=[text], image=images, device=self.device)
        if images:
            self._check_slots(len(images), pe.shape[1], int(pad_mask.sum()))
        pe, mask = self._pad(pe, mask)
        pad_mask = torch.cat([pad_mask, pad_mask.new_zeros(1, mask.shape[1] - pad_mask.shape[1])], dim=1)
        return PromptEmbeds({"prompt_embeds": pe, "prompt_embeds_mask": mask, "image_pad_mask": pad_mask})

    def _check_slots(self, count: int, length: int, slots: int) -> None:
        """The encoded prompt has room for the images, and the VLM gave each image one slot per 2x2 latent tokens
        (otherwise the transformer cannot drop the latents into the slots)."""
        h, w = self._latent_hw()
        name = type(self.pipeline).__name__
        if length > self.max_sequence_length:
            raise ConfigError(
                f"{name}: an edit record with {count} condition image(s) at {self.height}x{self.width} encodes to "
                f"{length} prompt tokens (each image takes {h * w // 4} image slots), more than "
                f"model.max_sequence_length={self.max_sequence_length}; give the record fewer source images or raise "
                "model.max_sequence_length")
        if slots != count * (h * w // 4):
            raise ConfigError(
                f"{name}: the text encoder's image processor read {count} condition image(s) of {self.height}x"
                f"{self.width} as {slots} image slots, not {count * (h * w // 4)} (one per 32x32 pixels): the output "
                "size is outside the processor's min_pixels/max_pixels; choose model.height/model.width within them")

    def _output_resolution(self) -> int:
        """The pipeline's `output_resolution` whose input size for an output-shaped source is height x width."""
        return round(math.sqrt(self.height * self.width))

    def _conditions(self, sources: Sequence[str]) -> tuple[list, torch.Tensor]:
        """The sources as QwenImage21Pipeline.__call__ prepares its list of condition images (see the module
        docstring): the VLM's resized copies, and the VAE tokens (1, K x h x w, C) of all images in order."""
        from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_dimensions

        pipe = self.pipeline
        resolution = self._output_resolution()
        prompt_images, pixels = [], []
        for path in sources:
            img = open_source_image(path, type(pipe).__name__, "RGBA")
            size = calculate_dimensions(resolution * resolution, img.size[0] / img.size[1])[:2]
            if size != (self.width, self.height):
                raise ConfigError(
                    f"{type(pipe).__name__}: source image {path!r} is {img.size[0]}x{img.size[1]} (width x height); "
                    f"the pipeline would condition on it at {size[0]}x{size[1]}, not at the output's {self.width}x"
                    f"{self.height}, and the rows of a batch share one condition grid: crop or pad the source "
                    f"images to the output's aspect ratio {self.width}:{self.height} (or set model.height/"
                    "model.width to the sources' shape)")
            prompt_images.append(pipe.image_processor.resize(img, width=self.width, height=self.height))
            pixels.append(pipe.image_processor.preprocess(img, width=self.width, height=self.height))
        # the pipeline encodes each image alone; one batched VAE call gives the same per-image latents
        latents = pipe._encode_vae_image(torch.cat(pixels).unsqueeze(2).to(self.device, pipe.vae.dtype), generator=None)
        k, c, _, h, w = latents.shape
        return prompt_images, pipe._pack_latents(latents, k, c, h, w).reshape(1, k * h * w, c)  # image after image

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
        # one call per sequence layout: prompt length and where the condition images' slots are
        layouts, which = torch.unique(torch.cat([lengths[:, None], pad_mask.long()], dim=1), dim=0, return_inverse=True)
        outs, order = [], []
        for k in range(layouts.shape[0]):
            rows = (which == k).nonzero().squeeze(1)
            n, length = int(rows.numel()), max(1, int(lengths[rows[0]]))
            img_mask = torch.cat([pad_mask[rows, :length],
                                  torch.ones(n, h * w // 4, dtype=torch.bool, device=x.device)], dim=1)
            hidden, shapes = x[rows], [(1, h, w)]
            if condition is not None:  # every condition image's tokens first, in order, each on the output's grid
                count = 4 * int(pad_mask[rows[0]].sum()) // (h * w)
                hidden = torch.cat([condition[rows, : count * h * w].to(x.dtype), hidden], dim=1)
                shapes = [(1, h, w)] * (count + 1)
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
