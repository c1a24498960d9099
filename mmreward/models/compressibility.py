"""JPEG (in)compressibility rewards from DDPO: the encoded size of the image in kB at quality 95.

Encoding is inherently per image; the encoder releases the GIL, so images are encoded on a thread pool.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from mmreward.errors import ConfigError, MediaError
from mmreward.types import Reward, RewardOutput

JPEG_MAX_SIDE = 65_500  # libjpeg's JPEG_MAX_DIMENSION: PIL raises a bare OSError above it


def jpeg_size_kb(images: torch.Tensor | list[torch.Tensor], quality: int = 95) -> torch.Tensor:
    """Size in kB (bytes / 1000, as DDPO) of each (3, H, W) image in [0, 1] saved as JPEG by PIL."""
    from PIL import Image

    def encode(img: torch.Tensor) -> float:
        arr = (img.detach().float() * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).cpu().numpy()
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="JPEG", quality=quality)
        return buf.tell() / 1000.0

    items = list(images)
    for i, img in enumerate(items):
        if max(img.shape[-2:]) > JPEG_MAX_SIDE:
            raise MediaError(f"media[{i}]: image is {img.shape[-1]}x{img.shape[-2]}, a side above JPEG's limit of "
                             f"{JPEG_MAX_SIDE}; downscale it first")
    if len(items) == 1:
        return torch.tensor([encode(items[0])])
    with ThreadPoolExecutor(max_workers=min(8, len(items))) as pool:
        return torch.tensor(list(pool.map(encode, items)))


class JpegCompressibility(Reward):
    name = "jpeg-compressibility"
    requires_prompt = False
    sign = -1.0

    def __init__(self, quality: int = 95, **kwargs) -> None:
        super().__init__(**kwargs)
        if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
            raise ConfigError(f"quality must be an int in [1, 100] (PIL's JPEG quality), got {quality!r}")
        self.quality = quality

    def _score(self, prompts, media):
        size = jpeg_size_kb(media, self.quality)
        return RewardOutput(self.sign * size, {"size_kb": size})


class JpegIncompressibility(JpegCompressibility):
    name = "jpeg-incompressibility"
    sign = 1.0


def load_compressibility(checkpoint=None, *, weights="pretrained", **options) -> JpegCompressibility:
    return JpegCompressibility(**options)


def load_incompressibility(checkpoint=None, *, weights="pretrained", **options) -> JpegIncompressibility:
    return JpegIncompressibility(**options)
