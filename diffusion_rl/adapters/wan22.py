"""Wan 2.2 A14B (two experts switched at a boundary timestep) and Wan image-to-video behind the adapter interface.

diffusers' `WanPipeline` and `WanImageToVideoPipeline` (0.42, pipelines/wan/pipeline_wan*.py) may hold two
denoisers: `transformer`, the high-noise expert, runs the steps whose timestep t >= boundary_ratio x
num_train_timesteps (boundary_ratio from model_index.json: 0.875 for T2V-A14B, 0.9 for I2V-A14B) with
`guidance_scale`; `transformer_2`, the low-noise expert, runs the steps below it with `guidance_scale_2` (the
pipeline's default: guidance_scale). Whether CFG runs at all is decided by guidance_scale alone, as the pipeline's
`do_classifier_free_guidance` does. Here:

- the policy trains one module, so the two experts are held by `WanExperts`, whose forward takes the expert's
  name; `adapter.denoiser` is that module, and `predict` routes every item of a batch to the expert its own
  timestep selects (the training path draws steps per item, so one batch may need both), so the output — and
  the kernel's log-prob built from it — is that expert's at every step;
- LoRA goes on both experts or one (`lora_experts`: 'both', 'high', 'low'); only the chosen experts get adapters
  or, without LoRA, trainable weights, so the policy's trainable parameters follow; the export writes one
  diffusers LoRA folder per trained expert (`final/transformer`, `final/transformer_2`, see diffusion_rl.export);
- image-to-video (`WanImageToVideoPipeline`): each prompt is an edit record (`mmreward.edit.EditPrompt`) whose
  source image is the first frame. As the pipeline does it, the image is resized to the video size, followed by
  num_frames - 1 black frames, VAE-encoded (the mode), normalised with the VAE's mean/std, and prefixed by a
  4-channel mask that marks latent frame 0 as given; the denoiser sees cat([x, mask, condition]) on channels.
  With an image encoder (Wan 2.1 I2V) its penultimate hidden states are `encoder_hidden_states_image`; Wan 2.2
  I2V-A14B has none. The negative prompt of CFG sees the same condition. `expand_timesteps` image-to-video
  (Wan 2.2 TI2V-5B, which replaces the first latent frame instead) is refused with a ConfigError.

Schedule, text encoding, decoding and the geometry checks are `WanAdapter`'s, so the ODE rollout is exactly the
pipeline run with a FlowMatchEulerDiscreteScheduler at its flow_shift.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from diffusion_rl.adapters.base import PromptEmbeds, prompt_list
from diffusion_rl.adapters.wan import WanAdapter
from mmreward.errors import ConfigError

LORA_EXPERTS = ("both", "high", "low")
EXPERTS = ("high", "low")


class WanExperts(torch.nn.Module):
    """Wan 2.2's two denoisers as one trainable module: `high` (the pipeline's `transformer`) and `low`
    (`transformer_2`). `forward(expert=..., **kwargs)` runs one of them, so that wrappers (DDP) see every call.

    The methods the policy calls on a diffusers model (`add_adapter`, `enable_adapters`, `disable_adapters`,
    `enable_gradient_checkpointing`, `requires_grad_`) reach the experts named by `lora_experts` only, which is
    what makes the trainable parameters follow that choice."""

    def __init__(self, high: torch.nn.Module, low: torch.nn.Module, lora_experts: str = "both") -> None:
        super().__init__()
        if lora_experts not in LORA_EXPERTS:
            raise ConfigError(f"lora_experts must be one of {list(LORA_EXPERTS)} (which Wan 2.2 experts are trained), "
                              f"got {lora_experts!r}")
        self.high = high
        self.low = low
        self.lora_experts = lora_experts

    @property
    def trained(self) -> list[torch.nn.Module]:
        return [getattr(self, e) for e in EXPERTS if self.lora_experts in ("both", e)]

    @property
    def config(self):
        return self.high.config

    @property
    def dtype(self) -> torch.dtype:
        return self.high.dtype

    def forward(self, *args, expert: str = "high", **kwargs):
        if expert not in EXPERTS:
            raise ConfigError(f"expert must be 'high' or 'low', got {expert!r}")
        return getattr(self, expert)(*args, **kwargs)

    def add_adapter(self, adapter_config, adapter_name: str = "default") -> None:
        for module in self.trained:
            module.add_adapter(adapter_config, adapter_name=adapter_name)

    def enable_adapters(self) -> None:
        for module in self.trained:
            module.enable_adapters()

    def disable_adapters(self) -> None:
        for module in self.trained:
            module.disable_adapters()

    def enable_gradient_checkpointing(self) -> None:
        for module in self.trained:
            module.enable_gradient_checkpointing()

    def requires_grad_(self, requires_grad: bool = True) -> WanExperts:
        # freezing reaches both; unfreezing (a full fine-tune) only the trained experts
        for name in EXPERTS:
            module = getattr(self, name)
            module.requires_grad_(requires_grad and module in self.trained)
        return self

    def pipeline_components(self) -> dict[str, torch.nn.Module]:
        """The experts by pipeline attribute, for `diffusion_rl.export`: a LoRA export writes one diffusers LoRA
        folder per trained expert (`transformer/`, `transformer_2/`: WanLoraLoaderMixin loads the second with
        `load_into_transformer_2=True`), a full export puts each expert in its own pipeline component."""
        return {"transformer": self.high, "transformer_2": self.low}


class Wan22Adapter(WanAdapter):
    """diffusers' WanPipeline with `transformer_2` and `boundary_ratio` (Wan 2.2 T2V-A14B): the expert of each
    step chosen as the pipeline chooses it. Constructing it for a one-transformer WanPipeline gives the plain
    `WanAdapter` (the same pipeline class serves both)."""

    family = "wan"  # same pipeline class, latents, text encoder and LoRA module names as Wan 2.1

    def __new__(cls, pipeline=None, *args, **kwargs):
        if cls is Wan22Adapter and getattr(pipeline, "transformer_2", None) is None:
            kwargs.pop("lora_experts", None)
            kwargs.pop("guidance_scale_2", None)
            return WanAdapter(pipeline, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None, *,
                 lora_experts: str = "both", guidance_scale_2: float | None = None) -> None:
        if getattr(pipeline, "transformer", None) is None:
            raise ConfigError(f"{type(pipeline).__name__} has no `transformer` (the high-noise expert); load the "
                              "whole pipeline: a low-noise-only Wan 2.2 pipeline cannot sample from pure noise")
        low = getattr(pipeline, "transformer_2", None)
        ratio = pipeline.config.get("boundary_ratio", None)
        if low is not None and ratio is None:
            raise ConfigError(f"{type(pipeline).__name__} has a transformer_2 but no boundary_ratio in its config, so "
                              "the pipeline never runs it; set boundary_ratio (0.875 for Wan2.2-T2V-A14B, 0.9 for "
                              "I2V-A14B) in model_index.json")
        if ratio is not None and not 0.0 < float(ratio) < 1.0:
            raise ConfigError(f"boundary_ratio must be in (0, 1), got {ratio}")
        if guidance_scale_2 is not None and guidance_scale_2 < 0:
            raise ConfigError(f"guidance_scale_2 must be >= 0, got {guidance_scale_2}")
        # WanAdapter's constructor refuses transformer_2; its checks run on a view without it
        self._experts = None if low is None else WanExperts(pipeline.transformer, low, lora_experts)
        if low is None and lora_experts != "both":
            raise ConfigError(f"lora_experts={lora_experts!r} needs two experts, but {type(pipeline).__name__} has one "
                              "transformer; leave lora_experts at 'both'")
        self._lora_experts = lora_experts
        self.guidance_scale_2 = guidance_scale_2
        self.boundary_ratio = None if ratio is None else float(ratio)
        super().__init__(_OneExpertView(pipeline), height, width, max_sequence_length, num_frames)
        self.pipeline = pipeline

    # -- model access -------------------------------------------------------------------------
    @property
    def lora_experts(self) -> str:
        """Which experts the policy trains: 'both', 'high' or 'low'; set it before the policy is built."""
        return self._lora_experts

    @lora_experts.setter
    def lora_experts(self, value: str) -> None:
        if value not in LORA_EXPERTS or (self._experts is None and value != "both"):
            raise ConfigError(f"lora_experts must be one of {list(LORA_EXPERTS)} for a two-expert Wan 2.2 pipeline "
                              f"('both' with one transformer), got {value!r}")
        self._lora_experts = value
        if self._experts is not None:
            self._experts.lora_experts = value

    @property
    def denoiser(self) -> torch.nn.Module:
        return self.pipeline.transformer if self._experts is None else self._experts

    @denoiser.setter
    def denoiser(self, module: torch.nn.Module) -> None:
        raise ConfigError("a Wan 2.2 adapter's denoiser is its experts (pipeline.transformer / transformer_2); set "
                          "those on the pipeline")

    @property
    def boundary_timestep(self) -> float | None:
        """The pipeline's boundary on the 0..1000 timestep scale: experts switch below it."""
        if self.boundary_ratio is None:
            return None
        return self.boundary_ratio * int(self.pipeline.scheduler.config.num_train_timesteps)

    def expert_of(self, t: torch.Tensor) -> torch.Tensor:
        """(B,) bool: True where the high-noise expert runs (t >= boundary, the pipeline's comparison)."""
        boundary = self.boundary_timestep
        t = torch.as_tensor(t)
        if boundary is None or self._experts is None:
            return torch.ones(t.shape, dtype=torch.bool, device=t.device)
        return t >= boundary

    # -- denoising ----------------------------------------------------------------------------
    def _negative_like(self, embeds: PromptEmbeds) -> PromptEmbeds:
        return self.negative().expand(len(embeds))

    def _expert_output(self, model, expert: str, x, t, embeds: PromptEmbeds, scale: float, cfg: bool) -> torch.Tensor:
        call = model if self._experts is None else functools.partial(model, expert=expert)
        if not cfg:
            return self._forward(call, x, t, embeds, scale).float()
        both = PromptEmbeds.cat([self._negative_like(embeds), embeds])
        uncond, cond = self._forward(call, torch.cat([x, x]), torch.cat([t, t]), both, scale).float().chunk(2)
        return uncond + scale * (cond - uncond)

    def predict(self, model, x, t, embeds, guidance_scale):
        """CFG output of each item's expert: the high-noise one with `guidance_scale` at t >= boundary, the
        low-noise one with `guidance_scale_2` (default: guidance_scale) below it."""
        x = x.to(self.model_dtype)
        cfg = self.uses_cfg(guidance_scale)  # the pipeline: guidance_scale > 1, whatever guidance_scale_2 is
        scale_2 = guidance_scale if self.guidance_scale_2 is None else float(self.guidance_scale_2)
        high = self.expert_of(t).to(x.device)
        if bool(high.all()):
            return self._tied_to_trained(self._expert_output(model, "high", x, t, embeds, guidance_scale, cfg), "high")
        if not bool(high.any()):
            return self._tied_to_trained(self._expert_output(model, "low", x, t, embeds, scale_2, cfg), "low")
        out = x.new_zeros(x.shape, dtype=torch.float32)
        for expert, sel, scale in (("high", high, guidance_scale), ("low", ~high, scale_2)):
            idx = sel.nonzero().squeeze(1)
            part = self._expert_output(model, expert, x[idx], t[idx], embeds.index(idx), scale, cfg)
            out = out.index_put((idx,), part)  # out of place: gradients reach both experts' parts
        return out

    def _tied_to_trained(self, out: torch.Tensor, ran: str) -> torch.Tensor:
        """`out` + 0 x (the trained experts' parameters) when grad is on and only a frozen expert ran (LoRA on
        one expert, a micro-batch of the other one's steps): the loss then has a graph, so backward runs and every
        trained parameter gets its true gradient, zero (under DDP, every process reduces the same parameters)."""
        experts = self._experts
        if experts is None or not torch.is_grad_enabled() or experts.lora_experts in ("both", ran):
            return out
        from torch.distributed.tensor import DTensor

        params = [p for m in experts.trained for p in m.parameters() if p.requires_grad]
        if not params:
            return out
        zero = sum((p.to_local() if isinstance(p, DTensor) else p).sum().to(out.device, out.dtype) for p in params)
        return out + 0.0 * zero


class _OneExpertView:
    """The pipeline as WanAdapter's constructor checks it: every attribute but `transformer_2`."""

    def __init__(self, pipeline) -> None:
        self._pipeline = pipeline

    transformer_2 = None

    def __getattr__(self, name: str):
        return getattr(self._pipeline, name)


class WanI2VAdapter(Wan22Adapter):
    """diffusers' WanImageToVideoPipeline: Wan 2.2 I2V-A14B (two experts, no image encoder) and Wan 2.1 I2V (one
    transformer and a CLIP image encoder). Prompts are edit records; each row's source image is the first frame."""

    family = "wan_i2v"
    is_edit = True

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None, *,
                 lora_experts: str = "both", guidance_scale_2: float | None = None) -> None:
        if pipeline.config.get("expand_timesteps", False):
            raise ConfigError(f"{type(pipeline).__name__} with expand_timesteps (Wan 2.2 TI2V-5B image-to-video: the "
                              "first latent frame is replaced, not concatenated) is not supported yet; use the "
                              "text-to-video WanPipeline of TI2V-5B, or Wan 2.2 I2V-A14B / Wan 2.1 I2V")
        super().__init__(pipeline, height, width, max_sequence_length, num_frames, lora_experts=lora_experts,
                         guidance_scale_2=guidance_scale_2)

    def latent_shape(self) -> tuple[int, ...]:
        # the noise has the VAE's channels; the transformer's in_channels also count the mask and the condition
        frames = (self.num_frames - 1) // self._temporal + 1
        return (int(self.pipeline.vae.config.z_dim), frames, self.height // self._spatial, self.width // self._spatial)

    @property
    def uses_image_encoder(self) -> bool:
        return self.pipeline.transformer.config.get("image_dim", None) is not None

    # -- conditioning -------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        from mmreward.edit import EditPrompt, load_source_image

        prompts = prompt_list(prompts)
        plain = [p for p in prompts if not isinstance(p, EditPrompt)]
        if plain:
            raise ConfigError(
                f"prompt {plain[0]!r} has no source image, but a {self.family} pipeline animates a first frame: give "
                "edit records ({\"source_image\": PATH, \"instruction\": ...} rows, see mmreward.edit) as prompts"
            )
        text = WanAdapter.encode(self, [str(p) for p in prompts])
        rows = [self.encode_first_frame(load_source_image(p.source)) for p in prompts]
        return PromptEmbeds({**text.tensors, **PromptEmbeds.cat(rows).tensors})

    @torch.no_grad()
    def encode_first_frame(self, image: torch.Tensor) -> PromptEmbeds:
        """One row of the image condition from a (3, H, W) image in [0, 1]: `condition` (1, 4 + C, T', H', W')
        (mask, then the normalised latents of the image followed by black frames) and, with an image encoder,
        `image_embeds`. The image goes in as the 8-bit PIL image a user hands the pipeline."""
        from PIL import Image

        pipe, vae = self.pipeline, self.pipeline.vae
        pixels8 = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
        pil = Image.fromarray(pixels8)
        frame = pipe.video_processor.preprocess(pil, height=self.height, width=self.width)
        frame = frame.to(self.device, torch.float32).unsqueeze(2)  # (1, 3, 1, H, W) in [-1, 1]
        black = frame.new_zeros(1, 3, self.num_frames - 1, self.height, self.width)
        video = torch.cat([frame, black], dim=2).to(vae.dtype)
        latents = vae.encode(video).latent_dist.mode().float()  # the pipeline's retrieve_latents(argmax)
        z = int(vae.config.z_dim)
        mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32, device=latents.device).view(1, z, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, dtype=torch.float32, device=latents.device).view(1, z, 1, 1, 1)
        latents = (latents - mean) * (1.0 / std)
        # the first-frame mask: one channel per frame the VAE folds into a latent frame, 1 on latent frame 0
        mask = torch.zeros(1, self._temporal, *latents.shape[2:], dtype=latents.dtype, device=latents.device)
        mask[:, :, 0] = 1
        tensors = {"condition": torch.cat([mask, latents], dim=1)}
        if self.uses_image_encoder:
            tensors["image_embeds"] = pipe.encode_image(pil, self.device)
        return PromptEmbeds(tensors)

    def negative(self) -> PromptEmbeds:
        if self._negative is None:
            self._negative = WanAdapter.encode(self, [""])  # text only: the image condition comes with each row
        return self._negative

    def _negative_like(self, embeds: PromptEmbeds) -> PromptEmbeds:
        # the pipeline's unconditional pass sees the same first frame (condition and image_embeds)
        image = {k: v for k, v in embeds.tensors.items() if k != "prompt_embeds"}
        return PromptEmbeds({**self.negative().expand(len(embeds)).tensors, **image})

    def _forward(self, model, x, t, embeds, guidance_scale):
        tensors = embeds.tensors
        image_embeds = tensors.get("image_embeds")
        return model(hidden_states=torch.cat([x, tensors["condition"].to(x.dtype)], dim=1), timestep=t.to(x.dtype),
                     encoder_hidden_states=tensors["prompt_embeds"].to(x.dtype),
                     encoder_hidden_states_image=None if image_embeds is None else image_embeds.to(x.dtype),
                     return_dict=False)[0]


def _register() -> None:
    """Map the pipeline classes to these adapters in the adapter table (diffusion_rl.adapters)."""
    from diffusion_rl.adapters.registry import DEFAULT_LORA_TARGETS, register_adapter

    # WanPipeline stays WanAdapter's entry: WanAdapter.__new__ hands two-expert pipelines to Wan22Adapter.
    # LoRA: self- (attn1) and cross-attention (attn2) of every block of each expert, as for Wan 2.1
    targets = DEFAULT_LORA_TARGETS.get("wan", ["to_q", "to_k", "to_v", "to_out.0"])
    register_adapter("WanImageToVideoPipeline", "wan_i2v", WanI2VAdapter, targets)
    WanAdapter.two_expert_adapter = Wan22Adapter  # WanAdapter.__new__ hands two-expert pipelines to it


_register()
