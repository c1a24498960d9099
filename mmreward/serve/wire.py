"""What travels: typed errors and their HTTP status, the tensor wire format, bounded bodies, per-request
validation, and the flow_grpo / verl-omni scorer fields over JSON."""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mmreward.errors import MMRewardError, RewardInputError, RewardValueError
from mmreward.types import PairwiseOutput, Reward, RewardOutput, normalize_prompts

_DTYPES = {"float32": np.float32, "float16": np.float16, "uint8": np.uint8}
_MAX_NDIM = 5  # [B, T, 3, H, W]


# ----------------------------------------------------------------------------------------------
# errors and their HTTP status
# ----------------------------------------------------------------------------------------------
class BadRequestError(RewardInputError):
    """A request body the server cannot read: not JSON, not a JSON object, unknown or missing keys."""


class RequestTooLargeError(RewardInputError):
    """A request above `max_request_bytes` or `max_request_items` (HTTP 413)."""


def error_status(exc: BaseException) -> int:
    """The HTTP status for an error raised while serving one request.

    Typed input and value errors are the client's (4xx); anything else is the server's (500). Either way
    only the request that caused it receives it.
    """
    if isinstance(exc, RequestTooLargeError):
        return 413
    if isinstance(exc, RewardValueError):
        return 422  # well-formed media on which the reward produced NaN/inf
    if isinstance(exc, MMRewardError) and isinstance(exc, ValueError):
        return 400
    return 500


def error_message(exc: BaseException) -> str:
    if error_status(exc) == 500:
        # An untyped exception's text may carry paths or internals; the traceback goes to the server log.
        return f"internal error while serving this request ({type(exc).__name__}); see the server log"
    return f"{type(exc).__name__}: {exc}"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------------
# wire format
# ----------------------------------------------------------------------------------------------
def encode_tensor(x: torch.Tensor) -> dict:
    arr = x.detach().to(torch.float32).cpu().contiguous().numpy()
    return {"dtype": "float32", "shape": list(arr.shape), "data": base64.b64encode(arr.astype("<f4").tobytes()).decode("ascii")}


def decode_tensor(obj: Any, what: str) -> torch.Tensor:
    """{"dtype", "shape", "data"} -> tensor; every malformed field is a RewardInputError naming it."""
    if not isinstance(obj, dict) or not {"dtype", "shape", "data"} <= set(obj):
        got = f"an object with keys {sorted(obj)[:6]}" if isinstance(obj, dict) else type(obj).__name__
        raise RewardInputError(f"{what}: expected an object {{'dtype', 'shape', 'data'}} (see encode_tensor), got {got}")
    dtype, shape, data = obj["dtype"], obj["shape"], obj["data"]
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise RewardInputError(f"{what}: dtype must be one of {sorted(_DTYPES)}, got {_short(dtype)}")
    if (not isinstance(shape, list) or not 1 <= len(shape) <= _MAX_NDIM
            or not all(type(s) is int and s >= 0 for s in shape)):
        raise RewardInputError(f"{what}: shape must be a list of 1 to {_MAX_NDIM} non-negative integers, "
                               f"got {_short(shape)}")
    if not isinstance(data, str):
        raise RewardInputError(f"{what}: data must be a base64 string, got {type(data).__name__}")
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError as exc:  # binascii.Error, or non-ASCII characters
        raise RewardInputError(f"{what}: data is not valid base64 ({exc})") from None
    wire = np.dtype(_DTYPES[dtype]).newbyteorder("<")
    expected = math.prod(shape) * wire.itemsize
    if len(raw) != expected:
        raise RewardInputError(f"{what}: {len(raw)} bytes of data do not fill shape {shape} of {dtype} "
                               f"({expected} bytes)")
    arr = np.frombuffer(raw, dtype=wire).reshape(shape).astype(_DTYPES[dtype])  # native order, writable copy
    return torch.from_numpy(arr)


def _output_json(out: RewardOutput | PairwiseOutput) -> dict:
    def lst(t):
        return [None if not np.isfinite(v) else float(v) for v in t.detach().float().cpu().tolist()]

    if isinstance(out, PairwiseOutput):
        body = {"prob_a": lst(out.prob_a)}
        if out.score_a is not None:
            body["score_a"], body["score_b"] = lst(out.score_a), lst(out.score_b)
    else:
        body = {"scores": lst(out.scores)}
    body["details"] = {k: lst(v) for k, v in out.details.items() if v.ndim == 1}
    return body


# ----------------------------------------------------------------------------------------------
# one request: bounded body, JSON object, validated items (pure; no Ray)
# ----------------------------------------------------------------------------------------------
async def read_body(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """The request body from its chunks, read no further than the first chunk that passes `limit` bytes.

    `Content-Length` cannot be trusted to bound memory: a chunked body has none.
    """
    buf = bytearray()
    async for chunk in chunks:
        buf += chunk
        if len(buf) > limit:
            raise RequestTooLargeError(f"request body exceeds max_request_bytes={limit} (stopped reading at "
                                       f"{len(buf)} bytes); split it into smaller requests")
    return bytes(buf)


def parse_json_object(body: bytes) -> dict:
    """The request body as a JSON object, or a BadRequestError that says what it is instead."""
    try:
        payload = json.loads(body)
    except RecursionError:
        raise BadRequestError("request body: JSON nested too deeply; send one flat object "
                              "{\"prompts\": ..., \"media\": ...}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise BadRequestError(f"request body is not valid JSON ({exc}); send a JSON object "
                              "{\"prompts\": ..., \"media\": ...}") from None
    if not isinstance(payload, dict):
        kind = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(payload), "null")
        raise BadRequestError(f"request body must be a JSON object {{\"prompts\": ..., \"media\": ...}}, got a JSON {kind}")
    return payload


@dataclass(frozen=True)
class Item:
    """One scored unit of one request: a prompt and its media (one tensor for /score, a pair for /compare)."""

    request: int
    prompt: str
    media: tuple[torch.Tensor, ...]


ROUTES = {"score": ("media",), "compare": ("media_a", "media_b")}


def validate_media(x: torch.Tensor, what: str, reward: Reward) -> torch.Tensor:
    """What `Reward.score` would refuse in a batch, refused for this tensor alone (reward's device and dtype)."""
    if x.ndim not in (4, 5):
        raise RewardInputError(f"{what}: shape must be [B, 3, H, W] for images or [B, T, 3, H, W] for videos, "
                               f"got {list(x.shape)}")
    if 0 in x.shape[1:]:
        raise RewardInputError(f"{what}: every item needs at least one frame, channel and pixel in each "
                               f"dimension, got shape {list(x.shape)}")
    batch = reward.prepare(x)  # layout, channels, NaN/inf and value-range checks of the media convention
    if not isinstance(batch, torch.Tensor):  # a tensor in gives a tensor out; guard against a custom prepare
        raise RewardInputError(f"{what}: reward '{reward.name}' could not batch shape {list(x.shape)}")
    return batch


def prepare_request(payload: dict, route: str, reward: Reward, *, max_items: int, request_id: int) -> list[Item]:
    """Decode and validate one request on its own, before any of it joins a batch shared with other requests.

    Everything `Reward.score`/`compare` checks on the input (media layout and values, prompts) is checked
    here, so a bad request fails alone with a typed error instead of failing the merged reward call.
    """
    keys = ROUTES[route]
    unknown = sorted(set(payload) - {"prompts", *keys})
    if unknown:
        raise BadRequestError(f"/{route}: unknown keys {unknown[:5]}; the body takes 'prompts' and {list(keys)}")
    tensors = []
    for key in keys:
        if key not in payload:
            raise BadRequestError(f"/{route}: missing {key!r}; the body takes 'prompts' and {list(keys)}")
        obj = payload[key]
        shape = obj.get("shape") if isinstance(obj, dict) else None
        if isinstance(shape, list) and len(shape) in (4, 5) and type(shape[0]) is int and shape[0] > max_items:
            # before decoding: the item count alone decides; a shape that is no image/video batch (e.g. 1-D)
            # is a malformed request (400 from validate_media), not a large one
            raise RequestTooLargeError(f"request has {shape[0]} items; max_request_items={max_items}. "
                                       "Split it into smaller requests.")
        tensors.append(validate_media(decode_tensor(obj, key), key, reward))
    n = len(tensors[0])
    if any(len(t) != n for t in tensors[1:]):
        raise RewardInputError(f"media_a and media_b must have the same length: got {n} and {len(tensors[1])}")
    if n == 0:
        raise RewardInputError(f"{keys[0]}: got an empty batch; send at least one item")
    prompts = normalize_prompts(payload.get("prompts"), n, required=reward.requires_prompt)
    return [Item(request_id, p, tuple(t[i] for t in tensors)) for i, p in enumerate(prompts)]



# ----------------------------------------------------------------------------------------------
# the scorer protocol of flow_grpo's reward servers and verl-omni's HTTP scorer, over JSON
# ----------------------------------------------------------------------------------------------
# flow_grpo (yifan123/flow_grpo@ac4c86e flow_grpo/rewards.py, e.g. unifiedreward_score_remote) and verl-omni
# (verl-project/verl-omni@a1139ba verl_omni/utils/reward_score/http_scorer_client.py, docs/start/http_scorer.md)
# POST `pickle.dumps({"images": [JPEG bytes], "prompts": [str], "metadata": {}})` to the server URL and read
# `pickle.loads(body)["outputs"]` (flow_grpo) or `["scores"]` (verl-omni), `{"error": ...}` on failure.
# Unpickling a request runs arbitrary code, so this server never does: it takes the same fields as a JSON
# object, each image's encoded file as a base64 string, and answers both keys.
SCORER_KEYS = ("images", "prompts", "metadata")
MAX_IMAGE_PIXELS = 8192 * 8192  # per decoded image: a small PNG may declare a huge canvas (decompression bomb)


def decode_image(data: Any, what: str) -> torch.Tensor:
    """A base64 string (optionally a data URL) of a PNG/JPEG/WebP file -> (3, H, W) float32 in [0, 1].

    The header is read first and an image above MAX_IMAGE_PIXELS is refused before its pixels are decoded.
    """
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, str):
        raise RewardInputError(f"{what}: expected a base64 string of an encoded image (PNG/JPEG), "
                               f"got {type(data).__name__}")
    if data.startswith("data:"):
        data = data.partition(",")[2]
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError as exc:
        raise RewardInputError(f"{what}: not valid base64 ({exc})") from None
    try:
        with Image.open(io.BytesIO(raw)) as im:
            if im.format not in ("PNG", "JPEG", "WEBP"):
                raise RewardInputError(f"{what}: image format {im.format} not accepted; send PNG, JPEG or WebP")
            if im.width * im.height > MAX_IMAGE_PIXELS:
                raise RequestTooLargeError(f"{what}: {im.width}x{im.height} image exceeds {MAX_IMAGE_PIXELS} pixels")
            arr = np.asarray(im.convert("RGB"))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt files
        if isinstance(exc, MMRewardError):
            raise
        raise RewardInputError(f"{what}: not a readable PNG/JPEG/WebP image ({type(exc).__name__})") from None
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255.0)


def prepare_scorer_request(payload: dict, reward: Reward, *, max_items: int, request_id: int) -> list[Item]:
    """flow_grpo / verl-omni fields -> validated Items (one per image; images may differ in size)."""
    unknown = sorted(set(payload) - set(SCORER_KEYS))
    if unknown:
        raise BadRequestError(f"scorer: unknown keys {unknown[:5]}; the body takes {list(SCORER_KEYS)} "
                              "(images as base64 strings of encoded image files)")
    images = payload.get("images")
    if not isinstance(images, list) or not images:
        raise BadRequestError("scorer: 'images' must be a non-empty list of base64-encoded PNG/JPEG files")
    if len(images) > max_items:
        raise RequestTooLargeError(f"request has {len(images)} items; max_request_items={max_items}. "
                                   "Split it into smaller requests.")
    metadata = payload.get("metadata")
    if metadata is not None and not isinstance(metadata, (dict, list)):
        raise BadRequestError(f"scorer: 'metadata' must be an object or a list, got {type(metadata).__name__}")
    media = [validate_media(decode_image(x, f"images[{i}]")[None], f"images[{i}]", reward)[0]
             for i, x in enumerate(images)]
    prompts = normalize_prompts(payload.get("prompts"), len(media), required=reward.requires_prompt)
    return [Item(request_id, p, (m,)) for p, m in zip(prompts, media)]


def scorer_body(body: dict) -> dict:
    """Our /score answer in the scorer protocol: `scores` (verl-omni) and the same list as `outputs` (flow_grpo)."""
    return {"scores": body["scores"], "outputs": body["scores"], "details": body.get("details", {})}
