"""Shared plumbing for rewards built on transformers image-text-to-text VLMs (Qwen2-VL family first).

- loading a VLM and its processor from a local folder or hub id, cache-first and offline-safe;
- Qwen's `smart_resize` (sides multiples of 28, pixel count within [min_pixels, max_pixels]);
- turning our media tensors plus chat messages into one padded processor batch, resized the way each
  original resizes (Pillow's 8-bit bicubic, torchvision's bicubic on uint8 tensors, or a float bicubic that
  keeps gradients);
- the plain sequential positions the reward-head originals (HPSv3, VideoReward, EditReward) run their
  language model with, instead of Qwen's 3-D M-RoPE positions;
- the legacy (transformers 4.x) <-> current key layouts of Qwen2-VL state dicts, because the official
  reward checkpoints (HPSv3, VideoReward) were saved with the 4.x names.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Literal

import torch

from mmreward.checkpoints import HUB_PREFIX, LOCAL_PREFIX, hub_is_offline
from mmreward.errors import CheckpointError, RewardInputError

IMAGE_FACTOR = 28


def smart_resize(height: int, width: int, min_pixels: int, max_pixels: int, factor: int = IMAGE_FACTOR) -> tuple[int, int]:
    """Qwen2-VL's target size: sides rounded to multiples of `factor`, area kept within the bounds."""
    if max(height, width) / min(height, width) > 200:
        raise RewardInputError(f"media: aspect ratio must be below 200 for Qwen2-VL, got {height}x{width}")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


ResizeMethod = Literal["float", "pillow", "torchvision"]
_PIL_PRECISION_BITS = 32 - 8 - 2  # Pillow's fixed-point coefficients for 8-bit images (libImaging/Resample.c)


def _pil_bicubic(x: float) -> float:
    """Pillow's bicubic kernel (a = -0.5)."""
    x = abs(x)
    if x < 1.0:
        return (1.5 * x - 2.5) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * -0.5
    return 0.0


@lru_cache(maxsize=64)
def _pil_weights(in_size: int, out_size: int) -> torch.Tensor:
    """(out, in) integer weights of Pillow's 8-bit bicubic resample along one axis (precompute_coeffs and
    normalize_coeffs_8bpc): the antialiasing support widens with the downscale factor, each row is normalised
    in double precision, then rounded to 22-bit fixed point."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    inv_filterscale = 1.0 / filterscale
    out = torch.zeros(out_size, in_size, dtype=torch.float64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)  # int() truncates toward zero, as C's cast does
        xmax = min(int(center + support + 0.5), in_size)
        # Pillow multiplies by the reciprocal (not divides): the taps can differ in the last bit, which moves a
        # 22-bit coefficient by one now and then
        taps = [_pil_bicubic((x + xmin - center + 0.5) * inv_filterscale) for x in range(xmax - xmin)]
        total = sum(taps)
        for i, tap in enumerate(taps):
            k = tap / total if total != 0.0 else tap
            out[xx, xmin + i] = int(k * (1 << _PIL_PRECISION_BITS) + (0.5 if k >= 0 else -0.5))
    return out


def pillow_vertical_first(in_hw: tuple[int, int], out_hw: tuple[int, int]) -> bool:
    """Whether Pillow 13 resamples the vertical axis first (libImaging/Resample.c `ImagingResampleInner`): when the
    height shrinks, by more than twice as many rows as the width loses columns. Pillow < 13 always goes horizontal
    first (python-pillow/Pillow@3cab8da1f3d546bd874b756589686c1cd66f0fe5 introduced the rule)."""
    dh, dw = in_hw[0] - out_hw[0], in_hw[1] - out_hw[1]
    return dh > 0 and dh > 2 * dw


def pillow_bicubic(x255: torch.Tensor, height: int, width: int, *, legacy_order: bool = False) -> torch.Tensor:
    """Pillow's `Image.resize((width, height), BICUBIC)` on 8-bit values, batched: (..., H, W) floats holding
    integers 0..255 -> the same integers Pillow returns (per channel, so RGB and grayscale "L" alike; Pillow
    premultiplies the alpha of RGBA images, which this does not).

    Pillow resamples one axis, rounds and clips to 8 bits, then the other. Which axis goes first matters for the
    result (by up to ~15 levels): Pillow 13 takes the vertical pass first when the height shrinks much more than
    the width (`pillow_vertical_first`); `legacy_order=True` keeps Pillow < 13's horizontal-first order. The sums
    are integers below 2**53, so float64 matrix products are exact (on any device), and the result equals
    Pillow's bit for bit."""
    h, w = x255.shape[-2:]
    y = x255.to(torch.float64)
    half, one = float(1 << (_PIL_PRECISION_BITS - 1)), float(1 << _PIL_PRECISION_BITS)

    def horizontal(y: torch.Tensor) -> torch.Tensor:
        if width == w:
            return y
        return torch.floor((y @ _pil_weights(w, width).T.to(y.device) + half) / one).clamp(0, 255)

    def vertical(y: torch.Tensor) -> torch.Tensor:
        if height == h:
            return y
        return torch.floor((_pil_weights(h, height).to(y.device) @ y + half) / one).clamp(0, 255)

    if not legacy_order and pillow_vertical_first((h, w), (height, width)):
        y = horizontal(vertical(y))
    else:
        y = vertical(horizontal(y))
    return y.to(torch.float32)


def torchvision_bicubic_uint8(x255: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """torchvision's v1 `transforms.functional.resize(uint8 tensor, BICUBIC, antialias=True)`: a float32
    antialiased bicubic on the 0..255 values, clamped, rounded back to integers (qwen_vl_utils' and VideoAlign's
    video path; also v2 on GPU tensors). v2 on CPU uint8 tensors runs torch's native uint8 kernel instead, up to
    ~25 levels away on noise: that is `torch_native_bicubic_uint8`."""
    flat = x255.reshape(-1, *x255.shape[-3:]).float()
    out = torch.nn.functional.interpolate(flat, size=(height, width), mode="bicubic", antialias=True,
                                          align_corners=False)
    return out.clamp(0, 255).round().reshape(*x255.shape[:-2], height, width)


def _torch_aa_bicubic(x: float) -> float:
    """ATen's antialiased bicubic filter (a = -0.5; UpSample.h cubic_convolution1/2, whose second branch is
    evaluated in another order than Pillow's, so the last bit can differ)."""
    a = -0.5
    x = abs(x)
    if x < 1.0:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2.0:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return 0.0


@lru_cache(maxsize=64)
def _torch_uint8_weights(in_size: int, out_size: int) -> tuple[torch.Tensor, int]:
    """(out, in) int16 weights and their precision for ATen's uint8 antialiased bicubic along one axis
    (UpSampleKernel.cpp `_compute_indices_min_size_weights_aa` + `_compute_index_ranges_int16_weights`): rows
    normalised in double, then scaled by the largest power of two that keeps the largest weight within int16."""
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1.0 else 2.0
    max_taps = math.ceil(support) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    rows, wt_max = [], 0.0
    for i in range(out_size):
        center = scale * (i + 0.5)
        xmin = max(int(center - support + 0.5), 0)
        xsize = min(max(min(int(center + support + 0.5), in_size) - xmin, 0), max_taps)
        taps = [_torch_aa_bicubic((j + xmin - center + 0.5) * invscale) for j in range(xsize)]
        total = sum(taps)
        if total != 0.0:
            taps = [t / total for t in taps]
            wt_max = max([wt_max, *taps])
        rows.append((xmin, taps))
    precision = 0
    while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    out = torch.zeros(out_size, in_size, dtype=torch.float64)
    for i, (xmin, taps) in enumerate(rows):
        for j, t in enumerate(taps):
            v = t * (1 << precision)
            out[i, xmin + j] = int(v - 0.5) if v < 0 else int(v + 0.5)
    return out, precision


def torch_native_bicubic_uint8(x255: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """torch's native uint8 antialiased bicubic, which `torchvision.transforms.v2.functional.resize` runs on CPU
    uint8 tensors (and so transformers' torchvision-backed fast processors), batched: (..., H, W) floats holding
    0..255 -> the same integers. Unlike `torchvision_bicubic_uint8` (v1's float path), it works in int16 fixed
    point: horizontal pass, then vertical, each rounded and clipped to 8 bits. Exact in float64 on any device."""
    h, w = x255.shape[-2:]
    y = x255.to(torch.float64)
    if width != w:
        m, p = _torch_uint8_weights(w, width)
        y = torch.floor((y @ m.T.to(y.device) + float(1 << (p - 1))) / float(1 << p)).clamp(0, 255)
    if height != h:
        m, p = _torch_uint8_weights(h, height)
        y = torch.floor((m.to(y.device) @ y + float(1 << (p - 1))) / float(1 << p)).clamp(0, 255)
    return y.to(torch.float32)


def to_uint8_values(x: torch.Tensor) -> torch.Tensor:
    """[0, 1] floats -> the 8-bit values 0..255 (as floats) the originals' PIL images or uint8 tensors hold."""
    return (x.float().clamp(0, 1) * 255).round()


def qwen_vl_to_rgb(image: torch.Tensor) -> torch.Tensor:
    """qwen_vl_utils (0.0.9-0.0.14) `to_rgb` on a (C, H, W) [0, 1] image from `prepare` with alpha "keep_rgba":
    a 4-channel image (PIL mode "RGBA") is pasted on white, `Image.new("RGB", size, white).paste(image,
    mask=alpha)`, in Pillow's 8-bit arithmetic (libImaging Paste.c BLEND: DIV255(in * a + 255 * (255 - a)) rounds
    exactly), returning (3, H, W) [0, 1] holding the same 8-bit values; a 3-channel image is returned as is."""
    if image.shape[0] != 4:
        return image
    x = to_uint8_values(image).to(torch.int64)
    rgb, a = x[:3], x[3:]
    v = rgb * a + 255 * (255 - a) + 128
    return (((v >> 8) + v) >> 8).to(torch.float32) / 255


def resize_for_qwen(x: torch.Tensor, min_pixels: int, max_pixels: int, method: ResizeMethod = "float") -> torch.Tensor:
    """(..., 3, H, W) to Qwen's smart size.

    "float": antialiased bicubic on [0, 1] floats, clamped to [0, 1] (differentiable).
    "pillow" / "torchvision": the originals' 8-bit resizes (`pillow_bicubic`, `torchvision_bicubic_uint8`) on the
    image's 8-bit values; these return 0..255 values (for the processor to rescale, as the originals do) and are
    not differentiable, so media that require grad take the "float" path (a documented deviation)."""
    h, w = x.shape[-2:]
    th, tw = smart_resize(h, w, min_pixels, max_pixels)
    if method == "float" or x.requires_grad:
        if (th, tw) == (h, w):
            return x
        flat = x.reshape(-1, *x.shape[-3:]).float()
        out = torch.nn.functional.interpolate(flat, size=(th, tw), mode="bicubic", antialias=True, align_corners=False)
        return out.clamp(0, 1).reshape(*x.shape[:-2], th, tw)
    if method not in ("pillow", "torchvision"):
        raise RewardInputError(f"resize method must be 'float', 'pillow' or 'torchvision', got {method!r}")
    x255 = to_uint8_values(x)
    if (th, tw) == (h, w):  # both originals skip the resample at the target size
        return x255
    if method == "pillow":
        return pillow_bicubic(x255, th, tw)
    return torchvision_bicubic_uint8(x255, th, tw)


def local_or_hub(checkpoint: str | os.PathLike) -> tuple[str, bool]:
    """(path or repo id, is_local) for transformers' from_pretrained."""
    ckpt = os.fspath(checkpoint)
    if ckpt.startswith(LOCAL_PREFIX):
        return ckpt[len(LOCAL_PREFIX):], True
    if ckpt.startswith(HUB_PREFIX):
        ckpt = ckpt[len(HUB_PREFIX):].partition("@")[0]
    if Path(os.path.expanduser(ckpt)).exists():
        return os.path.expanduser(ckpt), True
    return ckpt, False


def load_processor(source: str, padding_side: str = "right"):
    from transformers import AutoProcessor

    path, local = local_or_hub(source)
    try:
        proc = AutoProcessor.from_pretrained(path, local_files_only=local or hub_is_offline())
    except Exception as exc:  # noqa: BLE001 - hub/network errors come in many types
        raise CheckpointError(
            f"cannot load the processor/tokenizer of '{source}': {exc}. Pass a local folder holding the "
            "official processor files (tokenizer.json, preprocessor_config.json, chat template)."
        ) from exc
    proc.tokenizer.padding_side = padding_side
    return proc


def load_config(source: str):
    from transformers import AutoConfig

    path, local = local_or_hub(source)
    try:
        return AutoConfig.from_pretrained(path, local_files_only=local or hub_is_offline())
    except Exception as exc:  # noqa: BLE001 - hub/network errors come in many types
        raise CheckpointError(f"cannot load the model config of '{source}': {exc}") from exc


def load_vlm(source: str, dtype: torch.dtype = torch.float32):
    """AutoModelForImageTextToText.from_pretrained with offline-safe errors."""
    from transformers import AutoModelForImageTextToText

    from mmreward.checkpoints import load_pretrained

    path, local = local_or_hub(source)
    try:
        model = load_pretrained(
            AutoModelForImageTextToText, path, local_files_only=local or hub_is_offline(), dtype=dtype
        )
    except CheckpointError as exc:
        if local:
            raise
        raise CheckpointError(f"{exc} Download it on a connected machine (`hf download {path}`).") from exc
    except Exception as exc:  # noqa: BLE001 - hub/network errors come in many types
        raise CheckpointError(
            f"cannot load the VLM '{source}': {exc}. Download it on a connected machine "
            f"(`hf download {path}`) or pass a local folder in the Hugging Face layout."
        ) from exc
    return model.eval()


def vlm_from_config(config, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    return model.eval()


# ----------------------------------------------------------------------------------------------
# state-dict layouts
# ----------------------------------------------------------------------------------------------
_LEGACY_RULES = [
    (re.compile(r"^visual\."), "model.visual."),
    (re.compile(r"^model\.(?!language_model\.|visual\.)"), "model.language_model."),
]


def legacy_to_current_keys(sd: Mapping[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """Rename transformers-4.x Qwen2-VL keys (model.layers.*, visual.*) to the current layout.

    `prefix` is stripped first (e.g. 'base_model.model.' of a PEFT-wrapped model); keys already in the
    current layout are kept as they are.
    """
    out = {}
    for key, value in sd.items():
        k = key[len(prefix):] if prefix and key.startswith(prefix) else key
        for pattern, repl in _LEGACY_RULES:
            if pattern.search(k):
                k = pattern.sub(repl, k, count=1)
                break
        out[k] = value
    return out


# ----------------------------------------------------------------------------------------------
# batching media through the processor
# ----------------------------------------------------------------------------------------------
def even_frames(video: torch.Tensor, temporal_patch: int = 2) -> torch.Tensor:
    """Repeat the last frame so the frame count is a multiple of the temporal patch (as Qwen pads)."""
    t = video.shape[0]
    pad = (-t) % temporal_patch
    if pad:
        video = torch.cat([video, video[-1:].expand(pad, *video.shape[1:])])
    return video


def build_batch(
    processor,
    texts: Sequence[str],
    media: torch.Tensor | list[torch.Tensor] | None,
    *,
    kind: str,
    min_pixels: int,
    max_pixels: int,
    system: str | None = None,
    add_generation_prompt: bool = True,
    suffixes: Sequence[str] | None = None,
    media_per_item: int = 1,
    media_labels: Sequence[str] | None = None,
    resize: ResizeMethod = "float",
):
    """One padded processor batch: item i is a user turn with its media, then `texts[i]`.

    `media`: (B, 3, H, W) images or (B, T, 3, H, W) videos (or a list of per-item tensors); with
    `media_per_item` > 1 the items are groups of consecutive media (pairwise judges). `suffixes[i]`
    is appended after the rendered prompt (teacher forcing of an answer). `media_labels[k]`, when given,
    is a text placed right before the k-th medium of every item (e.g. '<img1>: ', PaCo-Reward's layout).
    `resize`: how media reach Qwen's smart size (see `resize_for_qwen`).
    """
    items = list(media) if media is not None else []
    n = len(texts)
    if media is not None and len(items) != n * media_per_item:
        raise RewardInputError(f"media: expected {n * media_per_item} items for {n} prompts, got {len(items)}")
    if any(m.requires_grad for m in items):
        resize = "float"  # the differentiable path: the 8-bit resizes have no gradient
    resized = [resize_for_qwen(m, min_pixels, max_pixels, resize) for m in items]
    # 8-bit methods hand the processor 0..255 values and let it rescale, as the originals' processors do
    rescale = resize != "float"
    if kind == "video":
        resized = [even_frames(v) for v in resized]
    conversations = []
    n_media = media_per_item if media is not None else 0
    if media_labels is not None and len(media_labels) != n_media:
        raise RewardInputError(f"media_labels: expected {n_media} labels (one per medium), got {len(media_labels)}")
    for text in texts:
        content = []
        for k in range(n_media):
            if media_labels is not None:
                content.append({"type": "text", "text": media_labels[k]})
            content.append({"type": kind})
        content.append({"type": "text", "text": text})
        conv = [{"role": "user", "content": content}]
        if system is not None:
            conv.insert(0, {"role": "system", "content": [{"type": "text", "text": system}]})
        conversations.append(conv)
    rendered = processor.apply_chat_template(conversations, tokenize=False, add_generation_prompt=add_generation_prompt)
    if suffixes is not None:
        rendered = [r + s for r, s in zip(rendered, suffixes)]
    kwargs: dict = {"text": rendered, "padding": True, "return_tensors": "pt"}
    floats = [m.float() for m in resized]
    if kind == "image" and floats:
        kwargs["images"] = floats
        kwargs["images_kwargs"] = {"do_rescale": rescale, "do_resize": False}
    elif kind == "video" and floats:
        kwargs["videos"] = floats
        kwargs["videos_kwargs"] = {"do_rescale": rescale, "do_resize": False, "do_sample_frames": False}
    return processor(**kwargs)


def model_inputs(batch, device: torch.device, dtype: torch.dtype) -> dict:
    out = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor):
            v = v.to(device)
            if v.is_floating_point():
                v = v.to(dtype)
        out[k] = v
    return out


def sequential_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """(3, B, L) plain positions 0, 1, 2, ... over each item's tokens, the same in all three M-RoPE rows.

    HPSv3, VideoReward and EditReward embed the tokens, scatter the visual features and call the decoder with
    `input_ids=None, position_ids=None`: every token, visual ones included, gets its index as position (4.45's
    text model counts with arange; 4.57's `get_rope_index` without input_ids counts the attention mask). Passing
    these explicitly keeps the model from switching on Qwen's 3-D M-RoPE positions, which the heads were not
    trained with. Counting the mask makes left and right padding agree."""
    pos = attention_mask.long().cumsum(-1) - 1
    pos = pos.clamp(min=0)
    return pos.unsqueeze(0).expand(3, -1, -1)
