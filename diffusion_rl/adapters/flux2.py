"""diffusers' `Flux2Pipeline` (FLUX.2-dev) and `Flux2KleinPipeline` (FLUX.2-klein base and step-distilled).

What the rollout must reproduce, read from diffusers 0.42's pipeline_flux2.py / pipeline_flux2_klein.py:
- prompts go through the pipeline's own `encode_prompt`: FLUX.2-dev renders Mistral-3's chat template with the
  pipeline's system message, klein Qwen3's with thinking off; both pad to `max_sequence_length` (512) and stack
  three intermediate hidden states (dev: 10, 20, 30; klein: 9, 18, 27) into (B, L, 3 x hidden). Text position
  ids are (0, 0, 0, l) per token; they depend on L only, so they are rebuilt at each call;
- latents are packed 2x2 patches of the VAE latents, (B, H/16 * W/16, 4C) tokens in row-major order, with 4-D
  position ids (t=0, h, w, l=0);
- guidance: FLUX.2-dev is guidance-distilled and the pipeline always passes `guidance_scale` to the
  transformer's guidance embedding (one forward, never CFG); klein passes no guidance and does true CFG with
  the empty prompt when guidance_scale > 1, except for step-distilled checkpoints (`is_distilled`), which ignore
  the guidance scale;
- the schedule: sigmas linspace(1, 1/N, N) shifted with the pipeline's own `compute_empirical_mu(seq_len, N)`
  (BFL's empirical fit, which depends on the number of steps too, unlike FLUX.1's `calculate_shift`);
  few-step klein checkpoints use the same recipe at their own N;
- decoding un-normalises with the VAE's batch-norm running statistics (`AutoencoderKLFlux2.bn`, eps
  `batch_norm_eps`), un-patchifies 2x2 and decodes.

Reference images: both pipelines take `image=` (one image or a list) and append each image's VAE latents (mode,
patchified, batch-norm normalised, packed) after the noisy tokens, in order, with position ids whose time
coordinate is 10 for the first image, 20 for the second, ... (`_prepare_image_ids(scale=10)`: 10 + 10 k); the
output is cut back to the noisy tokens. Prompts given as edit records (`mmreward.edit.EditPrompt`) get their source
images (`EditPrompt.sources`: one, or several from {"source_images": [PATH, ...]} rows) as those references; each
source is resized to the adapter's height x width, so every row of a batch shares one reference grid (the
transformer takes one set of position ids for the batch). The ODE rollout then equals the pipeline called with
`image=[...]` sources of exactly height x width. All prompts of a batch must be edit records or none, with the same
number of source images (the reference tokens of the rows are stacked; otherwise a ConfigError).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from diffusion_rl.adapters.base import PipelineAdapter, PromptEmbeds, Schedule, flow_schedule, prompt_list
from mmreward.errors import ConfigError

FLUX2_MAX_SEQUENCE_LENGTH = 512  # Flux2Pipeline / Flux2KleinPipeline.__call__'s default
REFERENCE_MIN_SIDE = 64  # the pipelines refuse smaller reference images
REFERENCE_TIME_COORD = 10  # `_prepare_image_ids(scale=10)`: reference image k (from 0) is at time 10 + 10 k

# LoRA targets: the joint attention of the double-stream blocks (image and text projections, as FLUX.1) and the
# fused qkv+MLP input projection of the single-stream blocks (Flux2ParallelSelfAttention has no separate
# to_q/to_k/to_v). diffusers' train_dreambooth_lora_flux2_klein.py also trains each single block's output
# projection by listing `single_transformer_blocks.{i}.attn.to_out` per index (its bare suffix `to_out` would hit the
# double-stream blocks' ModuleList, which PEFT cannot wrap); a per-family default cannot know the block count, so
# those stay dense here (add them to model.lora_targets to train them)
FLUX2_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                      "to_qkv_mlp_proj"]


class Flux2Adapter(PipelineAdapter):
    """diffusers' Flux2Pipeline: guidance-embedded flow matching on packed 2x2 latent patches (see module doc)."""

    family = "flux2"
    source_images = "same_count"
    block_classes = ("Flux2TransformerBlock", "Flux2SingleTransformerBlock")

    # -- geometry -----------------------------------------------------------------------------
    def _default_size(self) -> int:
        return int(self.pipeline.default_sample_size) * int(self.pipeline.vae_scale_factor)

    def _size_multiple(self) -> int:
        return int(self.pipeline.vae_scale_factor) * 2  # VAE factor x the 2x2 packing

    def _grid(self) -> tuple[int, int]:
        """Token grid (rows, columns) of the packed latents."""
        m = self._size_multiple()
        return self.height // m, self.width // m

    def latent_shape(self) -> tuple[int, ...]:
        h, w = self._grid()
        return (h * w, int(self.denoiser.config.in_channels))

    # -- guidance -----------------------------------------------------------------------------
    @property
    def guidance_embeds(self) -> bool:
        return bool(getattr(self.denoiser.config, "guidance_embeds", False))

    def uses_cfg(self, guidance_scale: float) -> bool:
        return False  # Flux2Pipeline never runs CFG: the scale goes to the guidance embedding

    def _guidance(self, x: torch.Tensor, guidance_scale: float) -> torch.Tensor | None:
        # the pipeline passes the scale whether or not the transformer embeds it (then it is ignored)
        return torch.full((x.shape[0],), float(guidance_scale), device=x.device, dtype=torch.float32)

    # -- conditioning -------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        from mmreward.edit import EditPrompt

        prompts = prompt_list(prompts)
        edits = [isinstance(p, EditPrompt) for p in prompts]
        if any(edits) and not all(edits):
            raise ConfigError(f"{type(self.pipeline).__name__}: a batch mixes edit records (with a source image) and "
                              "plain prompts; give all prompts of a run as edit records or none")
        pe = self._encode_text([str(p) for p in prompts])
        if not any(edits):
            return PromptEmbeds({"prompt_embeds": pe})
        from mmreward.edit import load_source_image

        if min(self.height, self.width) < REFERENCE_MIN_SIDE:  # Flux2ImageProcessor.check_image_input's limit
            raise ConfigError(f"{type(self.pipeline).__name__} takes reference images of at least {REFERENCE_MIN_SIDE}px "
                              f"a side, and edit records' sources are resized to the output size {self.height}x"
                              f"{self.width}; set model.height and model.width >= {REFERENCE_MIN_SIDE}")
        counts = sorted({len(p.sources) for p in prompts})
        if len(counts) > 1:
            raise ConfigError(f"{type(self.pipeline).__name__}: the edit records of a batch have {counts} source images; "
                              "their reference tokens cannot be stacked: give every record of a run the same number "
                              "of source images")
        # every prompt's references in order: (B x K, 3, H, W) -> tokens (B, K x h x w, 4C)
        latents = self.encode_reference([load_source_image(s) for p in prompts for s in p.sources])
        return PromptEmbeds({"prompt_embeds": pe,
                             "image_latents": latents.reshape(len(prompts), -1, latents.shape[-1])})

    def _encode_text(self, prompts: list[str]) -> torch.Tensor:
        pe, _ = self.pipeline.encode_prompt(prompt=prompts, device=self.device,
                                            max_sequence_length=self.max_sequence_length or FLUX2_MAX_SEQUENCE_LENGTH)
        return pe

    @torch.no_grad()
    def encode_reference(self, images: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """Packed reference latents (B, tokens, 4C) of images (B, 3, H, W), or a list of (3, H_i, W_i), in [0, 1], as
        the pipeline makes them from a reference image of the adapter's height x width."""
        pipe = self.pipeline
        # tensors resize with the default mode (the pipeline's "crop" takes PIL images only); at height x width
        # already, both leave the pixels as they are. One at a time: sources may differ in size
        pixels = torch.cat([pipe.image_processor.preprocess(im[None].float(), self.height, self.width) for im in images])
        latents = pipe._encode_vae_image(pixels.to(self.device, pipe.vae.dtype), generator=None)
        return latents.flatten(2).transpose(1, 2)  # (B, 4C, h, w) -> (B, h*w, 4C), row-major as `_pack_latents`

    def negative(self) -> PromptEmbeds:
        if self._negative is None:
            self._negative = PromptEmbeds({"prompt_embeds": self._encode_text([""])})  # text only
        return self._negative

    # -- denoiser -----------------------------------------------------------------------------
    def schedule(self, num_steps: int) -> Schedule:
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        sched = self.pipeline.scheduler
        sigmas = None if sched.config.get("use_flow_sigmas", False) else np.linspace(1.0, 1 / num_steps, num_steps)
        mu = compute_empirical_mu(image_seq_len=self.latent_shape()[0], num_steps=num_steps)
        sched.set_timesteps(num_steps, sigmas=sigmas, mu=mu)  # what retrieve_timesteps does with these arguments
        return flow_schedule(sched)

    def _ids(self, rows: int, cols: int, t: int, device) -> torch.Tensor:
        """(rows*cols, 4) position ids (t, h, w, 0) in row-major order, the pipeline's cartesian product."""
        h, w = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        ids = torch.stack([torch.full_like(h, t), h, w, torch.zeros_like(h)], dim=-1)
        return ids.reshape(-1, 4).to(device)

    def _forward(self, model, x, t, embeds, guidance_scale):
        pe = embeds.tensors["prompt_embeds"].to(x.dtype)
        length = pe.shape[1]
        txt_ids = torch.stack([torch.zeros(length, dtype=torch.long)] * 3 + [torch.arange(length)], -1).to(x.device)
        img_ids = self._ids(*self._grid(), 0, x.device)
        hidden = x
        source = embeds.tensors.get("image_latents")
        if source is not None:  # reference tokens after the noisy ones, each on the same grid at time 10, 20, ...
            hidden = torch.cat([x, source.to(x.dtype)], dim=1)
            count = source.shape[1] // x.shape[1]
            img_ids = torch.cat([img_ids, *[self._ids(*self._grid(), REFERENCE_TIME_COORD * (k + 1), x.device)
                                            for k in range(count)]])
        out = model(hidden_states=hidden, timestep=t.to(x.dtype) / 1000, guidance=self._guidance(x, guidance_scale),
                    encoder_hidden_states=pe, txt_ids=txt_ids[None], img_ids=img_ids[None], return_dict=False)[0]
        return out[:, : x.shape[1]]

    def predict(self, model, x, t, embeds, guidance_scale):
        if not self.uses_cfg(guidance_scale) or "image_latents" not in embeds.tensors:
            return super().predict(model, x, t, embeds, guidance_scale)
        # CFG with a reference image: the negative prompt sees the same reference, as in the pipeline
        neg = PromptEmbeds({**self.negative().expand(len(embeds)).tensors,
                            "image_latents": embeds.tensors["image_latents"]})
        x = x.to(self.model_dtype)
        both = PromptEmbeds.cat([neg, embeds])
        uncond, cond = self._forward(model, torch.cat([x, x]), torch.cat([t, t]), both, guidance_scale).float().chunk(2)
        return uncond + guidance_scale * (cond - uncond)

    # -- decoding -----------------------------------------------------------------------------
    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        h, w = self._grid()
        z = latents.transpose(1, 2).reshape(latents.shape[0], -1, h, w)  # tokens back to (B, 4C, h, w)
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(z.device, z.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(z.device, z.dtype)
        z = z * std + mean
        b, c4 = z.shape[:2]  # un-patchify: (B, C*2*2, h, w) -> (B, C, 2h, 2w)
        z = z.reshape(b, c4 // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c4 // 4, 2 * h, 2 * w)
        return vae.decode(z, return_dict=False)[0]


class Flux2KleinAdapter(Flux2Adapter):
    """diffusers' Flux2KleinPipeline: no guidance embedding; true CFG with the empty prompt when
    guidance_scale > 1, except for step-distilled checkpoints (`is_distilled`)."""

    family = "flux2_klein"

    @property
    def is_distilled(self) -> bool:
        return bool(self.pipeline.config.get("is_distilled", False))

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0 and not self.is_distilled

    def _guidance(self, x, guidance_scale):
        return None


# after the classes: the package's __init__ imports this module at its end, once register_adapter exists
from diffusion_rl.adapters.registry import register_adapter  # noqa: E402

register_adapter("Flux2Pipeline", "flux2", Flux2Adapter, FLUX2_LORA_TARGETS)
register_adapter("Flux2KleinPipeline", "flux2_klein", Flux2KleinAdapter, FLUX2_LORA_TARGETS)
