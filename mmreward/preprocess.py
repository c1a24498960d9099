"""Image preprocessing, in one home: batched tensor ops, the Pillow-exact resize, and the per-family card.

Layers, bottom up:
- tensor ops (`resize`, `center_crop`, `resize_longest_and_pad`, `normalize`): batched and differentiable.
  They take (B, C, H, W) float tensors (or a list of (C, H, W) tensors of mixed sizes, processed in
  same-size groups) and return a stacked (B, C, h, w) tensor. The rounding rules are explicit because
  references differ: torchvision's CenterCrop rounds the offset, Hugging Face image processors floor it.
  A 4-channel image is RGBA: its colour is resized premultiplied by alpha, as Pillow resizes RGBA images
  (RGBA -> RGBa, resize, back to RGBA), so fully transparent pixels do not bleed their colour.
- `pil_resize`: the scoring path's resize, on 8-bit images through Pillow itself. torchvision's `Resize`
  on PIL images, Hugging Face's slow image processors, OpenAI CLIP and BLIP all resize uint8 images with
  Pillow, which keeps the horizontal pass in uint8 and uses 22-bit fixed-point weights; float
  `F.interpolate(..., antialias=True)` differs from it by up to a few grey levels, and scores are compared
  to published numbers to 1e-5. Pillow's resize is C code that releases the GIL, so images are resized on
  a small thread pool. (A bit-exact tensor emulation of Pillow's fixed-point passes was measured 15x
  slower than Pillow on CPU, so it is not used.)
- `ImagePreprocess`: the reference preprocessing of the CLIP/BLIP-family rewards as one configurable card.
  Two recipes cover every family in the zoo: "shortest-crop" (resize the shorter side to `size`, bicubic,
  longer side truncated, then centre-crop `crop` x `crop`) and "longest-pad" (resize the longer side to
  `size`, shorter side rounded, and zero-pad centred to a square: open_clip's ResizeMaxSize, used by HPSv2
  on tensors after ToTensor). The scoring path reproduces the reference bit for bit (Pillow on uint8 for
  the "pil" resize backend); the differentiable path (media that requires grad) uses the same geometry
  with the tensor ops, which deviates from Pillow by quantisation and fixed-point rounding only.

Alpha: the references disagree on where an RGBA image loses its alpha, and for transparent images that
moves scores by a large part of their spread, so the card says which the family's original does
(`ALPHA_CONVENTIONS`). The media layer hands 4-channel images to cards that use alpha (see
`Reward.image_alpha`); 4-channel input to a "drop_first" card is reduced to RGB first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from mmreward.errors import ConfigError, RewardInputError

Interpolation = Literal["nearest", "bilinear", "bicubic", "area"]
Images = torch.Tensor | Sequence[torch.Tensor]

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def map_groups(fn: Callable[[torch.Tensor], torch.Tensor], images: Images) -> torch.Tensor:
    """Apply a batched fn to a tensor, or to each same-size group of a list, and restack in input order.

    fn must map every group to the same output size (true after a fixed-size resize or crop).
    """
    if isinstance(images, torch.Tensor):
        return fn(images)
    if len(images) == 0:
        raise RewardInputError("images: got an empty list")
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(images):
        groups.setdefault(tuple(t.shape), []).append(i)
    outputs: list[torch.Tensor | None] = [None] * len(images)
    for idx in groups.values():
        res = fn(torch.stack([images[i] for i in idx]))
        for j, i in enumerate(idx):
            outputs[i] = res[j]
    try:
        return torch.stack(outputs)  # type: ignore[arg-type]
    except RuntimeError as exc:
        raise RewardInputError(
            "images of different sizes must be resized or cropped to one size before stacking"
        ) from exc


def output_size_shorter_side(h: int, w: int, size: int) -> tuple[int, int]:
    """Shorter side -> size, longer side -> int(size * long / short) (torchvision and HF CLIP truncate)."""
    if h <= w:
        return size, int(size * w / h)
    return int(size * h / w), size


# Pillow rounds alpha to 8 bits: below half a level it is 0, and Pillow then keeps the premultiplied colour.
_ALPHA_EPS = 0.5 / 255.0


def _interpolate(x: torch.Tensor, out_hw: tuple[int, int], interpolation: str, antialias: bool) -> torch.Tensor:
    """F.interpolate on (B, C, H, W); C == 4 is RGBA, resized premultiplied and clipped to [0, 1] as Pillow does."""
    kwargs = {} if interpolation in ("nearest", "area") else {"align_corners": False, "antialias": antialias}
    if x.shape[-3] != 4:
        return F.interpolate(x, size=out_hw, mode=interpolation, **kwargs)
    rgb, a = x[:, :3], x[:, 3:4]
    out = F.interpolate(torch.cat([rgb * a, a], dim=1), size=out_hw, mode=interpolation, **kwargs).clamp(0, 1)
    premul, a = out[:, :3], out[:, 3:4]
    visible = a > _ALPHA_EPS
    # where() alone would still back-propagate inf * 0 = nan through the masked branch: divide by a safe alpha
    colour = (premul / torch.where(visible, a, torch.ones_like(a))).clamp(0, 1)
    return torch.cat([torch.where(visible, colour, premul), a], dim=1)


def resize(
    images: Images,
    size: int | tuple[int, int],
    interpolation: Interpolation = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """Resize: an int matches the shorter side (aspect kept), a (h, w) pair is exact."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        out_hw = output_size_shorter_side(h, w, size) if isinstance(size, int) else tuple(size)
        if tuple(out_hw) == (h, w):
            return x
        return _interpolate(x, out_hw, interpolation, antialias)

    return map_groups(fn, images)


def center_crop(
    images: Images, size: int | tuple[int, int], rounding: Literal["round", "floor"] = "round"
) -> torch.Tensor:
    """Center crop (zero-padding first when the image is smaller, as torchvision does).

    rounding="round" is torchvision's `int(round((h - th) / 2))`; "floor" is Hugging Face's `(h - th) // 2`.
    """
    th, tw = (size, size) if isinstance(size, int) else size

    def fn(x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if h < th or w < tw:
            ph, pw = max(th - h, 0), max(tw - w, 0)
            x = F.pad(x, [pw // 2, (pw + 1) // 2, ph // 2, (ph + 1) // 2])
            h, w = x.shape[-2:]
        if rounding == "round":
            top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
        elif rounding == "floor":
            top, left = (h - th) // 2, (w - tw) // 2
        else:
            raise RewardInputError(f"rounding must be 'round' or 'floor', got {rounding!r}")
        return x[..., top : top + th, left : left + tw]

    return map_groups(fn, images)


def resize_longest_and_pad(
    images: Images,
    size: int,
    interpolation: Interpolation = "bicubic",
    antialias: bool = True,
    fill: float = 0.0,
) -> torch.Tensor:
    """Scale so the longer side equals `size` (shorter side rounded), then pad centred to size x size.

    This is open_clip's ResizeMaxSize, used by HPSv2: padding puts floor(pad/2) before and the rest after.
    """

    def fn(x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        scale = size / max(h, w)
        nh, nw = round(h * scale), round(w * scale)
        if (nh, nw) != (h, w):
            x = _interpolate(x, (nh, nw), interpolation, antialias)
        ph, pw = size - nh, size - nw
        return F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2], value=fill)

    return map_groups(fn, images)


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    m = torch.as_tensor(mean, dtype=images.dtype, device=images.device).view(-1, 1, 1)
    s = torch.as_tensor(std, dtype=images.dtype, device=images.device).view(-1, 1, 1)
    return (images - m) / s


def _uint8_levels(images: torch.Tensor) -> torch.Tensor:
    """[0, 1] -> 0..255 levels as floats, rounding as diffusers' `numpy_to_pil` does."""
    return (images * 255.0).round().clamp(0, 255)


def quantize_uint8(images: torch.Tensor) -> torch.Tensor:
    """Round to the 256 levels a PIL round trip would keep (non-differentiable paths only)."""
    return _uint8_levels(images) / 255.0


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """[0, 1] floats -> uint8 levels, detached (the Pillow path's input)."""
    return _uint8_levels(images.detach().float()).to(torch.uint8)


# ----------------------------------------------------------------------------------------------
# the Pillow-exact scoring path
# ----------------------------------------------------------------------------------------------
SizeRule = Callable[[int, int], tuple[int, int]]

_RESAMPLE = {"bicubic": 3, "bilinear": 2, "nearest": 0, "lanczos": 1}  # PIL.Image.Resampling values


@lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1)), thread_name_prefix="pil-resize")


def pil_resize(
    images: torch.Tensor | Sequence[torch.Tensor], size_rule: SizeRule, resample: str = "bicubic"
) -> list[torch.Tensor]:
    """Quantise each (C, H, W) image in [0, 1] to uint8 and resize it with Pillow to size_rule(H, W) = (h, w).

    C is 3 (RGB) or 4 (RGBA, which Pillow resizes premultiplied by alpha). Returns float32 (C, h, w)
    tensors in [0, 1] (levels / 255) on the input's device.
    """
    from PIL import Image

    if resample not in _RESAMPLE:
        raise RewardInputError(f"resample: expected one of {sorted(_RESAMPLE)}, got {resample!r}")
    items = list(images)
    if not items:
        return []
    device = items[0].device
    arrays = [to_uint8(t).permute(1, 2, 0).cpu().numpy() for t in items]

    def one(arr: np.ndarray) -> np.ndarray:
        h, w = arr.shape[:2]
        out_h, out_w = size_rule(h, w)
        img = Image.fromarray(np.ascontiguousarray(arr))  # HxWx4 uint8 is RGBA, which Pillow resizes premultiplied
        if (out_h, out_w) != (h, w):
            img = img.resize((out_w, out_h), resample=_RESAMPLE[resample])
        return np.asarray(img)

    resized = list(_pool().map(one, arrays)) if len(arrays) > 1 else [one(arrays[0])]
    return [torch.from_numpy(a.copy()).permute(2, 0, 1).to(device).float() / 255.0 for a in resized]


# ----------------------------------------------------------------------------------------------
# the per-family preprocessing card
# ----------------------------------------------------------------------------------------------
ALPHA_CONVENTIONS = {
    "drop_first": "alpha dropped before resizing (PIL convert('RGB') first: Hugging Face processors up to "
    "transformers 4.x)",
    "resize_then_drop": "the RGBA image is resized (Pillow: premultiplied by alpha, so transparent pixels come "
    "out dark) and cropped, then alpha is dropped (OpenAI CLIP's and open_clip's preprocess, ImageReward)",
    "composite:<colour>": "alpha-composited onto a background colour (white, black or #rrggbb) first",
    "reject": "images with any transparency are an error",
}
_NAMED_COLOURS = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}


def parse_alpha(alpha: str) -> tuple[str, tuple[float, float, float] | None]:
    """'composite:white' -> ('composite', (1, 1, 1)); other conventions -> (alpha, None)."""
    if alpha in ("drop_first", "resize_then_drop", "reject"):
        return alpha, None
    if isinstance(alpha, str) and alpha.startswith("composite:"):
        colour = alpha.split(":", 1)[1].strip().lower()
        if colour in _NAMED_COLOURS:
            return "composite", _NAMED_COLOURS[colour]
        if len(colour) == 7 and colour[0] == "#":
            try:
                return "composite", tuple(int(colour[i : i + 2], 16) / 255.0 for i in (1, 3, 5))  # type: ignore[return-value]
            except ValueError:
                pass
    raise ConfigError(
        f"alpha must be one of 'drop_first', 'resize_then_drop', 'reject' or 'composite:<white|black|#rrggbb>', "
        f"got {alpha!r}"
    )


@dataclass(frozen=True)
class ImagePreprocess:
    size: int = 224
    crop: int = 224
    mode: Literal["shortest-crop", "longest-pad"] = "shortest-crop"
    crop_rounding: Literal["round", "floor"] = "round"
    resize_backend: Literal["pil", "torch"] = "pil"
    mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    std: tuple[float, float, float] = OPENAI_CLIP_STD
    alpha: str = "drop_first"

    def __post_init__(self) -> None:
        parse_alpha(self.alpha)
        if self.size < 1 or self.crop < 1:
            raise ConfigError(f"size and crop must be >= 1, got size={self.size}, crop={self.crop}")
        if self.mode not in ("shortest-crop", "longest-pad"):
            raise ConfigError(f"mode must be 'shortest-crop' or 'longest-pad', got {self.mode!r}")
        if self.crop_rounding not in ("round", "floor"):
            raise ConfigError(f"crop_rounding must be 'round' or 'floor', got {self.crop_rounding!r}")
        if self.resize_backend not in ("pil", "torch"):
            raise ConfigError(f"resize_backend must be 'pil' or 'torch', got {self.resize_backend!r}")

    def describe(self) -> str:
        if self.mode == "longest-pad":
            geo = f"resize longer side to {self.size} (bicubic, antialiased, on float tensors), zero-pad to square"
        else:
            geo = (
                f"resize shorter side to {self.size} (bicubic; Pillow on uint8 when scoring), "
                f"centre-crop {self.crop} (offset {self.crop_rounding}ed)"
            )
        return f"{geo}; alpha {self.alpha}; normalise mean={self.mean} std={self.std}"

    def _alpha_first(self, x: torch.Tensor) -> torch.Tensor:
        """(C, H, W) or (B, C, H, W) -> what the geometry gets: RGB, or RGBA for resize_then_drop."""
        if x.shape[-3] != 4:
            return x
        kind, colour = parse_alpha(self.alpha)
        if kind == "resize_then_drop":
            return x
        rgb, a = x[..., :3, :, :], x[..., 3:4, :, :]
        if kind == "reject":
            with torch.no_grad():
                lowest = float(a.min())
            if lowest < 1.0:
                raise RewardInputError(
                    f"this reward's original cannot score transparent images (alpha down to {lowest:.3g}); "
                    "composite them onto a background first, e.g. media.load_image(img, alpha='white')"
                )
            return rgb
        if kind == "composite":
            bg = torch.as_tensor(colour, dtype=x.dtype, device=x.device).view(3, 1, 1)
            return rgb * a + bg * (1 - a)
        return rgb

    def __call__(self, images: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """(B, C, H, W) or a list of (C, H, W) in [0, 1], C = 3 or 4 (RGBA) -> normalised (B, 3, crop, crop)
        float32 pixels. Alpha is handled as `self.alpha` says."""
        wants_grad = images.requires_grad if isinstance(images, torch.Tensor) else any(t.requires_grad for t in images)
        if isinstance(images, torch.Tensor):
            images = self._alpha_first(images.float())
        else:
            images = [self._alpha_first(t.float()) for t in images]
        # RGBA items keep alpha through resize (premultiplied) and crop/pad, then drop it: the reference
        # converts to RGB after its geometric transforms. Dropping per group lets RGB and RGBA items stack.
        if self.mode == "longest-pad":
            # the reference itself resizes float tensors, so both paths are the same computation
            x = map_groups(lambda g: resize_longest_and_pad(g, self.size, "bicubic", antialias=True)[:, :3], images)
        elif wants_grad or self.resize_backend == "torch":
            # resize and crop each same-size group together: resized groups differ in size until cropped
            x = map_groups(
                lambda g: center_crop(
                    resize(g, self.size, "bicubic", antialias=True), self.crop, self.crop_rounding
                )[:, :3],
                images,
            )
        else:
            resized = pil_resize(images, lambda h, w: output_size_shorter_side(h, w, self.size))
            x = center_crop([t[:3] for t in resized], self.crop, self.crop_rounding)
        return normalize(x, self.mean, self.std)
