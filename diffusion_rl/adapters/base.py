"""What every pipeline adapter shares: prompt embeddings, sampling schedules, the adapter interface, the
5-D video contract and chunked decoding, plus the small helpers every adapter file uses (`prompt_list`,
`flow_schedule`). Each family's adapter lives in its own module of `diffusion_rl.adapters`; this module imports
none of them, so any adapter file can import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mmreward.errors import ConfigError

# the dtypes a pipeline may be loaded in; names come from configs and command lines, so they are looked up
# here rather than with getattr(torch, name)
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# ----------------------------------------------------------------------------------------------
# prompt embeddings and schedules
# ----------------------------------------------------------------------------------------------
@dataclass
class PromptEmbeds:
    """Named conditioning tensors, batch first (what the denoiser needs besides x and t)."""

    tensors: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return int(next(iter(self.tensors.values())).shape[0])

    def index(self, idx: torch.Tensor | Sequence[int] | slice) -> PromptEmbeds:
        if not isinstance(idx, slice):
            idx = torch.as_tensor(idx, dtype=torch.long, device=next(iter(self.tensors.values())).device)
        return PromptEmbeds({k: v[idx] for k, v in self.tensors.items()})

    def repeat_interleave(self, n: int) -> PromptEmbeds:
        return PromptEmbeds({k: v.repeat_interleave(n, dim=0) for k, v in self.tensors.items()})

    def expand(self, n: int) -> PromptEmbeds:
        """A one-row embedding (e.g. the empty prompt) repeated to n rows."""
        return PromptEmbeds({k: v.expand(n, *v.shape[1:]) for k, v in self.tensors.items()})

    def to(self, device=None, dtype=None) -> PromptEmbeds:
        return PromptEmbeds({k: v.to(device=device, dtype=dtype if v.is_floating_point() else None)
                             for k, v in self.tensors.items()})

    @staticmethod
    def cat(parts: Sequence[PromptEmbeds]) -> PromptEmbeds:
        return PromptEmbeds({k: torch.cat([p.tensors[k] for p in parts]) for k in parts[0].tensors})


@dataclass
class Schedule:
    """Per-step values: `timesteps` as the denoiser sees them, and the kernel's (a, b) pair:
    (sigma, sigma_next) for flow models, (alpha_prod_t, alpha_prod_t_prev) for DDIM."""

    timesteps: torch.Tensor  # (T,)
    a: torch.Tensor  # (T,) float64
    b: torch.Tensor  # (T,) float64

    def __len__(self) -> int:
        return int(self.timesteps.shape[0])


# ----------------------------------------------------------------------------------------------
# adapters
# ----------------------------------------------------------------------------------------------
class PipelineAdapter:
    """Common interface of a diffusers pipeline family (docs/adding_a_model.md walks through each method).

    An adapter exposes the four things a policy-gradient method needs: prompt embeddings (computed once per
    prompt and reused for every step and every update), the sampling schedule, the denoiser's output at a batch
    of states (with classifier-free guidance when asked), and decoding latents to images or videos in [0, 1]."""

    family: str = ""
    is_flow: bool = True
    modality: str = "image"  # what `decode` returns: "image" (B, 3, H, W) or "video" (B, T, 3, H, W)
    is_edit: bool = False  # True: prompts are edit records and the source image is part of the condition
    # how many source images of an edit record (EditPrompt.sources) the condition takes: "one" (a record with more is
    # refused at run start, not cut to its first), "same_count" (several, the same number in every record of a run:
    # the rows' condition tokens are stacked) or "any" (records with different numbers share a batch)
    source_images: str = "one"
    fps: float | None = None  # frames per second of the clips a video pipeline makes (its export rate)
    # the transformer block classes FSDP2 shards one by one (accelerate's TRANSFORMER_BASED_WRAP `transformer_cls_names_to_wrap`);
    # named here because some transformers declare no `_no_split_modules` (LTX, LTX-2) and others list non-blocks in it
    block_classes: tuple[str, ...] = ()

    def __init__(self, pipeline, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None) -> None:
        self.pipeline = pipeline
        default = self._default_size()
        self.height = int(height or default)
        self.width = int(width or default)
        multiple = self._size_multiple()
        if self.height % multiple or self.width % multiple:
            raise ConfigError(
                f"height/width must be multiples of {multiple} for {type(pipeline).__name__}, "
                f"got {self.height}x{self.width}"
            )
        self.max_sequence_length = max_sequence_length
        self._negative: PromptEmbeds | None = None

    # -- model access -------------------------------------------------------------------------
    @property
    def denoiser(self) -> torch.nn.Module:
        return getattr(self.pipeline, self.denoiser_attr)

    @denoiser.setter
    def denoiser(self, module: torch.nn.Module) -> None:
        setattr(self.pipeline, self.denoiser_attr, module)

    denoiser_attr = "transformer"

    @property
    def device(self) -> torch.device:
        return next(self.denoiser.parameters()).device

    @property
    def model_dtype(self) -> torch.dtype:
        # diffusers keeps some modules in fp32 (`_keep_in_fp32_modules`: Wan's scale_shift_table, its first
        # parameter); ModelMixin.dtype skips them and names the compute dtype the inputs must have
        dtype = getattr(self.denoiser, "dtype", None)
        return dtype if isinstance(dtype, torch.dtype) else next(self.denoiser.parameters()).dtype

    def _default_size(self) -> int:
        return int(self.denoiser.config.sample_size) * int(self.pipeline.vae_scale_factor)

    def _size_multiple(self) -> int:
        return int(self.pipeline.vae_scale_factor)

    # -- to implement ------------------------------------------------------------------------
    def encode(self, prompts: Sequence[str]) -> PromptEmbeds:
        raise NotImplementedError

    def latent_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def schedule(self, num_steps: int) -> Schedule:
        raise NotImplementedError

    def _forward(self, model, x, t, embeds: PromptEmbeds, guidance_scale: float) -> torch.Tensor:
        raise NotImplementedError

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------
    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0

    def negative(self) -> PromptEmbeds:
        """The empty-prompt embedding the pipelines use for CFG when no negative prompt is given."""
        if self._negative is None:
            self._negative = self.encode([""])
        return self._negative

    def predict(
        self, model: torch.nn.Module, x: torch.Tensor, t: torch.Tensor, embeds: PromptEmbeds, guidance_scale: float
    ) -> torch.Tensor:
        """Denoiser output at states x (B, ...) and per-item timesteps t (B,), with CFG as the pipeline does it."""
        x = x.to(self.model_dtype)
        if self.uses_cfg(guidance_scale):
            neg = self.negative().expand(len(embeds))
            both = PromptEmbeds.cat([neg, embeds])
            out = self._forward(model, torch.cat([x, x]), torch.cat([t, t]), both, guidance_scale)
            uncond, cond = out.float().chunk(2)
            return uncond + guidance_scale * (cond - uncond)
        return self._forward(model, x, t, embeds, guidance_scale).float()

    def decode(self, latents: torch.Tensor, *, keep_graph: bool = False) -> torch.Tensor:
        """Images in [0, 1], (B, 3, H, W), fp32. `keep_graph` keeps the autograd graph through the VAE
        (reward backpropagation); otherwise decoding runs without grad to save the VAE's activations."""
        with torch.set_grad_enabled(keep_graph and torch.is_grad_enabled()):
            images = self._decode_latents(latents.to(self.pipeline.vae.dtype))
            return (images.float() / 2 + 0.5).clamp(0, 1)

    def initial_noise_scale(self) -> float:
        return 1.0

    def default_decode_chunk_size(self, batch: int) -> int:
        """How many samples the VAE decodes at once when the run does not say (`sample.decode_chunk_size`):
        one clip at a time for video pipelines (a clip's decoder activations are frames x pixels, so a whole
        batch of them is what runs out of memory first), the whole batch for images (today's behaviour)."""
        return 1 if self.modality == "video" else max(1, int(batch))


class VideoAdapter(PipelineAdapter):
    """Shared geometry checks and the 5-D decode contract of video adapters: latents (B, C, T', H', W') with
    T' = (T - 1) / temporal + 1 and H' = H / spatial, whatever layout the pipeline keeps internally, and
    `decode` returning videos (B, T, 3, H, W) in [0, 1]."""

    modality = "video"

    def _init_video(self, pipeline, height: int, width: int, num_frames: int, max_sequence_length: int | None,
                    spatial: int, temporal: int, multiple: int) -> None:
        self.pipeline = pipeline
        self.height, self.width, self.num_frames = int(height), int(width), int(num_frames)
        self._spatial, self._temporal = int(spatial), int(temporal)
        name = type(pipeline).__name__
        if self.height <= 0 or self.width <= 0 or self.height % multiple or self.width % multiple:
            raise ConfigError(
                f"height/width must be positive multiples of {multiple} for {name} (the VAE's spatial factor "
                f"{spatial} x the patch size), got {self.height}x{self.width}; e.g. "
                f"{max(multiple, self.height // multiple * multiple)}x{max(multiple, self.width // multiple * multiple)}"
            )
        if self.num_frames < 1 or (self.num_frames - 1) % temporal:
            lower = max(1, (self.num_frames - 1) // temporal * temporal + 1)
            raise ConfigError(
                f"num_frames={self.num_frames} cannot be made by {name}: its VAE compresses time by {temporal}, so "
                f"num_frames - 1 must be a multiple of {temporal} (e.g. {lower} or {lower + temporal})"
            )
        self.max_sequence_length = max_sequence_length
        self._negative: PromptEmbeds | None = None

    @property
    def latent_frames(self) -> int:
        return (self.num_frames - 1) // self._temporal + 1

    def decode(self, latents: torch.Tensor, *, keep_graph: bool = False) -> torch.Tensor:
        """Videos in [0, 1], (B, T, 3, H, W), fp32 (see PipelineAdapter.decode)."""
        if latents.ndim != 5:
            raise ConfigError(f"latents: expected (B, C, T', H', W') video latents, got shape {tuple(latents.shape)}")
        return super().decode(latents, keep_graph=keep_graph)


def decode_chunked(adapter: PipelineAdapter, latents: torch.Tensor, chunk_size: int | None = None, *,
                   keep_graph: bool = False, device: torch.device | str | None = None) -> torch.Tensor:
    """`adapter.decode` over `chunk_size` samples at a time (None: `adapter.default_decode_chunk_size`).

    The VAE's activations then exist for one chunk at a time; the decoded samples are concatenated on `device`
    (default: where the latents are), so with device="cpu" the accelerator never holds more than one chunk of
    decoded clips. For any adapter and chunk size this is what diffusers' `vae.enable_slicing()` does at chunk
    1; with `keep_graph` the chunks stay in one autograd graph, so reward gradients reach the latents as with
    one whole-batch decode (DRaFT)."""
    n = int(latents.shape[0])
    size = adapter.default_decode_chunk_size(n) if chunk_size is None else chunk_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"decode_chunk_size must be a whole number >= 1 (samples decoded at once), got {size!r}")
    if n <= size:
        out = adapter.decode(latents, keep_graph=keep_graph)
        return out if device is None else out.to(device)
    parts = []
    for part in latents.split(size):
        out = adapter.decode(part, keep_graph=keep_graph)
        parts.append(out if device is None else out.to(device))  # moved before the next chunk is decoded
    return torch.cat(parts)


def open_source_image(path: str, who: str, mode: str = "RGB"):
    """An edit record's source image as a PIL image in `mode` (what the family's pipeline converts it to); a missing
    or unreadable file is a ConfigError naming `who` (the pipeline or family) and the path."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return img.convert(mode)
    except FileNotFoundError:
        raise ConfigError(f"{who}: source image {path!r} does not exist; fix the edit record's path") from None
    except (UnidentifiedImageError, OSError) as err:
        raise ConfigError(f"{who}: source image {path!r} is not a readable image ({err})") from None


def prompt_list(prompts: Sequence[str] | str) -> list[str]:
    """The prompts as a list: a lone string is one prompt, not a sequence of characters."""
    if isinstance(prompts, str):
        return [prompts]
    return list(prompts)


def flow_schedule(sched) -> Schedule:
    """A flow-matching scheduler's state after `set_timesteps` as a Schedule: the denoiser's timesteps and
    (sigma, sigma_next) per step (the scheduler keeps one more sigma than steps: the terminal 0)."""
    sigmas = sched.sigmas.to(torch.float64).cpu()
    return Schedule(sched.timesteps.clone().cpu(), sigmas[:-1].clone(), sigmas[1:].clone())
