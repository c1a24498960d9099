"""Images and videos in, one tensor convention out.

Images become float tensors in [0, 1] of shape (3, H, W), stacked to (B, 3, H, W) when all items
share a size; videos become (T, 3, H, W), stacked to (B, T, 3, H, W). A batch whose items differ in
size is a list of per-item tensors; rewards resize them in same-size groups (see `preprocess`).

Value ranges are never guessed: uint8 means 0-255 and uint16 0-65535; float data is read as [0, 1]
unless `value_range` says otherwise (e.g. (0, 255) or (-1, 1)), and float data outside the declared
range is an error rather than a silent rescale.

Alpha: by default RGBA loses alpha here as PIL's convert("RGB") does. alpha="keep" returns RGBA images
with any transparency as (4, H, W) instead, for rewards whose original preprocessing resizes the RGBA
image before dropping alpha (their preprocessing card uses it; see `Reward.image_alpha`); grey with alpha
(PIL "LA") and palette images with transparency count as RGBA there. alpha="keep_rgba" keeps alpha only where
the PIL mode is exactly "RGBA" and drops it from every other mode, as qwen_vl_utils' `to_rgb` does (it pastes
"RGBA" on white and `convert("RGB")`s the rest: LA loses its alpha, a palette's transparency is ignored).
Arrays and tensors have no PIL mode: with 4 channels they are RGBA under every option.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from mmreward import video_decode
from mmreward.errors import MediaError, MissingExtraError, RewardInputError

MediaBatch = torch.Tensor | list[torch.Tensor]
ValueRange = tuple[float, float]
Alpha = Literal["drop", "white", "black", "keep", "keep_rgba"]

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff"}
VIDEO_SUFFIXES = {".mp4", ".webm", ".avi", ".mov", ".mkv", ".gif", ".m4v"}
_RANGE_TOLERANCE = 1e-3
# Image files above this many pixels are rejected from their header, before PIL allocates anything: a
# 74-byte PNG can claim 20000x20000 (1.2 GB as RGB, 4.8 GB as float), and no reward looks at more than a
# few megapixels. 8192x8192 leaves room for any real photo or generated image.
MAX_IMAGE_PIXELS = 8192 * 8192
# The area alone lets a 1x1,000,000 strip through, and rewards resize the short side up (CLIP: to 224, so a
# 1x80,000 strip becomes 224x17.9M pixels, 2.9 GB measured) and JPEG cannot encode a side above 65,500: each
# side and the aspect ratio are capped too, from the header. 16384 is twice the side of the area cap's square;
# 64:1 is past any panorama or long screenshot (about 20:1) and keeps a 224-pixel short side under 15k long.
MAX_IMAGE_SIDE = 16384
MAX_ASPECT_RATIO = 64.0
# Videos are checked from their header before a decoder sees them (see `read_video`): 100k frames is 55 min
# at 30 fps; 3 hours bounds the declared duration; the sampled frames may hold 2**30 pixels (12.9 GB as float
# RGB: 4,096 frames at 512x512, or 517 at 1080p), which stops "every frame" of a clip with 100k of them.
MAX_VIDEO_FRAMES = 100_000
MAX_VIDEO_SECONDS = 3 * 3600.0
MAX_DECODED_PIXELS = 2**30


def check_value_range(value_range: Any) -> ValueRange | None:
    """None, or a (low, high) pair of finite numbers with high > low, as a tuple of floats."""
    if value_range is None:
        return None
    hint = "pass value_range=(low, high) with finite numbers and high > low, e.g. (0, 255) or (-1, 1)"
    if isinstance(value_range, (str, bytes)) or not hasattr(value_range, "__len__") or len(value_range) != 2:
        raise RewardInputError(f"value_range: expected a pair (low, high), got {value_range!r}; {hint}")
    try:
        if any(isinstance(v, (str, bytes, bool)) for v in value_range):
            raise TypeError
        lo, hi = float(value_range[0]), float(value_range[1])
    except (TypeError, ValueError):
        raise RewardInputError(f"value_range: expected two numbers, got {value_range!r}; {hint}") from None
    if not (np.isfinite(lo) and np.isfinite(hi)) or not hi > lo:
        raise RewardInputError(f"value_range: got ({lo:g}, {hi:g}); {hint}")
    return lo, hi


def _check_max_image_pixels(max_image_pixels: Any) -> None:
    if max_image_pixels is not None and (
        isinstance(max_image_pixels, bool) or not isinstance(max_image_pixels, (int, np.integer)) or max_image_pixels < 1
    ):
        raise RewardInputError(f"max_image_pixels: expected a positive int or None, got {max_image_pixels!r}")


def _check_image_size(
    size: tuple[int, int],
    max_image_pixels: int | None,
    what: str,
    max_image_side: int | None = MAX_IMAGE_SIDE,
    max_aspect_ratio: float | None = MAX_ASPECT_RATIO,
) -> None:
    """Reject an image from its (width, height) alone, so that nothing is decoded or allocated first."""
    w, h = size
    if max_image_pixels is not None and w * h > max_image_pixels:
        raise MediaError(
            f"{what}: image is {w}x{h} = {w * h} pixels, above max_image_pixels={max_image_pixels}; "
            "downscale it first, or pass a larger max_image_pixels (None for no cap)"
        )
    if max_image_side is not None and max(w, h) > max_image_side:
        raise MediaError(
            f"{what}: image is {w}x{h}, a side above max_image_side={max_image_side}; "
            "downscale it first, or pass a larger max_image_side (None for no cap)"
        )
    if max_aspect_ratio is not None and min(w, h) > 0 and max(w, h) / min(w, h) > max_aspect_ratio:
        raise MediaError(
            f"{what}: image is {w}x{h}, an aspect ratio of {max(w, h) / min(w, h):.0f}:1, above "
            f"max_aspect_ratio={max_aspect_ratio:g}; crop it first, or pass a larger max_aspect_ratio (None for no cap)"
        )


def _check_size_options(max_image_side: Any, max_aspect_ratio: Any) -> None:
    if max_image_side is not None and (isinstance(max_image_side, bool) or not isinstance(max_image_side, int)
                                       or max_image_side < 1):
        raise RewardInputError(f"max_image_side: expected a positive int or None, got {max_image_side!r}")
    if max_aspect_ratio is not None and (isinstance(max_aspect_ratio, bool)
                                         or not isinstance(max_aspect_ratio, (int, float))
                                         or not max_aspect_ratio >= 1):
        raise RewardInputError(f"max_aspect_ratio: expected a number >= 1 or None, got {max_aspect_ratio!r}")


def _check_not_empty(t: torch.Tensor, what: str, video: bool = False) -> torch.Tensor:
    """Rewards divide by H, W and T (resize ratios, means): a zero-size medium is an input error here."""
    if t.shape[-1] == 0 or t.shape[-2] == 0:
        raise MediaError(f"{what}: image has 0 pixels (shape {tuple(t.shape)}); every image needs H, W >= 1")
    if video and t.ndim >= 4 and t.shape[-4] == 0:
        raise MediaError(f"{what}: video has 0 frames (shape {tuple(t.shape)}); every video needs T >= 1")
    return t


def _check_exists(p: Path, kind: str) -> None:
    if p.exists():
        return
    if p.is_symlink():  # exists() follows the link: a dangling or looping link lands here
        raise MediaError(
            f"{kind} file {p} is a broken or looping symbolic link (-> {os.readlink(p)}); fix or remove the link"
        )
    raise MediaError(f"{kind} file not found: {p}")


# ----------------------------------------------------------------------------------------------
# value ranges
# ----------------------------------------------------------------------------------------------
def _to_unit_range(x: torch.Tensor, value_range: ValueRange | None, what: str) -> torch.Tensor:
    """Map integer or float pixel data to float in [0, 1] according to an explicit convention."""
    value_range = check_value_range(value_range)
    if x.dtype == torch.uint8:
        if value_range not in (None, (0, 255)):
            raise MediaError(f"{what}: uint8 data is always 0-255, but value_range={value_range} was given")
        return x.float() / 255.0
    if x.dtype in (torch.int16, torch.int32, torch.int64, torch.uint16 if hasattr(torch, "uint16") else None):
        if value_range is None:
            raise MediaError(
                f"{what}: integer pixel data of dtype {x.dtype} is ambiguous; pass value_range=(0, 255) "
                "or (0, 65535), or convert to uint8"
            )
        x = x.float()
    if not x.is_floating_point():
        raise MediaError(f"{what}: expected uint8 or float pixel data, got dtype {x.dtype}")
    lo, hi = (0.0, 1.0) if value_range is None else value_range
    if x.numel():
        with torch.no_grad():
            if not bool(torch.isfinite(x).all()):
                raise MediaError(f"{what}: pixel data contains NaN or infinite values")
            mn, mx = float(x.min()), float(x.max())
        span = hi - lo
        if mn < lo - _RANGE_TOLERANCE * span or mx > hi + _RANGE_TOLERANCE * span:
            hint = " Pass value_range=(0, 255) for 0-255 floats." if mx > 1.5 else ""
            hint += " Pass value_range=(-1, 1) for [-1, 1] data." if mn < -_RANGE_TOLERANCE else ""
            raise MediaError(
                f"{what}: float pixel values span [{mn:.4g}, {mx:.4g}], outside the declared range "
                f"[{lo:g}, {hi:g}].{hint}"
            )
    if (lo, hi) == (0.0, 1.0):
        return x if x.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16) else x.float()
    return (x - lo) / (hi - lo)


def _fix_channels(x: torch.Tensor, alpha: Alpha, what: str) -> torch.Tensor:
    """(..., C, H, W) with C in {1, 3, 4} -> (..., 3, H, W), or (..., 4, H, W) for transparent RGBA and alpha="keep"
    or "keep_rgba" (4 channels without a PIL mode are RGBA)."""
    if alpha not in ("drop", "white", "black", "keep", "keep_rgba"):
        raise RewardInputError(f"alpha must be 'drop', 'white', 'black', 'keep' or 'keep_rgba', got {alpha!r}")
    c = x.shape[-3]
    if c == 3:
        return x
    if c == 1:
        return x.expand(*x.shape[:-3], 3, *x.shape[-2:])
    if c == 4:
        rgb, a = x[..., :3, :, :], x[..., 3:4, :, :]
        if alpha in ("keep", "keep_rgba"):
            with torch.no_grad():
                opaque = bool((a >= 1).all())
            # an opaque alpha changes nothing in any convention: RGB keeps batches stackable and paths fast
            return rgb if opaque else x
        if alpha == "drop":  # what PIL's convert("RGB") does
            return rgb
        bg = 1.0 if alpha == "white" else 0.0
        return rgb * a + bg * (1 - a)
    raise MediaError(f"{what}: expected 1, 3 or 4 channels in dimension -3, got {c} (shape {tuple(x.shape)})")


# ----------------------------------------------------------------------------------------------
# images
# ----------------------------------------------------------------------------------------------
def _pil_to_tensor(img: Any, alpha: str, what: str) -> torch.Tensor:
    from PIL import Image

    if alpha == "keep_rgba":  # qwen_vl_utils' to_rgb: only mode "RGBA" keeps alpha; the rest is convert("RGB")
        # (for LA, PA, RGBa and P with transparency, Pillow's convert("RGBA") less alpha equals its convert("RGB"))
        alpha = "keep" if img.mode == "RGBA" else "drop"
    if img.mode == "P":  # palette, possibly with a transparent index
        img = img.convert("RGBA")
    elif img.mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.float32) / (65535.0 if img.mode.startswith("I;16") else float(2**31 - 1))
        return _fix_channels(torch.from_numpy(arr)[None].clamp(0, 1), alpha, what)
    elif img.mode == "F":
        arr = np.asarray(img, dtype=np.float32)
        return _fix_channels(_to_unit_range(torch.from_numpy(arr)[None], None, what), alpha, what)
    elif img.mode in ("LA", "PA", "RGBa", "La"):
        img = img.convert("RGBA")
    elif img.mode not in ("RGB", "RGBA", "L"):
        img = img.convert("RGB")
    arr = np.asarray(img)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    t = torch.from_numpy(arr.copy()).permute(2, 0, 1)
    assert isinstance(img, Image.Image)
    return _fix_channels(t.float() / 255.0, alpha, what)


def read_image(
    path: str | os.PathLike,
    alpha: Alpha = "drop",
    max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    max_image_side: int | None = MAX_IMAGE_SIDE,
    max_aspect_ratio: float | None = MAX_ASPECT_RATIO,
) -> torch.Tensor:
    """Read an image file to a (3, H, W) float tensor in [0, 1] ((4, H, W) for transparent RGBA and alpha="keep"
    or "keep_rgba").

    Files whose header claims more than `max_image_pixels` pixels, a side above `max_image_side` or an aspect
    ratio above `max_aspect_ratio` are rejected before decoding (None: no such cap of ours; PIL's own
    decompression-bomb limit, `PIL.Image.MAX_IMAGE_PIXELS`, still applies).
    """
    import re

    from PIL import Image

    _check_max_image_pixels(max_image_pixels)
    _check_size_options(max_image_side, max_aspect_ratio)
    p = Path(path)
    _check_exists(p, "image")
    try:
        with Image.open(p) as img:  # reads the header only
            _check_image_size(img.size, max_image_pixels, str(p), max_image_side, max_aspect_ratio)
            img.load()
            return _check_not_empty(_pil_to_tensor(img, alpha, str(p)), str(p))
    except MediaError:
        raise
    except Image.DecompressionBombError as exc:
        n = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{n.group(1)} pixels" if n else "too many pixels"
        raise MediaError(
            f"{p}: image has {size}, more than PIL decodes (a decompression bomb?); PIL refused it: {exc}"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - PIL's plugins raise a zoo of types on corrupt files
        raise MediaError(f"cannot read image {p}: {exc} (is the file corrupt or not an image?)") from exc


def _numpy_to_tensor(arr: np.ndarray, value_range: ValueRange | None, alpha: str, what: str) -> torch.Tensor:
    if arr.dtype.kind not in "biuf":
        raise MediaError(
            f"{what}: numpy arrays of dtype {arr.dtype} are not pixel data (dtype object comes from ragged or mixed "
            "lists); pass a list of images, or convert with arr.astype(np.uint8) / arr.astype(np.float32)"
        )
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim not in (3, 4) or arr.shape[-1] not in (1, 3, 4):
        raise MediaError(
            f"{what}: numpy images must be HW, HWC or BHWC with C in (1, 3, 4); got shape {arr.shape}. "
            "For channel-first data pass a torch tensor instead."
        )
    if arr.dtype == np.uint16:
        t = torch.from_numpy(arr.astype(np.float32) / 65535.0)
    elif arr.dtype == np.bool_:
        t = torch.from_numpy(arr.astype(np.float32))
    else:
        try:
            raw = torch.from_numpy(np.ascontiguousarray(arr))
        except TypeError as exc:  # float128, uint64 ... have no torch dtype
            raise MediaError(f"{what}: numpy dtype {arr.dtype} is not supported; convert to uint8 or float32") from exc
        t = _to_unit_range(raw, value_range, what)
    return _fix_channels(t.movedim(-1, -3), alpha, what)


def _tensor_to_unit(t: torch.Tensor, value_range: ValueRange | None, alpha: str, what: str) -> torch.Tensor:
    if t.ndim < 3:
        raise MediaError(f"{what}: tensors must be CHW, BCHW or BTCHW; got shape {tuple(t.shape)}")
    if t.shape[-3] not in (1, 3, 4) and t.shape[-1] in (1, 3, 4):
        raise MediaError(
            f"{what}: tensor of shape {tuple(t.shape)} looks channel-last; tensors must be channel-first "
            "(..., C, H, W): use t.permute(...) or pass a numpy HWC array"
        )
    return _fix_channels(_to_unit_range(t, value_range, what), alpha, what)


def load_image(
    item: Any,
    value_range: ValueRange | None = None,
    alpha: Alpha = "drop",
    max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    max_image_side: int | None = MAX_IMAGE_SIDE,
    max_aspect_ratio: float | None = MAX_ASPECT_RATIO,
) -> torch.Tensor:
    """One image from a path, PIL image, numpy HW/HWC array or CHW tensor -> (3, H, W) in [0, 1].

    The size caps apply to files and PIL images (see `read_image`); arrays and tensors are already in memory.
    """
    from PIL import Image

    value_range = check_value_range(value_range)
    _check_max_image_pixels(max_image_pixels)
    _check_size_options(max_image_side, max_aspect_ratio)
    if isinstance(item, (str, os.PathLike)):
        return read_image(item, alpha, max_image_pixels, max_image_side, max_aspect_ratio)
    if isinstance(item, Image.Image):
        _check_image_size(item.size, max_image_pixels, "image", max_image_side, max_aspect_ratio)
        return _check_not_empty(_pil_to_tensor(item, alpha, "image"), "image")
    if isinstance(item, np.ndarray):
        t = _numpy_to_tensor(item, value_range, alpha, "image")
    elif isinstance(item, torch.Tensor):
        t = _tensor_to_unit(item, value_range, alpha, "image")
    else:
        raise MediaError(
            f"image: expected a path, PIL.Image, numpy array or torch tensor, got {type(item).__name__}"
        )
    if t.ndim != 3:
        raise MediaError(f"image: expected a single image (3 dims after conversion), got shape {tuple(t.shape)}")
    return _check_not_empty(t, "image")


# ----------------------------------------------------------------------------------------------
# videos
# ----------------------------------------------------------------------------------------------
def available_video_backends() -> list[str]:
    import importlib.util

    return [name for name in ("decord", "av") if importlib.util.find_spec(name) is not None]


QWEN_VL_MIN_FRAMES = 4  # qwen_vl_utils FPS_MIN_FRAMES
QWEN_VL_MAX_FRAMES = 768  # qwen_vl_utils FPS_MAX_FRAMES


def sample_frame_indices(
    total: int,
    num_frames: int | None = None,
    *,
    fps: float | None = None,
    source_fps: float | None = None,
    sampling: Literal["uniform", "center", "all", "qwen-vl", "qwen-vl-utils"] = "uniform",
) -> list[int]:
    """Which frames to keep.

    - by count, "uniform": linspace(0, total - 1, num_frames) rounded (first and last frame kept).
    - by count, "center": the middle frame of each of num_frames equal segments.
    - by fps: every (source_fps / fps)-th frame, starting at 0.
    - by fps, "qwen-vl": VideoReward's vendored Qwen-VL video reader (KwaiVGI/VideoAlign vision_process.py
      `smart_nframes`): the clip's duration times `fps` frames, at least 4, at most 768 and the clip's own
      count (both bounds even), rounded to the nearest even number (Python's round, halves to even:
      7.5 -> 8, 5.5 -> 6), then spread uniformly like "uniform".
    - by fps, "qwen-vl-utils": the released qwen_vl_utils' rule, the same count floored to an even number.
    """
    if total <= 0:
        raise MediaError("video has no frames")
    if fps is not None:
        if num_frames is not None:
            raise RewardInputError("pass either num_frames or fps, not both")
        if not source_fps or source_fps <= 0:
            raise MediaError("sampling by fps needs the video's own frame rate, which is unknown for this file")
        if fps <= 0:
            raise RewardInputError(f"fps must be > 0, got {fps}")
        if sampling == "qwen-vl-utils":
            # the released qwen_vl_utils (0.0.10 to 0.0.14, what VideoScore2 and t2v_metrics install):
            # smart_nframes floors the count to an even number (30 frames at 8 fps, 2 fps: 7.5 -> 6)
            count = min(max(total / source_fps * fps, QWEN_VL_MIN_FRAMES), (min(QWEN_VL_MAX_FRAMES, total) // 2) * 2,
                        total)
            count = int(count // 2) * 2
            if count < 2:
                return list(range(total))
            return np.linspace(0, total - 1, count).round().astype(int).tolist()
        if sampling == "qwen-vl":
            count = min(max(total / source_fps * fps, QWEN_VL_MIN_FRAMES), (min(QWEN_VL_MAX_FRAMES, total) // 2) * 2)
            count = min(round(count / 2) * 2, total)  # round_by_factor(nframes, FRAME_FACTOR=2)
            if count < 2:  # a one-frame clip: Qwen-VL refuses it, a reward can still look at the frame
                return list(range(total))
            return np.linspace(0, total - 1, count).round().astype(int).tolist()
        step = source_fps / fps
        return sorted({min(total - 1, int(round(i * step))) for i in range(int(total / step + 1e-9) or 1)})
    if num_frames is None or sampling == "all":
        return list(range(total))
    if num_frames < 1:
        raise RewardInputError(f"num_frames must be >= 1, got {num_frames}")
    if sampling == "uniform":
        return np.linspace(0, total - 1, num_frames).round().astype(int).tolist()
    if sampling == "center":
        seg = total / num_frames
        return [min(total - 1, int(seg * i + seg / 2)) for i in range(num_frames)]
    raise RewardInputError(f"sampling must be 'uniform', 'center' or 'all', got {sampling!r}")


def uniform_clip_indices(total: int, num_frames: int) -> torch.Tensor:
    """Uniform indices round(linspace(0, T-1, n)) in torch's float32 linspace; all frames when n >= T.

    The rule of the count-sampling video rewards (video-frames, temporal-consistency, motion, VideoAlign's
    `num_frames`); `Reward.video_load_options` hands it to `read_video` so that a file decodes only these."""
    if num_frames >= total:
        return torch.arange(total)
    return torch.linspace(0, total - 1, num_frames).round().long()


def _check_video_header(header: video_decode.VideoHeader, what: str, limits: dict[str, Any]) -> None:
    """Refuse a clip from what its header declares, before a decoder allocates anything per frame."""
    max_frames, max_seconds = limits["max_video_frames"], limits["max_video_seconds"]
    if max_frames is not None and header.frames is not None and header.frames > max_frames:
        raise video_decode.LimitExceeded(
            f"{what}: the header declares {header.frames} frames, above max_video_frames={max_frames}; "
            "a corrupt or hostile file, or pass a larger max_video_frames"
        )
    if max_seconds is not None and header.seconds is not None and header.seconds > max_seconds:
        raise video_decode.LimitExceeded(
            f"{what}: the header declares {header.seconds:.0f} s, above max_video_seconds={max_seconds:g}; "
            "a corrupt or hostile file, or pass a larger max_video_seconds"
        )
    if max_frames is not None and header.frames is None and header.seconds and header.rate:
        implied = header.seconds * header.rate  # what a decoder estimates when no count is stored
        if implied > max_frames:
            raise video_decode.LimitExceeded(
                f"{what}: the header declares {header.seconds:.0f} s at {header.rate:g} fps = {implied:.0f} frames, "
                f"above max_video_frames={max_frames}; pass a larger max_video_frames"
            )
    if header.width < 1 or header.height < 1:
        raise MediaError(f"{what}: the header declares {header.width}x{header.height} frames (the file is corrupt)")
    _check_image_size((header.width, header.height), limits["max_image_pixels"], what,
                      limits["max_image_side"], limits["max_aspect_ratio"])


def _check_decoded_size(n: int, header: video_decode.VideoHeader, max_decoded_pixels: int | None, what: str) -> None:
    if max_decoded_pixels is not None and n * header.width * header.height > max_decoded_pixels:
        raise video_decode.LimitExceeded(
            f"{what}: {n} sampled frames of {header.width}x{header.height} are "
            f"{n * header.width * header.height} pixels, above max_decoded_pixels={max_decoded_pixels}; "
            "sample fewer frames (num_frames or fps), or pass a larger max_decoded_pixels"
        )


def read_video(
    path: str | os.PathLike,
    num_frames: int | None = None,
    *,
    fps: float | None = None,
    sampling: Literal["uniform", "center", "all"] = "uniform",
    max_pixels: int | None = None,
    backend: Literal["auto", "av", "decord"] = "auto",
    frame_indices: Callable[[int, float | None], list[int]] | None = None,
    max_video_frames: int | None = MAX_VIDEO_FRAMES,
    max_video_seconds: float | None = MAX_VIDEO_SECONDS,
    max_decoded_pixels: int | None = MAX_DECODED_PIXELS,
    max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    max_image_side: int | None = MAX_IMAGE_SIDE,
    max_aspect_ratio: float | None = MAX_ASPECT_RATIO,
) -> torch.Tensor:
    """Decode a video file to (T, 3, H, W) float in [0, 1], upright, keeping only the sampled frames.

    The header is probed with PyAV first (see `mmreward.video_decode`) and checked against the limits:
    declared frames (`max_video_frames`), duration (`max_video_seconds`), frame size (the image caps), and the
    sampled frames' total pixels (`max_decoded_pixels`); None turns a limit off. `frame_indices(total, rate)`
    replaces num_frames/fps/sampling (a reward's own sampling rule). `max_pixels` downscales after decoding.
    """
    p = Path(path)
    _check_exists(p, "video")
    backends = available_video_backends()
    if backend == "auto":
        if not backends:
            raise MediaError("no video decoder installed; install one with: pip install 'mmreward[video]'")
        # decord is faster for seeking but cannot read GIFs; PyAV reads everything FFmpeg reads.
        order = [b for b in (("av", "decord") if p.suffix.lower() == ".gif" else ("decord", "av")) if b in backends]
    elif backend not in backends:
        raise MediaError(f"video backend '{backend}' is not installed (installed: {backends or 'none'})")
    else:
        order = [backend]
    if "av" not in backends:  # the probe that makes decord safe is PyAV's
        raise MediaError("reading video files needs PyAV to check their headers first: pip install av")
    limits = {"max_video_frames": max_video_frames, "max_video_seconds": max_video_seconds,
              "max_image_pixels": max_image_pixels, "max_image_side": max_image_side,
              "max_aspect_ratio": max_aspect_ratio}
    header = video_decode.probe(p)
    _check_video_header(header, str(p), limits)

    def indices(total: int, rate: float | None) -> list[int]:
        if total <= 0:
            raise MediaError(f"{p}: video has no frames")
        if frame_indices is not None:
            wanted = [int(i) for i in frame_indices(total, rate)]
        else:
            wanted = sample_frame_indices(total, num_frames, fps=fps, source_fps=rate, sampling=sampling)
        _check_decoded_size(len(wanted), header, max_decoded_pixels, str(p))
        return wanted

    errors = []
    for name in order:
        try:
            if name == "decord":
                frames = video_decode.decode_decord(p, header, max_video_frames, indices)
            else:
                total = header.frames or video_decode.count_packets(p, max_video_frames)
                if max_video_frames is not None and total > max_video_frames:
                    raise video_decode.LimitExceeded(f"{p}: the file holds more than max_video_frames={max_video_frames} frames")
                frames = video_decode.decode_av(p, total, header.rate, indices)
            break
        except (MediaError, RewardInputError) as exc:
            if isinstance(exc, RewardInputError):
                raise
            if isinstance(exc, video_decode.LimitExceeded):  # a limit holds for every decoder
                raise
            errors.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - decoders raise their own zoo of exception types
            errors.append(f"cannot decode video {p} with {name}: {exc}")
    else:
        raise MediaError("; ".join(errors))
    video = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255.0
    return cap_pixels(video, max_pixels) if max_pixels else video


def cap_pixels(x: torch.Tensor, max_pixels: int) -> torch.Tensor:
    """Downscale (..., 3, H, W) so that H * W <= max_pixels, keeping the aspect ratio (bilinear, antialiased)."""
    h, w = x.shape[-2:]
    if h * w <= max_pixels:
        return x
    scale = (max_pixels / (h * w)) ** 0.5
    nh, nw = max(1, int(h * scale)), max(1, int(w * scale))
    flat = x.reshape(-1, *x.shape[-3:])
    out = torch.nn.functional.interpolate(flat, size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)
    return out.reshape(*x.shape[:-2], nh, nw).clamp(0, 1)


def load_video(item: Any, value_range: ValueRange | None = None, **video_options: Any) -> torch.Tensor:
    """One video from a path, a (T, C, H, W) tensor, a THWC numpy array or a list of frames -> (T, 3, H, W)."""
    value_range = check_value_range(value_range)
    source_fps = video_options.pop("source_fps", None)  # a file knows its own rate
    if isinstance(item, (str, os.PathLike)):
        return read_video(item, **video_options)
    # file-only options (`frame_indices`, header limits) mean nothing to a clip already in memory
    video_options.pop("frame_indices", None)
    if isinstance(item, np.ndarray):
        if item.ndim != 4:
            raise MediaError(f"video: numpy videos must be THWC, got shape {item.shape}")
        t = _numpy_to_tensor(item, value_range, "drop", "video")
    elif isinstance(item, torch.Tensor):
        if item.ndim != 4:
            raise MediaError(f"video: tensor videos must be (T, C, H, W), got shape {tuple(item.shape)}")
        t = _tensor_to_unit(item, value_range, "drop", "video")
    elif isinstance(item, Sequence) and item:
        t = torch.stack([load_image(f, value_range) for f in item])
    else:
        raise MediaError(f"video: expected a path, tensor, numpy array or list of frames, got {type(item).__name__}")
    _check_not_empty(t, "video", video=True)
    return _sample_in_memory(t, 0, source_fps, **video_options)


def _sample_in_memory(t: torch.Tensor, axis: int, source_fps: float | None = None, *, num_frames: int | None = None,
                      fps: float | None = None, sampling: str = "uniform", **_: Any) -> torch.Tensor:
    """The frames a clip held in memory keeps: by count, or by time when its own rate is known (an
    in-memory clip without one keeps every frame: nothing says how long it lasts)."""
    if fps is not None and source_fps is None:
        return t
    if fps is None and num_frames is None:
        return t
    idx = sample_frame_indices(t.shape[axis], num_frames, fps=fps, source_fps=source_fps, sampling=sampling)
    return t.index_select(axis, torch.tensor(idx, device=t.device))


# ----------------------------------------------------------------------------------------------
# batches
# ----------------------------------------------------------------------------------------------
def _is_video_path(item: Any) -> bool:
    return isinstance(item, (str, os.PathLike)) and Path(item).suffix.lower() in VIDEO_SUFFIXES


def stack_if_same_size(items: list[torch.Tensor]) -> MediaBatch:
    if items and all(t.shape == items[0].shape for t in items):
        return torch.stack(items)
    return items


def to_batch(
    media: Any,
    modality: Literal["image", "video", "auto"] = "image",
    value_range: ValueRange | None = None,
    device: torch.device | str | None = None,
    alpha: Alpha = "drop",
    max_image_pixels: int | None = MAX_IMAGE_PIXELS,
    max_image_side: int | None = MAX_IMAGE_SIDE,
    max_aspect_ratio: float | None = MAX_ASPECT_RATIO,
    **video_options: Any,
) -> MediaBatch:
    """Any accepted media -> a batch in the tensor convention (see module docstring).

    A single tensor is a batch when it has a batch axis: BCHW for images, BTCHW for videos; a CHW
    tensor is one image. Lists may mix paths, PIL images, arrays and tensors. Image files, PIL images
    and video frames above the size caps are rejected from their headers (see `read_image`, `read_video`,
    which also lists the video limits); `max_pixels` downscales videos. An item that cannot be read, for
    whatever reason, is a MediaError naming its index.
    """
    value_range = check_value_range(value_range)
    _check_max_image_pixels(max_image_pixels)
    _check_size_options(max_image_side, max_aspect_ratio)
    caps = {"max_image_pixels": max_image_pixels, "max_image_side": max_image_side, "max_aspect_ratio": max_aspect_ratio}
    if device is not None:
        from mmreward.devices import check_device

        device = check_device(device)
    if isinstance(media, torch.Tensor):
        if modality == "auto":
            modality = "video" if media.ndim == 5 else "image"
        if modality == "image" and media.ndim == 3:
            media = media[None]
        want = 4 if modality == "image" else 5
        if media.ndim != want:
            layout = "(B, C, H, W)" if modality == "image" else "(B, T, C, H, W)"
            raise MediaError(
                f"media: {modality} batches as one tensor must have shape {layout}, got {tuple(media.shape)}"
            )
        out: MediaBatch = _check_not_empty(_tensor_to_unit(media, value_range, alpha, "media"), "media",
                                           video=modality == "video")
        if modality == "video":
            out = _sample_in_memory(out, 1, **video_options)
    elif isinstance(media, np.ndarray) and media.ndim == 4 and modality == "image":
        out = _check_not_empty(_numpy_to_tensor(media, value_range, alpha, "media"), "media")
    else:
        if isinstance(media, (str, os.PathLike)) or not isinstance(media, Sequence):
            media = [media]
        items: list[torch.Tensor] = []
        for i, item in enumerate(media):
            kind = modality
            if kind == "auto":
                kind = "video" if _is_video_path(item) or getattr(item, "ndim", 0) == 4 else "image"
            try:
                if kind == "video":
                    items.append(load_video(item, value_range, **caps, **video_options))
                elif _is_video_path(item) and Path(item).suffix.lower() != ".gif":  # a GIF is also an image
                    raise MediaError(
                        f"{item} is a video, and this reward scores images only; score videos frame by frame "
                        "with mmreward.load('video-frames', image_reward='<this reward>', num_frames=8)"
                    )
                else:
                    items.append(load_image(item, value_range, alpha, **caps))
            except MediaError as exc:
                raise MediaError(f"media[{i}]: {exc}") from exc
            except (RewardInputError, MissingExtraError):  # usage errors: not the item's fault
                raise
            except Exception as exc:  # noqa: BLE001 - whatever a decoder or a bad file raises is the item's failure
                raise MediaError(f"media[{i}]: cannot read {item!s:.200}: {type(exc).__name__}: {exc}") from exc
        out = stack_if_same_size(items)
    if device is not None:
        out = out.to(device) if isinstance(out, torch.Tensor) else [t.to(device) for t in out]
    return out


def requires_grad(batch: MediaBatch) -> bool:
    if isinstance(batch, torch.Tensor):
        return batch.requires_grad
    return any(t.requires_grad for t in batch)


def concat_batches(a: MediaBatch, b: MediaBatch) -> MediaBatch:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape[1:] == b.shape[1:]:
        return torch.cat([a, b])
    return list(a) + list(b)


def iter_media_files(paths: Sequence[str | os.PathLike], recursive: bool = True):
    """Yield media files from files and folders lazily (sorted within each folder), for constant memory."""
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            pattern = "**/*" if recursive else "*"
            for f in sorted(p.glob(pattern)):
                # a dangling or looping link is yielded so that it fails as an item instead of vanishing
                broken_link = f.is_symlink() and not f.exists()
                if (f.is_file() or broken_link) and f.suffix.lower() in IMAGE_SUFFIXES | VIDEO_SUFFIXES:
                    yield f
        else:
            yield p
