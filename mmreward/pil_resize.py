"""Resize exactly as the reference pipelines do: 8-bit images through Pillow.

torchvision's `Resize` on PIL images, Hugging Face's slow image processors, OpenAI CLIP and BLIP all
resize uint8 images with Pillow. Pillow keeps the horizontal pass in uint8 and uses 22-bit
fixed-point weights, so `F.interpolate(..., antialias=True)` on floats differs from it by up to a few
grey levels (see the zoo tests for the measured score deviation). Scores are compared to published
numbers to 1e-5, so the non-differentiable scoring path goes through Pillow itself.

Pillow's resize is C code that releases the GIL: images are resized on a small thread pool, and
all the other preprocessing stays batched on tensors. (A bit-exact tensor emulation of Pillow's
fixed-point passes was measured 15x slower than Pillow on CPU, so it is not used.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np
import torch

from mmreward.errors import RewardInputError

SizeRule = Callable[[int, int], tuple[int, int]]

_RESAMPLE = {"bicubic": 3, "bilinear": 2, "nearest": 0, "lanczos": 1}  # PIL.Image.Resampling values


@lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1)), thread_name_prefix="pil-resize")


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """[0, 1] floats -> uint8, rounding as diffusers' `numpy_to_pil` does (uint8 input comes back unchanged)."""
    return (images.detach().float() * 255.0).round().clamp_(0, 255).to(torch.uint8)


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
