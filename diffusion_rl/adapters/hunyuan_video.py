"""diffusers' `HunyuanVideoPipeline` (hunyuanvideo-community/HunyuanVideo), DanceGRPO's headline video model.
Same latent geometry as Wan ((C, T', H', W') with T' = (T - 1) / 4 + 1, H' = H / 8), so it reuses WanAdapter's
checks and shapes; what differs:

- two text encoders through the pipeline's own `encode_prompt`: the Llama encoder's third-to-last hidden
  states under the pipeline's prompt template (DEFAULT_PROMPT_TEMPLATE, the template cropped off at
  `crop_start`), its attention mask (the transformer attends to the prompt's real tokens only), and CLIP's
  pooled output;
- the checkpoint is guidance-distilled like FLUX.1-dev: `guidance_scale` is an input of the transformer
  (embedded as guidance_scale x 1000, as the pipeline does), one forward per step and no CFG;
- the schedule is the pipeline's own: FlowMatchEulerDiscreteScheduler (shift 7 for the released model) at
  sigmas linspace(1, 0, N + 1)[:-1], so the ODE rollout is exactly HunyuanVideoPipeline's sampling;
- decoding divides by the VAE's `scaling_factor` (no per-channel statistics).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from diffusion_rl.adapters.base import PromptEmbeds, Schedule, flow_schedule, prompt_list
from diffusion_rl.adapters.wan import WanAdapter

HUNYUAN_DEFAULT_HEIGHT, HUNYUAN_DEFAULT_WIDTH, HUNYUAN_DEFAULT_FRAMES = 720, 1280, 129  # the pipeline's defaults
HUNYUAN_MAX_SEQUENCE_LENGTH = 256  # HunyuanVideoPipeline.encode_prompt's default (tokens after the template)


class HunyuanVideoAdapter(WanAdapter):
    """diffusers' HunyuanVideoPipeline: guidance-distilled flow matching on 5-D video latents."""

    family = "hunyuan_video"
    block_classes = ("HunyuanVideoTransformerBlock", "HunyuanVideoSingleTransformerBlock")
    fps = 24.0  # the official HunyuanVideo sampler saves its clips at 24 fps

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None) -> None:
        super().__init__(pipeline, height or HUNYUAN_DEFAULT_HEIGHT, width or HUNYUAN_DEFAULT_WIDTH,
                         max_sequence_length, num_frames or HUNYUAN_DEFAULT_FRAMES)

    def _size_multiple(self) -> int:
        return self._spatial * int(self.denoiser.config.patch_size)  # 8 x 2 = 16, the pipeline's own check

    @property
    def guidance_embeds(self) -> bool:
        return bool(getattr(self.denoiser.config, "guidance_embeds", False))

    def uses_cfg(self, guidance_scale: float) -> bool:
        # the pipeline's true CFG needs an explicit negative prompt and true_cfg_scale > 1; by default (and in
        # DanceGRPO) it samples with the embedded guidance only, and so do rollouts; a checkpoint without
        # guidance embeddings gets CFG with the empty prompt when guidance_scale > 1, as FLUX's non-distilled ones
        return guidance_scale > 1.0 and not self.guidance_embeds

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

        pe, pooled, mask = self.pipeline.encode_prompt(
            prompt=prompt_list(prompts), prompt_template=DEFAULT_PROMPT_TEMPLATE, device=self.device,
            max_sequence_length=self.max_sequence_length or HUNYUAN_MAX_SEQUENCE_LENGTH,
        )
        return PromptEmbeds({"prompt_embeds": pe, "pooled_prompt_embeds": pooled, "prompt_attention_mask": mask})

    def schedule(self, num_steps: int) -> Schedule:
        sched = self.pipeline.scheduler
        sched.set_timesteps(sigmas=np.linspace(1.0, 0.0, num_steps + 1)[:-1])  # what the pipeline passes
        return flow_schedule(sched)

    def _forward(self, model, x, t, embeds, guidance_scale):
        guidance = None
        if self.guidance_embeds:  # the pipeline: tensor([g] * B, dtype=transformer dtype) * 1000
            guidance = torch.full((x.shape[0],), float(guidance_scale), device=x.device, dtype=x.dtype) * 1000.0
        tensors = embeds.tensors
        return model(hidden_states=x, timestep=t.to(x.dtype), encoder_hidden_states=tensors["prompt_embeds"].to(x.dtype),
                     encoder_attention_mask=tensors["prompt_attention_mask"].to(x.dtype),
                     pooled_projections=tensors["pooled_prompt_embeds"].to(x.dtype), guidance=guidance,
                     return_dict=False)[0]

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        video = vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]  # (B, 3, T, H, W) in [-1, 1]
        return video.permute(0, 2, 1, 3, 4)
