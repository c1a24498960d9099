"""diffusers' WanPipeline (Wan 2.1 T2V, Wan 2.2 TI2V-5B) behind the adapter interface.

Video pipelines behind the same adapter interface: Wan 2.1 / 2.2 (diffusers' `WanPipeline`).

Latents are (C, T', H', W') per sample with T' = (T - 1) / 4 + 1 and H' = H / 8 for Wan's VAE, so the
rollout, the kernels and the log-probs (mean over every latent element, as for images) run unchanged on
(B, C, T', H', W') tensors. What differs from the image families:

- prompts go through the pipeline's own `encode_prompt` (UMT5, padded to `max_sequence_length` with zeros
  after each prompt's length, as WanPipeline does), CFG uses the empty prompt like WanPipeline's default;
- the denoiser is called as WanPipeline calls it: `hidden_states`, `timestep` (the scheduler's 0..1000
  scale; one per token when the pipeline has `expand_timesteps`, as Wan 2.2 TI2V), `encoder_hidden_states`;
- the schedule: the official pipeline samples with UniPC; rollouts use the flow-matching Euler sigmas of
  `FlowMatchEulerDiscreteScheduler` with the pipeline's `flow_shift`, so the Flow-SDE / Dance-SDE kernels
  and their log-probs apply (the ODE path is then exactly WanPipeline run with that Euler scheduler);
- decoding un-normalises with the VAE's per-channel `latents_mean` / `latents_std` and returns videos
  (B, T, 3, H, W) in [0, 1], the layout video rewards take.

Wan 2.2 A14B's two-expert denoising (`transformer_2` with `boundary_ratio`) is the same pipeline class: constructing
a WanAdapter for such a pipeline gives `diffusion_rl.adapters.wan22.Wan22Adapter` (see `WanAdapter.__new__`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from diffusion_rl.adapters.base import PipelineAdapter, PromptEmbeds, Schedule, flow_schedule, prompt_list
from mmreward.errors import ConfigError

WAN_DEFAULT_HEIGHT, WAN_DEFAULT_WIDTH, WAN_DEFAULT_FRAMES = 480, 832, 81  # WanPipeline.__call__'s defaults
WAN_MAX_SEQUENCE_LENGTH = 226  # WanPipeline.encode_prompt's default


class WanAdapter(PipelineAdapter):
    """diffusers' WanPipeline (Wan 2.1 T2V, Wan 2.2 TI2V-5B): flow matching on 5-D video latents."""

    family = "wan"
    block_classes = ("WanTransformerBlock",)
    is_flow = True
    modality = "video"
    fps = 16.0  # WanPipeline's examples export at 16 fps (Wan 2.1); Wan 2.2 TI2V-5B at 24: set adapter.fps
    two_expert_adapter: type[WanAdapter] | None = None  # the adapter of Wan 2.2 A14B's transformer + transformer_2

    def __new__(cls, pipeline=None, *args, **kwargs):
        # one pipeline class, two layouts: a WanPipeline with transformer_2 (Wan 2.2 A14B) gets the two-expert
        # adapter; returning an uninitialised instance makes Python run Wan22Adapter.__init__ with the same arguments
        # (diffusion_rl.adapters.wan22 sets `two_expert_adapter` when it is imported, which the package always does;
        # wan.py does not import wan22, which imports it)
        if cls is WanAdapter and getattr(pipeline, "transformer_2", None) is not None and WanAdapter.two_expert_adapter:
            return super().__new__(WanAdapter.two_expert_adapter)
        return super().__new__(cls)

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None) -> None:
        if getattr(pipeline, "transformer", None) is None or getattr(pipeline, "transformer_2", None) is not None:
            raise ConfigError(
                f"{type(pipeline).__name__}: two-expert Wan 2.2 pipelines (transformer + transformer_2 with a "
                "boundary_ratio) are not supported for reward fine-tuning yet; use a single-transformer Wan "
                "checkpoint (Wan 2.1 T2V or Wan 2.2 TI2V-5B)"
            )
        self.pipeline = pipeline
        self.height = int(height or WAN_DEFAULT_HEIGHT)
        self.width = int(width or WAN_DEFAULT_WIDTH)
        self.num_frames = int(num_frames or WAN_DEFAULT_FRAMES)
        multiple = self._size_multiple()
        if self.height % multiple or self.width % multiple or self.height <= 0 or self.width <= 0:
            raise ConfigError(
                f"height/width must be positive multiples of {multiple} for {type(pipeline).__name__} (the VAE's "
                f"spatial factor {self._spatial} x the patch size), got {self.height}x{self.width}; e.g. "
                f"{max(multiple, self.height // multiple * multiple)}x{max(multiple, self.width // multiple * multiple)}"
            )
        temporal = self._temporal
        if self.num_frames < 1 or (self.num_frames - 1) % temporal:
            lower = max(1, (self.num_frames - 1) // temporal * temporal + 1)
            raise ConfigError(
                f"num_frames={self.num_frames} cannot be made by {type(pipeline).__name__}: its VAE compresses time "
                f"by {temporal}, so num_frames - 1 must be a multiple of {temporal} (e.g. {lower} or {lower + temporal})"
            )
        self.max_sequence_length = max_sequence_length
        self._negative: PromptEmbeds | None = None
        self._euler = None

    # -- geometry -----------------------------------------------------------------------------
    @property
    def _spatial(self) -> int:
        return int(self.pipeline.vae_scale_factor_spatial)

    @property
    def _temporal(self) -> int:
        return int(self.pipeline.vae_scale_factor_temporal)

    def _size_multiple(self) -> int:
        return self._spatial * int(self.denoiser.config.patch_size[1])

    def latent_shape(self) -> tuple[int, ...]:
        frames = (self.num_frames - 1) // self._temporal + 1
        return (int(self.denoiser.config.in_channels), frames, self.height // self._spatial, self.width // self._spatial)

    # -- conditioning -------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        pe, _ = self.pipeline.encode_prompt(
            prompt=prompt_list(prompts), do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length or WAN_MAX_SEQUENCE_LENGTH,
        )
        return PromptEmbeds({"prompt_embeds": pe})

    def schedule(self, num_steps: int) -> Schedule:
        from diffusers import FlowMatchEulerDiscreteScheduler

        sched = self.pipeline.scheduler
        if not isinstance(sched, FlowMatchEulerDiscreteScheduler):
            # UniPC (the official sampler) keeps its shift as `flow_shift`; the Euler sigmas use the same shift
            if self._euler is None:
                shift = float(sched.config.get("flow_shift", None) or sched.config.get("shift", 1.0) or 1.0)
                self._euler = FlowMatchEulerDiscreteScheduler(
                    num_train_timesteps=int(sched.config.get("num_train_timesteps", 1000)), shift=shift)
            sched = self._euler
        sched.set_timesteps(num_steps)
        return flow_schedule(sched)

    def _forward(self, model, x, t, embeds, guidance_scale):
        timestep = t.to(x.dtype)
        if self.pipeline.config.get("expand_timesteps", False):
            # Wan 2.2 TI2V: one timestep per latent token (frames x H'/2 x W'/2); all equal for text-to-video
            tokens = x.shape[2] * (x.shape[3] // 2) * (x.shape[4] // 2)
            timestep = timestep[:, None].expand(-1, tokens)
        return model(hidden_states=x, timestep=timestep, encoder_hidden_states=embeds.tensors["prompt_embeds"],
                     return_dict=False)[0]

    # -- decoding -----------------------------------------------------------------------------
    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        z = int(vae.config.z_dim)
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        video = vae.decode(latents * std + mean, return_dict=False)[0]  # (B, 3, T, H, W) in [-1, 1]
        return video.permute(0, 2, 1, 3, 4)  # (B, T, 3, H, W): the layout of video rewards

    def decode(self, latents: torch.Tensor, *, keep_graph: bool = False) -> torch.Tensor:
        """Videos in [0, 1], (B, T, 3, H, W), fp32 (see PipelineAdapter.decode)."""
        if latents.ndim != 5:
            raise ConfigError(f"latents: expected (B, C, T', H', W') video latents, got shape {tuple(latents.shape)}")
        return super().decode(latents, keep_graph=keep_graph)
