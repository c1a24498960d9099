"""A diffusers text-to-image pipeline seen as a differentiable function of its initial noise.

ReNO, best-of-N and noise exploration all need the same thing: `images = G(noise, prompts)` for a
fixed prompt encoding and a fixed sampler, with gradients from the pixels back to the noise. We keep
the pipeline's own sampling loop (its scheduler, guidance and VAE decode) by calling the undecorated
`__call__` (diffusers wraps it in `torch.no_grad`), so SD-Turbo, SDXL-Turbo, SD3-style and FLUX-schnell
pipelines run exactly the code they ship with.

The noise always has the unpacked layout (B, C, h, w); FLUX's token packing is a permutation applied
inside, so a standard normal stays standard normal and ReNO's norm regulariser sees the true dimension.
RNG is device-agnostic: noise comes from CPU generators and is moved to the device afterwards, and the
stochastic steps of ancestral schedulers use a CPU generator re-seeded on every call, so the same noise
always gives the same image (the assumption ReNO's optimisation relies on).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from diffusion_rl.pipelines import (
    DTYPES,
    VIDEO_FAMILIES,
    PromptEmbeds,
    pipeline_family,
    pipeline_from_pretrained,
)
from mmreward.errors import DIFFUSION_EXTRA, ConfigError, RewardInputError, require_installed


class NoiseToImage:
    """images = G(noise, prompts): a pipeline's few-step sampler as a differentiable map from initial noise.

    Args:
        pipe: a diffusers FLUX, SD3, SDXL or SD pipeline (any subclass).
        num_inference_steps: sampler steps (1 for SD-Turbo / SDXL-Turbo, 1-4 for FLUX-schnell).
        guidance_scale: classifier-free guidance; <= 1 disables it (distilled one-step models use 0).
        height, width: output size in pixels; None uses the pipeline's default.
        gradient_checkpointing: recompute the denoiser and VAE activations in backward to save memory.
        seed: seed of the CPU generator that the scheduler's own stochastic steps use (re-seeded per call).
        negative_prompt: used only when guidance is on.
        max_sequence_length: T5 tokens for SD3/FLUX prompt encoding (None: the pipeline's default).
        call_kwargs: extra keyword arguments for the pipeline call (e.g. max_sequence_length).
    """

    modality = "image"

    def __init__(
        self,
        pipe: Any,
        *,
        num_inference_steps: int = 1,
        guidance_scale: float = 0.0,
        height: int | None = None,
        width: int | None = None,
        gradient_checkpointing: bool = False,
        seed: int = 0,
        negative_prompt: str | None = None,
        max_sequence_length: int | None = None,
        call_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if num_inference_steps < 1:
            raise ConfigError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
        self.pipe = pipe
        self.family = pipeline_family(pipe, " for noise optimisation")
        if self.family in VIDEO_FAMILIES:  # videos go through their adapter: NoiseToVideo
            raise ConfigError(f"pipeline: {type(pipe).__name__} makes videos; use NoiseToVideo "
                              "(diffusion_rl.inference.noise_to_video) for video pipelines")
        self.num_inference_steps = int(num_inference_steps)
        self.guidance_scale = float(guidance_scale)
        self.seed = int(seed)
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length
        self.call_kwargs = dict(call_kwargs or {})
        default = self._default_size()
        self.height = int(height or default)
        self.width = int(width or default)
        for name in ("unet", "transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
            module = getattr(pipe, name, None)
            if isinstance(module, torch.nn.Module):
                module.requires_grad_(False).eval()
                if gradient_checkpointing and name in ("unet", "transformer", "vae"):
                    module.enable_gradient_checkpointing()
        if hasattr(pipe, "set_progress_bar_config"):
            pipe.set_progress_bar_config(disable=True)

    @classmethod
    def from_pretrained(
        cls,
        source: str | os.PathLike,
        *,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = torch.float32,
        attention: str = "auto",
        **kwargs: Any,
    ) -> NoiseToImage:
        """Load any diffusers pipeline folder or hub id (cache-first; offline needs a local copy).

        `attention`: the backend of every model in the pipeline (see `mmreward.attention`)."""
        require_installed("diffusers", DIFFUSION_EXTRA, "NoiseToImage.from_pretrained")
        if isinstance(dtype, str):
            if dtype not in DTYPES:
                raise ConfigError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
            torch_dtype = DTYPES[dtype]
        elif isinstance(dtype, torch.dtype):
            torch_dtype = dtype
        else:
            raise ConfigError(f"dtype: expected a torch dtype or one of {sorted(DTYPES)}, got {dtype!r}")
        from diffusers.utils import deprecation_utils

        # recent diffusers renamed torch_dtype to dtype (and warn on the old name); older ones only know torch_dtype
        key = "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"
        from mmreward.attention import apply_to_pipeline, check_choice

        check_choice(attention, "--attention")  # before the (slow) load
        pipe = pipeline_from_pretrained(str(source), "--pipeline", **{key: torch_dtype}).to(device)
        apply_to_pipeline(pipe, attention)
        from diffusion_rl.model_card import read_generation_defaults

        # the folder's card fills what the caller left out (the shipped generator: 4 T5 tokens, 20 steps, CFG 4)
        pipe.generation_defaults = read_generation_defaults(source)
        card = {k: v for k, v in pipe.generation_defaults.items() if k != "num_frames"}
        return cls(pipe, **{**card, **{k: v for k, v in kwargs.items() if v is not None}})

    # -- shapes and noise ------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.pipe._execution_device

    @property
    def dtype(self) -> torch.dtype:
        return self._denoiser.dtype

    @property
    def _denoiser(self) -> torch.nn.Module:
        return self.pipe.transformer if self.family in ("flux", "sd3") else self.pipe.unet

    def _default_size(self) -> int:
        if self.family in ("flux", "sd3"):
            return int(self.pipe.default_sample_size * self.pipe.vae_scale_factor)
        return int(self.pipe.unet.config.sample_size * self.pipe.vae_scale_factor)

    @property
    def noise_shape(self) -> tuple[int, int, int]:
        """(C, h, w) of the unpacked initial noise, following each pipeline's `prepare_latents`."""
        vsf = self.pipe.vae_scale_factor
        if self.family == "flux":
            c = self.pipe.transformer.config.in_channels // 4
            return c, 2 * (self.height // (vsf * 2)), 2 * (self.width // (vsf * 2))
        c = self._denoiser.config.in_channels
        return c, self.height // vsf, self.width // vsf

    def sample_noise(self, seeds: Sequence[int]) -> torch.Tensor:
        """One standard-normal noise per seed, drawn on CPU generators (identical on every device), fp32."""
        seeds = list(seeds)
        if not seeds:
            raise RewardInputError("seeds: expected at least one seed, got an empty list")
        shape = self.noise_shape
        gens = [torch.Generator("cpu").manual_seed(int(s)) for s in seeds]
        noise = torch.stack([torch.randn(shape, generator=g) for g in gens])
        return noise.to(self.device)

    # -- prompts ---------------------------------------------------------------------------------
    @property
    def do_cfg(self) -> bool:
        return self.family != "flux" and self.guidance_scale > 1.0

    @torch.no_grad()
    def encode(self, prompts: str | Sequence[str]) -> PromptEmbeds:
        """The pipeline's own prompt encoding, as the keyword arguments of its call (computed once, no grad)."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise RewardInputError(f"prompts: expected a non-empty list of strings, got {prompts!r}")
        pipe, dev, neg = self.pipe, self.device, None
        msl = {"max_sequence_length": self.max_sequence_length} if self.max_sequence_length else {}
        if self.do_cfg and self.negative_prompt is not None:
            neg = [self.negative_prompt] * len(prompts)
        if self.family == "flux":
            pe, ppe, _ = pipe.encode_prompt(prompt=prompts, prompt_2=None, device=dev, **msl)
            kwargs = {"prompt_embeds": pe, "pooled_prompt_embeds": ppe}
        elif self.family == "sd":
            pe, ne = pipe.encode_prompt(prompts, dev, 1, self.do_cfg, negative_prompt=neg)
            kwargs = {"prompt_embeds": pe, "negative_prompt_embeds": ne}
        else:
            extra = {"prompt_2": None, "prompt_3": None, **msl} if self.family == "sd3" else {"prompt_2": None}
            pe, ne, ppe, npe = pipe.encode_prompt(
                prompt=prompts,
                device=dev,
                num_images_per_prompt=1,
                do_classifier_free_guidance=self.do_cfg,
                negative_prompt=neg,
                **extra,
            )
            kwargs = {
                "prompt_embeds": pe,
                "negative_prompt_embeds": ne,
                "pooled_prompt_embeds": ppe,
                "negative_pooled_prompt_embeds": npe,
            }
        return PromptEmbeds({k: v for k, v in kwargs.items() if v is not None})

    # -- the map ---------------------------------------------------------------------------------
    def __call__(self, noise: torch.Tensor, prompts: PromptEmbeds | str | Sequence[str]) -> torch.Tensor:
        """Images (B, 3, H, W) in [0, 1], fp32, differentiable w.r.t. `noise` when it requires grad."""
        encoded = prompts if isinstance(prompts, PromptEmbeds) else self.encode(prompts)
        expected = self.noise_shape
        if noise.ndim != 4 or tuple(noise.shape[1:]) != expected:
            raise RewardInputError(
                f"noise: expected shape (B, {expected[0]}, {expected[1]}, {expected[2]}) for a "
                f"{self.height}x{self.width} {self.family} pipeline, got {tuple(noise.shape)}; "
                "draw it with sample_noise()"
            )
        if len(encoded) != noise.shape[0]:
            raise RewardInputError(
                f"noise and prompts must have the same batch size: got {noise.shape[0]} noises and "
                f"{len(encoded)} prompts"
            )
        latents = noise.to(self.device, self.dtype)
        if self.family == "flux":
            b, c, h, w = latents.shape
            latents = self.pipe._pack_latents(latents, b, c, h, w)
        # diffusers decorates __call__ with torch.no_grad(); the wrapped function is the same code with grad
        call = type(self.pipe).__call__
        call = getattr(call, "__wrapped__", call)
        out = call(
            self.pipe,
            height=self.height,
            width=self.width,
            num_inference_steps=self.num_inference_steps,
            guidance_scale=self.guidance_scale,
            generator=torch.Generator("cpu").manual_seed(self.seed),
            latents=latents,
            output_type="pt",
            return_dict=False,
            **encoded.tensors,
            **self.call_kwargs,
        )
        return out[0].float()
