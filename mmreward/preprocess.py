"""Batched, differentiable tensor preprocessing that reward families compose into their reference pipelines.

Every function takes (B, C, H, W) float tensors (or a list of (C, H, W) tensors of mixed sizes, which
are processed in same-size groups) and returns a stacked (B, C, h, w) tensor. The rounding rules are
explicit because references differ: torchvision's CenterCrop rounds the offset, Hugging Face image
processors floor it.

A 4-channel image is RGBA: its colour is resized premultiplied by alpha, as Pillow resizes RGBA images
(RGBA -> RGBa, resize, back to RGBA), so fully transparent pixels do not bleed their colour.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F

from mmreward.errors import RewardInputError

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


def quantize_uint8(images: torch.Tensor) -> torch.Tensor:
    """Round to the 256 levels a PIL round trip would keep (non-differentiable paths only)."""
    return (images * 255.0).round().clamp(0, 255) / 255.0
