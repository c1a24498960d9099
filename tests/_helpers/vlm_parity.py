"""Shared plumbing of the VLM reward parity tests (tests/mmreward/test_parity_*.py, test_judge_fidelity.py).

- `smart_resize` / `fetch_image`: qwen_vl_utils' image sizing, the one third-party preprocessing step that the
  Qwen-VL rewards' originals (EditScore, UnifiedReward, VideoScore2, R1-Reward, Skywork-VL-Reward, t2v_metrics,
  PaCo-RL's vLLM server) all call. Transcribed once here; the switches name where the originals' copies differ,
  and each test passes the ones its original uses;
- `as_transformers4_sees`: an image as the originals' transformers 4.x processor takes it (see there);
- `spy_on_generate`: records what a judge hands its model's `generate`;
- `write_image_files` / `smooth_images` / `smooth_rgba` / `alpha_mode_images`: the tests' input images.

Each test keeps its own transcription of its original's prompt, request and scoring code, its own inputs and its
own tolerances. Nothing here imports mmreward (a reference must not go through the code it checks).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

# qwen_vl_utils' defaults: 4 to 16384 visual tokens of 28 x 28 pixels
MIN_PIXELS, MAX_PIXELS = 4 * 28 * 28, 16384 * 28 * 28


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS, *, floor_rounded_at_one_patch: bool = True,
                 floor_shrunk_at_one_patch: bool = False) -> tuple[int, int]:
    """qwen_vl_utils vision_process.py `smart_resize`: each side rounded to a multiple of `factor`, then scaled
    (aspect kept) into [min_pixels, max_pixels]. The defaults are the released qwen-vl-utils 0.0.8 to 0.0.14
    (read from the PyPI wheels): the rounded sides floored at one patch, the shrunk ones not.

    floor_shrunk_at_one_patch: `max(factor, floor_by_factor(...))` in the shrink branch, as in the later
    vision_process.py of the QwenLM/Qwen2.5-VL repository (the R1-Reward and Skywork tests' transcription);
    floor_rounded_at_one_patch=False: plain `round(side / factor) * factor`, as the PaCo test transcribes
    transformers 4.5x's Qwen2-VL image processor (`image_processing_qwen2_vl.smart_resize`, run by PaCo-RL's vLLM)."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if floor_rounded_at_one_patch:
        h_bar, w_bar = max(factor, h_bar), max(factor, w_bar)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
        if floor_shrunk_at_one_patch:
            h_bar, w_bar = max(factor, h_bar), max(factor, w_bar)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def fetch_image(image: Image.Image | str | os.PathLike, *, rgba_on_white: bool, min_pixels: int = MIN_PIXELS,
                max_pixels: int = MAX_PIXELS, floor_shrunk_at_one_patch: bool = False) -> Image.Image:
    """qwen_vl_utils `fetch_image` for a PIL image or a file path: to RGB, `smart_resize`, then Pillow's default
    `Image.resize` (bicubic for RGB).

    rgba_on_white=True: `to_rgb`, an RGBA image pasted on white with its alpha as the mask (every other mode
    `convert("RGB")`), as qwen-vl-utils 0.0.9 to 0.0.14 do (read from the PyPI wheels 0.0.9, 0.0.10, 0.0.11,
    0.0.13, 0.0.14: vision_process.py `to_rgb`; what EditScore, R1-Reward and Skywork-VL-Reward get, which
    require qwen-vl-utils unpinned); False: plain `convert("RGB")` (alpha dropped), as qwen-vl-utils 0.0.8 does
    (its wheel: `image = image_obj.convert("RGB")`), the version UnifiedReward's README @ ff6f520 pins for its
    in-process Qwen2.5-VL scripts. The two agree on every image without alpha."""
    if isinstance(image, (str, os.PathLike)):
        image = Image.open(image)
    if rgba_on_white and image.mode == "RGBA":
        white = Image.new("RGB", image.size, (255, 255, 255))
        white.paste(image, mask=image.split()[3])
        image = white
    else:
        image = image.convert("RGB")
    height, width = smart_resize(image.height, image.width, min_pixels=min_pixels, max_pixels=max_pixels,
                                 floor_shrunk_at_one_patch=floor_shrunk_at_one_patch)
    return image.resize((width, height))


def as_transformers4_sees(image: Image.Image) -> Image.Image:
    """`image` without `info["transparency"]`: what the originals' Hugging Face processor composites, nothing.

    Pillow's `convert("RGB")` of a palette image with a transparent index (qwen_vl_utils' `to_rgb` of mode "P")
    leaves that index's colour in `info["transparency"]`, and `resize` keeps it. transformers' `convert_to_rgb`
    returns a mode-"RGB" image as it is in 4.x (4.57.1 wheel, image_transforms.py) and in 5.0.0 (wheel read); the
    5.24 installed here composites an RGB image whose info names a colour onto white (pixels of exactly that
    colour, after the resize). The originals ran transformers 4.x (R1-Reward: transformers main of early 2025;
    Skywork-VL-Reward, Apr 2025; EditScore, Sep 2025: unpinned), so a reference hands the processor the image
    without it. A copy; no effect on images without the key."""
    if "transparency" not in image.info:
        return image
    image = image.copy()
    del image.info["transparency"]
    return image


def spy_on_generate(judge: Any) -> list[tuple[dict, torch.Tensor]]:
    """Wrap `judge.backend.model.generate`: the returned list gets, per call, its keyword arguments and the tokens
    it generated (prompt cut off); the call itself runs unchanged."""
    calls: list[tuple[dict, torch.Tensor]] = []
    generate = judge.backend.model.generate

    def spy(**kwargs):
        out = generate(**kwargs)
        sequences = getattr(out, "sequences", out)  # a tensor, or return_dict_in_generate's output
        calls.append((kwargs, sequences[:, kwargs["input_ids"].shape[1]:]))
        return out

    judge.backend.model.generate = spy
    return calls


# RGB, grayscale, odd-size RGB and RGBA PNGs (file name, PIL mode, array shape): what users hand the originals
IMAGE_SPECS = (("rgb.png", "RGB", (64, 80, 3)), ("gray.png", "L", (50, 40)), ("odd.png", "RGB", (37, 61, 3)),
               ("rgba.png", "RGBA", (45, 45, 4)))


def write_image_files(folder: Path, specs: Sequence[tuple[str, str, tuple[int, ...]]], *, seed: int,
                      sine_red: bool) -> list[str]:
    """One PNG of uniform random pixels per (file name, PIL mode, array shape) in `specs` (e.g. IMAGE_SPECS), in
    `folder`; the paths.

    sine_red: the red channel of each RGB image a horizontal sine instead (smooth structure under the noise, so
    that the resampling filter matters)."""
    rng = np.random.default_rng(seed)
    paths = []
    for name, mode, shape in specs:
        arr = rng.integers(0, 256, shape, dtype=np.uint8)
        if sine_red and mode == "RGB":
            xx = np.mgrid[: shape[0], : shape[1]][1]
            arr[..., 0] = (127 + 120 * np.sin(xx / 5.0)).astype(np.uint8)
        Image.fromarray(arr, mode).save(folder / name)
        paths.append(str(folder / name))
    return paths


def smooth_rgba(seed: int, height: int = 60, width: int = 90) -> Image.Image:
    """An RGBA image of 8x8-pixel random colour blocks whose alpha runs from 0 (left column) to 255 (right
    column): partly transparent, so every alpha convention (dropped, composited on white) gives other pixels."""
    rng = np.random.default_rng(seed)
    rgb = np.kron(rng.random((height // 8 + 1, width // 8 + 1, 3)), np.ones((8, 8, 1)))[:height, :width]
    alpha = np.broadcast_to(np.linspace(0, 255, width).round()[None, :, None], (height, width, 1))
    return Image.fromarray(np.concatenate([(rgb * 255).astype(np.uint8), alpha.astype(np.uint8)], -1), "RGBA")


def alpha_mode_images(seed: int, height: int = 45, width: int = 60) -> tuple[Image.Image, Image.Image]:
    """Transparency outside mode "RGBA": a grey-with-alpha image (mode "LA", alpha 0 at the left column to 255 at
    the right) and a 4-colour palette image whose index 0 (a quarter of the blocks) is transparent (mode "P",
    `info["transparency"] = 0`: a tRNS chunk when saved as PNG), both of 8x8-pixel random blocks. qwen_vl_utils'
    `to_rgb` composites only mode "RGBA", so these two take `convert("RGB")` there (LA's alpha dropped, the
    palette's transparency ignored), and compositing them on white instead gives other pixels."""
    rng = np.random.default_rng(seed)

    def blocks(c: int, high: int) -> np.ndarray:
        return np.kron(rng.integers(0, high, (height // 8 + 1, width // 8 + 1, c)), np.ones((8, 8, 1), np.int64))[
            :height, :width].astype(np.uint8)

    alpha = np.broadcast_to(np.linspace(0, 255, width).round()[None, :, None], (height, width, 1)).astype(np.uint8)
    la = Image.fromarray(np.concatenate([blocks(1, 256), alpha], -1), "LA")
    palette = Image.fromarray(blocks(1, 4)[..., 0], "L").convert("P")  # "L" -> "P": greyscale palette, replaced
    palette.putpalette(rng.integers(0, 256, 4 * 3).astype(np.uint8).tobytes())
    palette.info["transparency"] = 0
    return la, palette


def smooth_images(seed: int) -> tuple[Image.Image, Image.Image, Image.Image]:
    """64x96 RGB, 70x70 grayscale (mode "L") and odd-sized 61x93 RGB images of 8x8-pixel random blocks."""
    rng = np.random.default_rng(seed)

    def smooth(h, w, c):
        return np.kron(rng.random((h // 8 + 1, w // 8 + 1, c)), np.ones((8, 8, 1)))[:h, :w]

    rgb = Image.fromarray((smooth(64, 96, 3) * 255).astype(np.uint8))
    gray = Image.fromarray((smooth(70, 70, 1)[..., 0] * 255).astype(np.uint8))
    odd = Image.fromarray((smooth(61, 93, 3) * 255).astype(np.uint8))
    return rgb, gray, odd
