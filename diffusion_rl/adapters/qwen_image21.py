"""Qwen-Image-2.1 text-to-image: diffusers' `QwenImage21Pipeline` (Qwen/Qwen-Image-2.1).

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
sigmas=..., latents=x_T, use_kv_cache=False)` per prompt. Edits (the pipeline's `image=` condition images) are
not covered by this adapter: text prompts only.
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
    """diffusers' QwenImage21Pipeline: Qwen-Image-2.1 text-to-image (see the module docstring)."""

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

        rows = []
        for p in prompt_list(prompts):
            if isinstance(p, EditPrompt):
                raise ConfigError(f"prompt {str(p)!r} comes with a source image, but the qwen_image21 adapter makes "
                                  "images from text (the pipeline's image= edits are not covered); give text prompts")
            pe, mask, _ = self.pipeline.encode_prompt(prompt=[str(p)], device=self.device)
            pe, mask = self._pad(pe, mask)
            rows.append(PromptEmbeds({"prompt_embeds": pe, "prompt_embeds_mask": mask}))
        return PromptEmbeds.cat(rows)

    def negative(self) -> PromptEmbeds:
        if self._negative is None:
            self._negative = self.encode([QWEN_IMAGE_NEGATIVE_PROMPT])
        return self._negative

    # -- denoiser -----------------------------------------------------------------------------
    predict = PipelineAdapter.predict  # plain true CFG (no norm rescale), one batched forward for cond + uncond

    def _forward(self, model, x, t, embeds, guidance_scale):
        h, w = self._latent_hw()
        tensors = embeds.tensors
        lengths = tensors["prompt_embeds_mask"].bool().sum(dim=1)
        outs, order = [], []
        for length in lengths.unique().tolist():  # one call per prompt length (see the module docstring)
            rows = (lengths == length).nonzero().squeeze(1)
            n, length = int(rows.numel()), max(1, int(length))
            img_mask = torch.cat([torch.zeros(n, length, dtype=torch.bool, device=x.device),
                                  torch.ones(n, h * w // 4, dtype=torch.bool, device=x.device)], dim=1)
            out = model(hidden_states=x[rows], timestep=t[rows].to(x.dtype) / 1000,
                        encoder_hidden_states=tensors["prompt_embeds"][rows, :length].to(x.dtype),
                        encoder_hidden_states_mask=None, img_shapes=[[(1, h, w)]] * n, img_mask=img_mask,
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
