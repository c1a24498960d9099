"""diffusers' CogVideoXPipeline. Latents are presented as (B, C, T', H', W') whatever layout the pipeline
keeps internally (`VideoAdapter`),
so the kernels, the counter-based noise and the log-probs (mean over every latent element) are the same code as
for images and Wan; `decode` returns videos (B, T, 3, H, W) in [0, 1].

CogVideoX (2B, 5B, 1.5-5B):
- the pipeline holds latents as (B, T', C, H', W'): `_forward` permutes in and out of that layout;
- it is a v-prediction DDPM model with zero terminal SNR; the official samplers are CogVideoXDDIMScheduler
  and CogVideoXDPMScheduler (same alphas). Rollouts run our DDIM kernel on the alphas of a CogVideoXDDIMScheduler
  built from the pipeline's scheduler config (the pipeline is left as it is): with eta = 0 that is exactly
  `CogVideoXDDIMScheduler.step`, whose update a_t x + b_t x0 is DDIM's eta = 0 step written another way;
  v-prediction is converted to x0 / epsilon as the scheduler does; there is no x0 clipping (its step has none);
- CFG as the pipeline does it: the empty prompt as the negative, guidance on the fp32 outputs. The pipeline's
  `use_dynamic_cfg` (off by default) is not reproduced;
- prompts: T5 padded to the transformer's `max_text_seq_length` (226 in every release, the pipeline's default);
  CogVideoX-2B's fixed sin-cos positions need exactly that many text tokens (another length is a ConfigError);
- rotary position embeddings (5B, 1.5) come from the pipeline's own `_prepare_rotary_positional_embeddings`;
- CogVideoX 1.5 (`patch_size_t` = 2) pads the latent frames at the front to a multiple of `patch_size_t`, as the
  pipeline does; the padding frames are denoised with the rest and dropped before decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffusion_rl.adapters.base import PromptEmbeds, Schedule, VideoAdapter, prompt_list
from diffusion_rl.kernels import ddim_alphas
from mmreward.errors import ConfigError


class CogVideoXAdapter(VideoAdapter):
    """diffusers' CogVideoXPipeline: v-prediction DDIM on (B, C, T', H', W') latents (see the module docstring)."""

    family = "cogvideox"
    block_classes = ("CogVideoXBlock",)
    is_flow = False
    fps = 8.0  # CogVideoX makes 8 fps clips (6 s of 49 frames; 1.5: 16 fps, set model.fps)

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None) -> None:
        from diffusers import CogVideoXDDIMScheduler, CogVideoXDPMScheduler

        cfg = pipeline.transformer.config
        spatial = int(pipeline.vae_scale_factor_spatial)
        # the pipeline's defaults: the transformer's sample size (in latents) and sample_frames
        self._init_video(pipeline, height or int(cfg.sample_height) * spatial, width or int(cfg.sample_width) * spatial,
                         num_frames or int(cfg.sample_frames), max_sequence_length, spatial,
                         int(pipeline.vae_scale_factor_temporal), spatial * int(cfg.patch_size))
        if not cfg.use_rotary_positional_embeddings and max_sequence_length not in (None, cfg.max_text_seq_length):
            # CogVideoX-2B adds fixed positions to exactly max_text_seq_length text tokens + the video patches
            raise ConfigError(
                f"max_sequence_length={max_sequence_length} does not fit {type(pipeline.transformer).__name__}: "
                f"without rotary embeddings (CogVideoX-2B) the text must be its max_text_seq_length="
                f"{cfg.max_text_seq_length} tokens; leave model.max_sequence_length unset or set it to that"
            )
        sched = pipeline.scheduler
        if not isinstance(sched, (CogVideoXDDIMScheduler, CogVideoXDPMScheduler)):
            # another scheduler's config lacks snr_shift_scale, and the alphas would silently differ from training
            raise ConfigError(f"{type(pipeline).__name__}.scheduler is a {type(sched).__name__}; rollouts need the "
                              "CogVideoXDDIMScheduler or CogVideoXDPMScheduler the checkpoints ship (reload the "
                              "pipeline, or build one from the checkpoint's scheduler config)")
        # the DPM sampler shares the DDIM scheduler's alphas (same config keys): the kernel needs only those
        self._ddim = sched if isinstance(sched, CogVideoXDDIMScheduler) else CogVideoXDDIMScheduler.from_config(sched.config)
        self._rotary: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    # -- DDIM kernel settings (read by rollout.kernel_for) ---------------------------------------
    @property
    def prediction_type(self) -> str:
        return self._ddim.config.prediction_type

    @property
    def clip_sample_range(self) -> float | None:
        return None  # CogVideoXDDIMScheduler.step never clips x0, whatever its config says

    # -- geometry -----------------------------------------------------------------------------
    @property
    def _padding_frames(self) -> int:
        """Latent frames CogVideoX 1.5 prepends so that their count divides patch_size_t (0 otherwise)."""
        p_t = self.denoiser.config.patch_size_t
        return 0 if p_t is None or self.latent_frames % p_t == 0 else p_t - self.latent_frames % p_t

    def latent_shape(self) -> tuple[int, ...]:
        return (int(self.denoiser.config.in_channels), self.latent_frames + self._padding_frames,
                self.height // self._spatial, self.width // self._spatial)

    # -- conditioning and schedule --------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        pe, _ = self.pipeline.encode_prompt(
            prompt=prompt_list(prompts), do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length or int(self.denoiser.config.max_text_seq_length),
        )
        return PromptEmbeds({"prompt_embeds": pe})

    def schedule(self, num_steps: int) -> Schedule:
        self._ddim.set_timesteps(num_steps)
        a_t, a_prev = ddim_alphas(self._ddim, self._ddim.timesteps)
        return Schedule(self._ddim.timesteps.clone().cpu(), a_t, a_prev)

    def initial_noise_scale(self) -> float:
        return float(self._ddim.init_noise_sigma)

    def _rotary_embeddings(self, frames: int, device: torch.device):
        if not self.denoiser.config.use_rotary_positional_embeddings:
            return None
        key = (frames, str(device))
        if key not in self._rotary:  # depends only on the geometry: computed once per frame count and device
            self._rotary[key] = self.pipeline._prepare_rotary_positional_embeddings(self.height, self.width, frames,
                                                                                    device)
        return self._rotary[key]

    def _forward(self, model, x, t, embeds, guidance_scale):
        hidden = x.permute(0, 2, 1, 3, 4)  # (B, C, T', H', W') -> the pipeline's (B, T', C, H', W')
        out = model(hidden_states=hidden, encoder_hidden_states=embeds.tensors["prompt_embeds"], timestep=t,
                    image_rotary_emb=self._rotary_embeddings(hidden.shape[1], x.device), return_dict=False)[0]
        return out.permute(0, 2, 1, 3, 4)

    # -- decoding -----------------------------------------------------------------------------
    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        # drop CogVideoX 1.5's padding frames, then CogVideoXPipeline.decode_latents (already channels-first)
        latents = latents[:, :, self._padding_frames:] / self.pipeline.vae_scaling_factor_image
        video = self.pipeline.vae.decode(latents, return_dict=False)[0]  # (B, 3, T, H, W) in [-1, 1]
        return video.permute(0, 2, 1, 3, 4)
