"""Z-Image and Z-Image-Turbo (diffusers' ZImagePipeline): a single-stream DiT on unpacked (C, H', W') latents.

What the pipeline (diffusers 0.42, pipelines/z_image/pipeline_z_image.py) does, and so what this adapter does:
- prompts go through Qwen3's chat template (thinking on) and the text encoder; the caption features are the
  second-to-last hidden state at the unpadded tokens, so every prompt has its own length. We keep them right-
  padded to `max_sequence_length` with their lengths, and hand the transformer the unpadded list it expects;
- the transformer sees the latents as a list of (C, 1, H', W') items and the time as (1000 - t) / 1000, and
  predicts minus the flow velocity (the pipeline negates its output before the Euler step);
- CFG is on for guidance_scale > 0 and reads `cond + g (cond - uncond)` (so g = 0 is the conditional model
  alone and g = 1 is not "off"), per sample; `cfg_normalization` caps the guided prediction's norm at that
  multiple of the conditional one's (per sample, over all its elements) and `cfg_truncation` drops guidance
  where (1000 - t) / 1000 exceeds it (the pipeline's defaults, False and 1.0, change nothing);
- the schedule is FlowMatchEulerDiscreteScheduler with sigmas linspace(1, 1/N, N) and the sequence-length `mu`
  (used only when the scheduler shifts dynamically; Z-Image-Turbo's config has a static shift of 3.0);
- decoding un-normalises with the VAE's scaling and shift factors.

Z-Image-Turbo is the few-step distilled checkpoint: the model card samples it with 9 steps and
guidance_scale=0.0 (no CFG), the base Z-Image with CFG; both are the same pipeline, so one adapter serves both
and the run's `sample.num_steps` / `sample.guidance_scale` pick the regime.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffusion_rl.adapters.base import PipelineAdapter, PromptEmbeds, Schedule, flow_schedule, prompt_list
from mmreward.errors import ConfigError

Z_IMAGE_MAX_SEQUENCE_LENGTH = 512  # ZImagePipeline.__call__'s default
Z_IMAGE_DEFAULT_SIZE = 1024  # ZImagePipeline.__call__: height = height or 1024
# LoRA targets: the attention projections and the SwiGLU feed-forward of every block (main, noise- and
# context-refiner), as Flow-Factory's ZImageAdapter.default_target_modules
# (X-GenGroup/Flow-Factory@5405453 src/flow_factory/models/z_image/z_image.py)
Z_IMAGE_LORA_TARGETS = ["attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0",
                        "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]


class ZImageAdapter(PipelineAdapter):
    """diffusers' ZImagePipeline (Z-Image, Z-Image-Turbo); see the module docstring for what it reproduces.

    `cfg_normalization` (0/False: off) and `cfg_truncation` (1.0: off) are the pipeline's call arguments of the
    same names, set on the adapter (their defaults are the pipeline's)."""

    family = "z_image"
    block_classes = ("ZImageTransformerBlock",)

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, cfg_normalization: float = 0.0,
                 cfg_truncation: float = 1.0) -> None:
        super().__init__(pipeline, height, width, max_sequence_length)
        self.cfg_normalization = float(cfg_normalization)
        self.cfg_truncation = float(cfg_truncation)
        if self.cfg_normalization < 0:
            raise ConfigError(f"cfg_normalization must be >= 0 (0 = off), got {cfg_normalization}")

    def _default_size(self) -> int:
        return Z_IMAGE_DEFAULT_SIZE

    def _size_multiple(self) -> int:
        # the pipeline's check (vae_scale_factor * 2): the transformer patchifies the latents 2 x 2
        return int(self.pipeline.vae_scale_factor) * 2

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 0.0  # ZImagePipeline.do_classifier_free_guidance

    def latent_shape(self) -> tuple[int, ...]:
        vsf = int(self.pipeline.vae_scale_factor)
        return (int(self.denoiser.config.in_channels), 2 * (self.height // (vsf * 2)), 2 * (self.width // (vsf * 2)))

    def schedule(self, num_steps: int) -> Schedule:
        from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift, get_default_z_image_sigmas

        sched = self.pipeline.scheduler
        _, h, w = self.latent_shape()
        cfg = sched.config
        mu = calculate_shift((h // 2) * (w // 2), cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096),
                             cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15))
        sched.set_timesteps(sigmas=get_default_z_image_sigmas(num_steps), mu=mu)
        return flow_schedule(sched)

    # -- conditioning -------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        """Caption features right-padded to max_sequence_length, with each prompt's token count."""
        length = self.max_sequence_length or Z_IMAGE_MAX_SEQUENCE_LENGTH
        feats, _ = self.pipeline.encode_prompt(prompt=prompt_list(prompts), device=self.device,
                                               do_classifier_free_guidance=False, max_sequence_length=length)
        pe = feats[0].new_zeros(len(feats), length, feats[0].shape[-1])
        for i, f in enumerate(feats):
            pe[i, : f.shape[0]] = f
        lengths = torch.tensor([f.shape[0] for f in feats], dtype=torch.long, device=pe.device)
        return PromptEmbeds({"prompt_embeds": pe, "prompt_lengths": lengths})

    def predict(self, model, x, t, embeds, guidance_scale):
        x = x.to(self.model_dtype)
        if not self.uses_cfg(guidance_scale):
            return self._forward(model, x, t, embeds, guidance_scale).float()
        # cfg_truncation: samples whose normalised time passes it are sampled without guidance (the pipeline
        # decides per step; a training batch may mix steps, so here it is per sample)
        guided = (1000 - t.float()) / 1000 <= self.cfg_truncation
        if bool(guided.all()):
            return self._guided(model, x, t, embeds, guidance_scale)
        if not bool(guided.any()):
            return self._forward(model, x, t, embeds, guidance_scale).float()
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        plain, idx = (~guided).nonzero().flatten(), guided.nonzero().flatten()
        out[plain] = self._forward(model, x[plain], t[plain], embeds.index(plain), guidance_scale).float()
        out[idx] = self._guided(model, x[idx], t[idx], embeds.index(idx), guidance_scale)
        return out

    def _guided(self, model, x, t, embeds, guidance_scale):
        # one call on [cond..., uncond...], as the pipeline batches them
        both = PromptEmbeds.cat([embeds, self.negative().expand(len(embeds))])
        cond, uncond = self._forward(model, torch.cat([x, x]), torch.cat([t, t]), both, guidance_scale).float().chunk(2)
        pred = cond + guidance_scale * (cond - uncond)
        if self.cfg_normalization > 0:
            dims = tuple(range(1, pred.ndim))
            cap = torch.linalg.vector_norm(cond, dim=dims, keepdim=True) * self.cfg_normalization
            norm = torch.linalg.vector_norm(pred, dim=dims, keepdim=True)
            pred = torch.where(norm > cap, pred * (cap / norm), pred)
        return pred

    def _forward(self, model, x, t, embeds, guidance_scale):
        pe, lengths = embeds.tensors["prompt_embeds"], embeds.tensors["prompt_lengths"].tolist()
        caps = [pe[i, :n].to(x.dtype) for i, n in enumerate(lengths)]
        timestep = (1000 - t.float()) / 1000  # the pipeline's normalised time, fp32
        out = model(list(x.unsqueeze(2).unbind(0)), timestep, caps, return_dict=False)[0]
        # the transformer predicts x_0 - noise (towards the data); the pipeline negates it into the Euler step's
        # d x / d sigma = noise - x_0, the velocity our flow kernels take
        return -torch.stack(out).squeeze(2)

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        return vae.decode(latents / vae.config.scaling_factor + vae.config.shift_factor, return_dict=False)[0]


def _register() -> None:
    from diffusion_rl.adapters.registry import register_adapter

    register_adapter("ZImagePipeline", ZImageAdapter.family, ZImageAdapter, Z_IMAGE_LORA_TARGETS)


_register()
