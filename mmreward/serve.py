"""A reward server (Ray Serve replicas, or one in-process engine), and its client.

`mmreward serve --reward NAME ...` loads the reward once per replica and exposes, over HTTP:

    GET  /healthz   no auth; {"status": "ok", "reward": ..., "modalities": [...], ...}
    GET  /metrics   this replica's queue depth, requests in flight, batch sizes, latency p50/p90/p99 (ms)
    POST /score     {"prompts": [...], "media": <tensor>}            -> {"scores": [...], "details": {...}}
    POST /compare   {"prompts": [...], "media_a": <t>, "media_b": <t>} -> {"prob_a": [...], ...}
    POST / and /scorer   flow_grpo's and verl-omni's scorer fields over JSON (never pickle):
                    {"images": [base64 PNG/JPEG], "prompts": [...], "metadata": {}} -> {"scores", "outputs"}

A <tensor> is {"dtype": "float32", "shape": [B, ...], "data": base64 of the raw little-endian bytes}
in our media convention ([0, 1], (B, 3, H, W) or (B, T, 3, H, W)), so the server scores exactly the
pixels the client holds. Items of concurrent requests are merged by a `MicroBatcher` (dynamic batching up
to `max_batch_size` items or `batch_wait_timeout_s`), same-shaped items stacked into one reward call run in
a worker thread; with engine="ray" (default) Ray places `num_replicas` replicas over the cluster's GPUs
(`num_gpus` each), with engine="local" the reward runs in the serving process (no Ray). docs/serving.md.

One client cannot fail another's request: each request is decoded and validated on its own (media
layout and values, prompts) before its items join a shared batch, and when a merged reward call still
fails, its requests are retried one at a time so only the one that makes the reward fail gets the error.
Errors are JSON `{"error": ...}`: 400 for a malformed request or media, 413 for too large, 422 when the
reward yields NaN/inf on that request's media, 500 (no internals in the text) for an untyped failure.

Safety defaults: bind to 127.0.0.1; every POST needs `Authorization: Bearer <token>` (a random token is
generated and printed when none is given; `--no-auth` must be explicit); a body above `max_request_bytes`
is refused with 413 as soon as that many bytes have been read (chunked bodies included), and a request
of more than `max_request_items` items before its data is decoded. Clients reach the server through a
bounded HTTP front end (mmreward.serve_http: header line, count and size caps, idle, header and body
timeouts, a connection cap, the token checked before any body byte), with Ray Serve's proxy behind it on a
private loopback port (or the in-process app). The scorer routes also take the token as `?token=` in the
URL, since flow_grpo's and verl-omni's clients send no headers.
"""

from __future__ import annotations

import asyncio
import base64
import io
import ipaddress
import itertools
import json
import logging
import math
import os
import secrets
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from mmreward.errors import ConfigError, MMRewardError, RewardInputError, RewardValueError
from mmreward.serve_http import SCORER_ROUTES, route_name, token_ok
from mmreward.types import PairwiseOutput, Reward, RewardOutput, normalize_prompts

_DTYPES = {"float32": np.float32, "float16": np.float16, "uint8": np.uint8}
_MAX_NDIM = 5  # [B, T, 3, H, W]
_log = logging.getLogger("mmreward.serve")


@dataclass
class ServeConfig:
    reward: str = "mock"  # registered name or source
    checkpoint: str | None = None  # weights (default: the reward's own)
    weights: str = "pretrained"  # 'random' only for demos and tests
    options: dict[str, Any] = field(default_factory=dict)  # extra loader options
    device: str | None = None  # device inside each replica
    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = 8000
    token: str | None = None  # bearer token; generated when None and auth is on
    auth: bool = True  # False serves without a token (explicit opt-out)
    max_batch_size: int = 32  # items merged into one reward call by serve.batch
    batch_wait_timeout_s: float = 0.01  # how long a batch waits to fill
    max_request_items: int = 256  # items (or pairs) per request
    max_request_bytes: int = 64 * 2**20  # request body size
    num_replicas: int = 1
    num_gpus: float = 0.0  # per replica
    num_cpus: float = 1.0  # per replica
    runtime_env: dict[str, Any] | None = None  # Ray runtime_env of each replica (pip, env_vars): conflicting deps
    # the HTTP front end (mmreward.serve_http): what an unauthenticated client can make the server hold
    max_header_line_bytes: int = 8192  # request line and each header line (414 / 431)
    max_headers: int = 100  # header fields per request (431)
    max_header_bytes: int = 64 * 1024  # the whole request head (431)
    header_timeout_s: float = 10.0  # first byte to end of head (408, slowloris)
    idle_timeout_s: float = 5.0  # a connection with no request in flight is closed after this
    body_timeout_s: float = 120.0  # the whole body must arrive within this (408)
    max_connections: int = 256  # served at once; one more is answered 503
    # "ray": Ray Serve replicas behind the front end (num_replicas, num_gpus); "local": the reward in this
    # process, no Ray (one replica on one device: the lightest way to put a reward on its own GPU)
    engine: str = "ray"

    def __post_init__(self) -> None:
        if self.engine not in ("ray", "local"):
            raise ConfigError(f"engine must be 'ray' (Ray Serve replicas) or 'local' (no Ray), got {self.engine!r}")
        self.http_limits()  # validates the front end's limits now, not when the server starts
        if self.max_batch_size < 1 or self.max_request_items < 1 or self.max_request_bytes < 1:
            raise ConfigError("max_batch_size, max_request_items and max_request_bytes must be >= 1")
        if self.batch_wait_timeout_s < 0:
            raise ConfigError(f"batch_wait_timeout_s must be >= 0, got {self.batch_wait_timeout_s}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.num_replicas < 1:
            raise ConfigError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if self.auth and not self.token:
            self.token = secrets.token_urlsafe(24)


    def http_limits(self):
        from mmreward.serve_http import HTTPLimits

        return HTTPLimits(max_line_bytes=self.max_header_line_bytes, max_headers=self.max_headers,
                          max_header_bytes=self.max_header_bytes, max_body_bytes=self.max_request_bytes,
                          header_timeout_s=self.header_timeout_s, idle_timeout_s=self.idle_timeout_s,
                          body_timeout_s=self.body_timeout_s, max_connections=self.max_connections)


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
# items of concurrent requests, merged and isolated (pure; no Ray)
# ----------------------------------------------------------------------------------------------
RewardCall = Callable[[list[str], list[torch.Tensor]], "RewardOutput | PairwiseOutput"]


def score_items(items: Sequence[Item], call: RewardCall) -> list[dict]:
    """Score items merged from concurrent requests: one result dict per item, in order.

    Same-shaped items run in one `call(prompts, [stacked media per slot])`. When a merged call fails, for
    any reason, its requests are retried one request at a time, so a request that makes the reward fail
    fails alone and every other request gets what it would get alone. A failed item's dict is
    {"error": message, "status": HTTP status}.
    """
    results: list[dict] = [{}] * len(items)
    groups: dict[tuple, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(tuple(tuple(m.shape) for m in it.media), []).append(i)
    for idx in groups.values():
        by_request: dict[int, list[int]] = {}
        for i in idx:
            by_request.setdefault(items[i].request, []).append(i)
        try:
            _run(items, idx, call, results)
        except Exception as exc:  # noqa: BLE001 - isolated below, reported to the guilty request only
            if len(by_request) == 1:
                _fail(idx, exc, results)
                continue
            for sub in by_request.values():
                try:
                    _run(items, sub, call, results)
                except Exception as sub_exc:  # noqa: BLE001
                    _fail(sub, sub_exc, results)
    return results


def _run(items: Sequence[Item], idx: list[int], call: RewardCall, results: list[dict]) -> None:
    slots = len(items[idx[0]].media)
    out = call([items[i].prompt for i in idx], [torch.stack([items[i].media[s] for i in idx]) for s in range(slots)])
    body = _output_json(out)
    for k, v in body.items():
        if k != "details" and len(v) != len(idx):
            raise RuntimeError(f"reward returned {len(v)} values of {k!r} for {len(idx)} items")
    for j, i in enumerate(idx):
        results[i] = {k: (v[j] if k != "details" else {d: dv[j] for d, dv in v.items()}) for k, v in body.items()}


def _fail(idx: list[int], exc: Exception, results: list[dict]) -> None:
    status = error_status(exc)
    if status == 500:
        _log.error("reward call failed for a request of %d items", len(idx), exc_info=exc)
    for i in idx:
        results[i] = {"error": error_message(exc), "status": status}


def merge_results(results: list[dict]) -> tuple[dict, int]:
    """One request's per-item results -> (response body, HTTP status); a failed item fails the request."""
    for r in results:
        if "error" in r:
            return {"error": r["error"]}, r["status"]
    out: dict = {k: [r[k] for r in results] for k in results[0] if k != "details"}
    out["details"] = {d: [r["details"][d] for r in results] for d in results[0].get("details", {})}
    return out, 200


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


# ----------------------------------------------------------------------------------------------
# metrics and dynamic batching (pure asyncio; no Ray)
# ----------------------------------------------------------------------------------------------
def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile by the nearest-rank rule: the smallest value with at least q% of values <= it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100.0 * len(ordered)), 1) - 1]


class ServeMetrics:
    """What GET /metrics reports for one replica: queue depth, requests in flight, batch sizes, latencies.

    Latencies (ms, request read to answer) and batch sizes are kept for the last `window` requests/batches.
    """

    def __init__(self, window: int = 4096) -> None:
        self.started = time.monotonic()
        self.queue_depth = 0  # items waiting for a batch
        self.in_flight = 0  # requests being served
        self.requests: dict[str, int] = {}  # by route
        self.statuses: dict[str, int] = {}  # by HTTP status
        self.latency_ms: deque[float] = deque(maxlen=window)
        self.batch_sizes: deque[int] = deque(maxlen=window)
        self.batches = self.items = 0

    def record_request(self, route: str, status: int, seconds: float) -> None:
        self.requests[route] = self.requests.get(route, 0) + 1
        self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
        self.latency_ms.append(seconds * 1000.0)

    def record_batch(self, size: int) -> None:
        self.batches += 1
        self.items += size
        self.batch_sizes.append(size)

    def snapshot(self) -> dict:
        lat, sizes = list(self.latency_ms), list(self.batch_sizes)
        return {
            "uptime_s": round(time.monotonic() - self.started, 3), "queue_depth": self.queue_depth,
            "in_flight_requests": self.in_flight, "requests": dict(self.requests), "statuses": dict(self.statuses),
            "batches": {"count": self.batches, "items": self.items, "window": len(sizes),
                        "mean_size": sum(sizes) / len(sizes) if sizes else None,
                        "max_size": max(sizes, default=None), "p50_size": nearest_rank(sizes, 50)},
            "latency_ms": {"window": len(lat), "mean": sum(lat) / len(lat) if lat else None,
                           "p50": nearest_rank(lat, 50), "p90": nearest_rank(lat, 90), "p99": nearest_rank(lat, 99)},
        }


class MicroBatcher:
    """Merges the items of concurrent requests into reward calls of up to `max_batch_size` items, waiting at
    most `wait_s` for a batch to fill; `fn(items) -> [result per item]` (score_items: never raises) runs in a
    worker thread, one call at a time across the batchers sharing `lock`, so the event loop keeps reading
    requests while the reward runs."""

    def __init__(self, fn: Callable[[list[Item]], list[dict]], max_batch_size: int, wait_s: float,
                 metrics: ServeMetrics, lock: asyncio.Lock | None = None) -> None:
        self.fn, self.max_batch_size, self.wait_s, self.metrics = fn, max_batch_size, wait_s, metrics
        self.lock = lock or asyncio.Lock()  # binds to the serving loop on first use (Python >= 3.10)
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None

    async def submit(self, items: Sequence[Item]) -> list[dict]:
        loop = asyncio.get_running_loop()
        if self._queue is None:  # created in the loop that serves (a Ray replica's, or the front end's)
            self._queue = asyncio.Queue()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._run())
        futures = [loop.create_future() for _ in items]
        for it, fut in zip(items, futures):
            self._queue.put_nowait((it, fut))
        self.metrics.queue_depth += len(items)
        return list(await asyncio.gather(*futures))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        queue = self._queue
        while True:
            batch = [await queue.get()]
            deadline = loop.time() + self.wait_s
            while len(batch) < self.max_batch_size:
                if not queue.empty():
                    batch.append(queue.get_nowait())
                    continue
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(queue.get(), left))
                except asyncio.TimeoutError:
                    break
            self.metrics.queue_depth -= len(batch)
            self.metrics.record_batch(len(batch))
            async with self.lock:
                try:
                    results = await asyncio.to_thread(self.fn, [it for it, _ in batch])
                except Exception as exc:  # noqa: BLE001 - score_items does not raise; a bug must not hang clients
                    _log.error("batch failed", exc_info=exc)
                    results = [{"error": error_message(exc), "status": 500}] * len(batch)
            for (_, fut), result in zip(batch, results):
                if not fut.done():  # a client that went away cancelled its future
                    fut.set_result(result)


# ----------------------------------------------------------------------------------------------
# the application: routes, auth, batching, metrics (no Ray; the Ray deployment and engine="local" share it)
# ----------------------------------------------------------------------------------------------
class ScoringApp:
    """Serves one loaded reward: GET /healthz, GET /metrics, POST /score, /compare, and the scorer protocol
    (POST / and /scorer). `handle` never raises: every failure becomes this request's JSON error."""

    def __init__(self, cfg: ServeConfig, reward: Reward) -> None:
        self.cfg, self.reward = cfg, reward
        self.metrics = ServeMetrics()
        self._ids = itertools.count()
        lock = asyncio.Lock()  # one reward call at a time: /score and /compare batches share the model

        def score(items):
            return score_items(items, lambda prompts, media: reward.score(prompts, media[0]))

        def compare(items):
            return score_items(items, lambda prompts, media: reward.compare(prompts, media[0], media[1]))

        self.score_batcher = MicroBatcher(score, cfg.max_batch_size, cfg.batch_wait_timeout_s, self.metrics, lock)
        self.compare_batcher = MicroBatcher(compare, cfg.max_batch_size, cfg.batch_wait_timeout_s, self.metrics, lock)

    def health(self) -> dict:
        r = self.reward
        return {"status": "ok", "reward": r.name, "modalities": list(r.modalities),
                "higher_is_better": r.higher_is_better, "requires_prompt": r.requires_prompt,
                "max_request_items": self.cfg.max_request_items, "max_request_bytes": self.cfg.max_request_bytes,
                "routes": ["GET /healthz", "GET /metrics", "POST /score", "POST /compare", "POST / (scorer)",
                           "POST /scorer"]}

    async def handle(self, method: str, target: str, authorization: str | None, body: bytes) -> tuple[int, dict]:
        t0 = time.perf_counter()
        route = route_name(target)
        if method == "GET" and route == "healthz":
            return 200, self.health()
        if not token_ok(self.cfg.token if self.cfg.auth else None, authorization, target):
            return 401, {"error": "missing or wrong bearer token (Authorization: Bearer <token>)"}
        if method == "GET" and route == "metrics":
            return 200, self.metrics.snapshot()
        if method != "POST" or route not in (*ROUTES, *SCORER_ROUTES):
            return 404, {"error": f"unknown route {method} {target.split('?', 1)[0]}; use POST /score, /compare, "
                                  "/scorer, or GET /healthz, /metrics"}
        self.metrics.in_flight += 1
        try:
            status, out = await self._score(route, body)
        except Exception as exc:  # noqa: BLE001 - typed errors are the client's (4xx), the rest 500
            status = error_status(exc)
            if status == 500:
                _log.error("request failed", exc_info=exc)
            out = {"error": error_message(exc)}
        finally:
            self.metrics.in_flight -= 1
        self.metrics.record_request(route or "scorer", status, time.perf_counter() - t0)
        return status, out

    async def _score(self, route: str, body: bytes) -> tuple[int, dict]:
        limit = self.cfg.max_request_bytes
        if len(body) > limit:
            raise RequestTooLargeError(f"request body of {len(body)} bytes exceeds max_request_bytes={limit}")
        payload = parse_json_object(body)
        kw = {"max_items": self.cfg.max_request_items, "request_id": next(self._ids)}
        if route in SCORER_ROUTES:
            items = await asyncio.to_thread(prepare_scorer_request, payload, self.reward, **kw)  # image decoding
        else:
            items = prepare_request(payload, route, self.reward, **kw)
        batcher = self.compare_batcher if route == "compare" else self.score_batcher
        out, status = merge_results(await batcher.submit(items))
        if status == 200 and route in SCORER_ROUTES:
            out = scorer_body(out)
        return status, out


# ----------------------------------------------------------------------------------------------
# the Ray Serve deployment
# ----------------------------------------------------------------------------------------------
def load_reward(cfg: ServeConfig) -> Reward:
    import mmreward

    return mmreward.load(cfg.reward, checkpoint=cfg.checkpoint, device=cfg.device, weights=cfg.weights, **cfg.options)


def build_app(cfg: ServeConfig):
    """The bound Ray Serve application for `cfg` (deploy with `serve.run`): one ScoringApp per replica."""
    from mmreward.errors import require

    serve = require("ray.serve", "serve", "the reward server")
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @serve.deployment(name="mmreward", max_ongoing_requests=1000)
    class RewardDeployment:
        def __init__(self, cfg_dict: dict) -> None:
            _replica_grpc_on_loopback()
            self.cfg = ServeConfig(**cfg_dict)
            self.app = ScoringApp(self.cfg, load_reward(self.cfg))

        async def __call__(self, request: Request):
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            body = b""
            if request.method == "POST":
                limit = self.cfg.max_request_bytes
                declared = request.headers.get("content-length")
                try:
                    if declared is not None and declared.isdigit() and int(declared) > limit:
                        raise RequestTooLargeError(f"request body of {declared} bytes exceeds max_request_bytes={limit}")
                    body = await read_body(request.stream(), limit)
                except RequestTooLargeError as exc:
                    return JSONResponse({"error": error_message(exc)}, status_code=413)
            status, out = await self.app.handle(request.method, target, request.headers.get("authorization"), body)
            return JSONResponse(out, status_code=status)

    # A replica being stopped polls for in-flight requests every graceful_shutdown_wait_loop_s (2 s by
    # default); polling every 0.1 s lets an idle server stop at once and still drains busy ones.
    opts = {"num_replicas": cfg.num_replicas, "ray_actor_options": {"num_gpus": cfg.num_gpus, "num_cpus": cfg.num_cpus},
            "graceful_shutdown_wait_loop_s": 0.1}
    if cfg.runtime_env:  # the replicas' own environment, e.g. a reward whose pins conflict with the trainer's
        opts["ray_actor_options"]["runtime_env"] = dict(cfg.runtime_env)
    return RewardDeployment.options(**opts).bind(asdict(cfg))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _replica_grpc_on_loopback() -> None:
    """On a loopback-only Ray node, bind this replica's inter-deployment gRPC server to loopback too.

    Ray Serve binds that server to [::] (every interface) whatever the node IP, when the replica finishes
    initialising (after our __init__); on a node whose IP is loopback no other host can use it anyway.
    """
    import ray

    node_ip = ray.util.get_node_ip_address()
    if not _is_loopback(node_ip):
        return
    try:
        from ray.serve._private import replica
    except ImportError:  # another Ray layout: the listening-socket test will say so
        return
    add = getattr(replica, "add_port_to_grpc_server", None)
    if add is None or getattr(add, "mmreward_loopback", False):
        return

    host = f"[{node_ip}]" if ":" in node_ip else node_ip

    def add_port(server, address: str):
        if address.startswith("[::]:"):
            address = f"{host}:{address.removeprefix('[::]:')}"
        return add(server, address)

    add_port.mmreward_loopback = True
    replica.add_port_to_grpc_server = add_port


@contextmanager
def _loopback_ray():
    """Make the Ray node we start use 127.0.0.1 as its IP, so its GCS, raylet, workers and agents bind loopback.

    Ray's servers bind the node IP, and `ray.init(_node_ip_address="127.0.0.1")` alone is rewritten to the
    machine's external address; Ray keeps loopback only with its local-only mode
    (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, the Windows/macOS default), read by each Ray process at import:
    set in the environment the Ray processes inherit, and in this already-imported driver.
    """
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):  # another Ray layout: the listening-socket test says so
        yield
        return
    var = getattr(ray_constants, "ENABLE_RAY_CLUSTERS_ENV_VAR", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    old_env, old_flag = os.environ.get(var), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[var], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_flag
        if old_env is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = old_env


_FRONT_END = None  # the running mmreward.serve_http.FrontEnd of this process


def _free_loopback_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cfg: ServeConfig, *, blocking: bool = False, ray_init: dict | None = None) -> str:
    """Serve `cfg.reward` on `cfg.host`:`cfg.port` and return the URL (`cfg.port=0` picks a free port).

    Clients talk to our bounded HTTP front end (mmreward.serve_http) in this process. With engine="ray", Ray
    starts (locally unless RAY_ADDRESS says otherwise), the deployment is placed over the cluster, and Ray
    Serve's own proxy listens on a private 127.0.0.1 port behind the front end, since it buffers request
    heads without limit; when we start Ray ourselves and `cfg.host` is loopback, Ray's own ports (GCS,
    raylet, workers, agents) listen on loopback too, and the dashboard is not started. With engine="local" the
    reward is loaded in this process and the front end calls it directly (no Ray).
    """
    global _FRONT_END
    from mmreward.serve_http import FrontEnd

    token = cfg.token if cfg.auth else None
    if cfg.engine == "local":
        app = ScoringApp(cfg, load_reward(cfg))

        async def call(method: str, target: str, authorization: str | None, body: bytes):
            status, out = await app.handle(method, target, authorization, body)
            return status, "application/json", json.dumps(out).encode()

        front = FrontEnd(cfg.host, cfg.port, None, token=token, limits=cfg.http_limits(), app=call)
    else:
        from mmreward.errors import require

        ray = require("ray", "serve", "the reward server")
        serve = require("ray.serve", "serve", "the reward server")
        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False,
                      **(ray_init or {})}
            ours = not (kwargs.get("address") or os.environ.get("RAY_ADDRESS"))
            if ours and _is_loopback(cfg.host):
                with _loopback_ray():
                    ray.init(**kwargs)
            else:
                ray.init(**kwargs)
        upstream = ("127.0.0.1", _free_loopback_port())
        serve.start(http_options={"host": upstream[0], "port": upstream[1]}, logging_config={"log_level": "WARNING"})
        serve.run(build_app(cfg), name="mmreward", route_prefix="/", blocking=False)
        front = FrontEnd(cfg.host, cfg.port, upstream, token=token, limits=cfg.http_limits())
    port = front.start()
    _FRONT_END = front
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    if blocking:
        while True:
            time.sleep(3600)
    return f"http://{host}:{port}"


def shutdown() -> None:
    """Stop the front end, and Ray Serve and Ray when they run."""
    global _FRONT_END
    import sys

    if _FRONT_END is not None:
        _FRONT_END.stop()
        _FRONT_END = None
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        from ray import serve

        serve.shutdown()
        ray.shutdown()


# ----------------------------------------------------------------------------------------------
# client
# ----------------------------------------------------------------------------------------------
class RemoteRewardError(MMRewardError, RuntimeError):
    """The reward server refused a request or could not be reached."""


class RewardClient(Reward):
    """A `Reward` whose scores come from an `mmreward serve` endpoint.

    Besides `score`/`compare`, it speaks the scorer conventions trainers already use:
    `client.flow_grpo_scorer()` returns `fn(images, prompts, metadata) -> (scores, info)` as in
    flow_grpo's reward functions, and `client.compute_score(prompts, images)` returns a list of floats
    (the batched reward-function shape verl-style trainers call).
    """

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 120.0, micro_batch_size: int = 64):
        super().__init__(micro_batch_size=micro_batch_size)
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        info = self._request("GET", "/healthz")
        self.name = info["reward"]
        self.modalities = tuple(info["modalities"])
        self.higher_is_better = bool(info["higher_is_better"])
        self.requires_prompt = bool(info["requires_prompt"])
        self.micro_batch_size = min(micro_batch_size, int(info.get("max_request_items", micro_batch_size)))

    def metrics(self) -> dict:
        """The server's GET /metrics (one replica's: queue depth, batch sizes, latency percentiles)."""
        return self._request("GET", "/metrics")

    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        data = json.dumps(payload).encode() if payload is not None else None
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                msg = json.loads(exc.read()).get("error", "")
            except Exception:  # noqa: BLE001 - a non-JSON error page
                msg = ""
            raise RemoteRewardError(f"{self.url}{path} answered HTTP {exc.code}: {msg}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise RemoteRewardError(f"cannot reach the reward server at {self.url}: {exc}") from exc

    def _score(self, prompts, media):
        if isinstance(media, list):
            return RewardOutput.concat([self._score([p], m[None]) for p, m in zip(prompts, media)])
        body = self._request("POST", "/score", {"prompts": prompts, "media": encode_tensor(media)})
        nan = float("nan")

        def t(v):
            return torch.tensor([nan if x is None else x for x in v], dtype=torch.float32)

        return RewardOutput(t(body["scores"]), {k: t(v) for k, v in body.get("details", {}).items()})

    def compare(self, prompts, media_a, media_b, *, value_range=None) -> PairwiseOutput:
        from mmreward.types import normalize_prompts

        a, b = self.prepare(media_a, value_range), self.prepare(media_b, value_range)
        if len(a) != len(b):
            raise RewardInputError(f"media_a and media_b must have the same length: got {len(a)} and {len(b)} items")
        if len(a) == 0:
            raise RewardInputError("media_a: got an empty batch; pass at least one pair")
        prompt_list = normalize_prompts(prompts, len(a), required=self.requires_prompt)
        body = self._request("POST", "/compare", {"prompts": prompt_list, "media_a": encode_tensor(torch.stack(list(a))),
                                                  "media_b": encode_tensor(torch.stack(list(b)))})
        nan = float("nan")
        prob = torch.tensor([nan if x is None else x for x in body["prob_a"]], dtype=torch.float32)
        sa = torch.tensor(body["score_a"]) if "score_a" in body else None
        sb = torch.tensor(body["score_b"]) if "score_b" in body else None
        return PairwiseOutput(prob_a=prob, score_a=sa, score_b=sb)

    def compute_score(self, prompts, images, **_: Any) -> list[float]:
        return self.score(prompts, images).scores.tolist()

    def flow_grpo_scorer(self):
        def scorer(images, prompts, metadata=None):
            value_range = None
            if isinstance(images, torch.Tensor) and images.dtype != torch.uint8 and float(images.min()) < 0:
                value_range = (-1.0, 1.0)
            out = self.score(list(prompts), images, value_range=value_range)
            return out.scores.cpu().numpy(), {}

        return scorer
