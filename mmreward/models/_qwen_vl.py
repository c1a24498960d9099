"""Shared plumbing for rewards built on transformers image-text-to-text VLMs (Qwen2-VL family first).

- loading a VLM and its processor from a local folder or hub id, cache-first and offline-safe;
- Qwen's `smart_resize` (sides multiples of 28, pixel count within [min_pixels, max_pixels]);
- turning our media tensors plus chat messages into one padded processor batch;
- the legacy (transformers 4.x) <-> current key layouts of Qwen2-VL state dicts, because the official
  reward checkpoints (HPSv3, VideoReward) were saved with the 4.x names.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

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


def resize_for_qwen(x: torch.Tensor, min_pixels: int, max_pixels: int) -> torch.Tensor:
    """Bicubic antialiased resize of (..., 3, H, W) in [0, 1] to Qwen's smart size, clamped to [0, 1]."""
    h, w = x.shape[-2:]
    th, tw = smart_resize(h, w, min_pixels, max_pixels)
    if (th, tw) == (h, w):
        return x
    flat = x.reshape(-1, *x.shape[-3:]).float()
    out = torch.nn.functional.interpolate(flat, size=(th, tw), mode="bicubic", antialias=True, align_corners=False)
    return out.clamp(0, 1).reshape(*x.shape[:-2], th, tw)


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
):
    """One padded processor batch: item i is a user turn with its media, then `texts[i]`.

    `media`: (B, 3, H, W) images or (B, T, 3, H, W) videos (or a list of per-item tensors); with
    `media_per_item` > 1 the items are groups of consecutive media (pairwise judges). `suffixes[i]`
    is appended after the rendered prompt (teacher forcing of an answer). `media_labels[k]`, when given,
    is a text placed right before the k-th medium of every item (e.g. '<img1>: ', PaCo-Reward's layout).
    """
    items = list(media) if media is not None else []
    n = len(texts)
    if media is not None and len(items) != n * media_per_item:
        raise RewardInputError(f"media: expected {n * media_per_item} items for {n} prompts, got {len(items)}")
    resized = [resize_for_qwen(m, min_pixels, max_pixels) for m in items]
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
        kwargs["images_kwargs"] = {"do_rescale": False, "do_resize": False}
    elif kind == "video" and floats:
        kwargs["videos"] = floats
        kwargs["videos_kwargs"] = {"do_rescale": False, "do_resize": False, "do_sample_frames": False}
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
