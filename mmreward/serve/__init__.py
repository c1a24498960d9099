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

Modules: `config` (ServeConfig), `wire` (typed errors, the tensor format, request validation, the scorer
protocol), `batching` (merging and isolation, metrics, MicroBatcher), `app` (ScoringApp, the Ray deployment,
start/shutdown), `client` (RewardClient). Every name is importable from `mmreward.serve`.
"""

from __future__ import annotations

from mmreward.serve.app import (
    ScoringApp,
    _free_loopback_port,
    _is_loopback,
    _loopback_ray,
    _replica_grpc_on_loopback,
    build_app,
    load_reward,
    shutdown,
    start,
)
from mmreward.serve.batching import (
    MicroBatcher,
    RewardCall,
    ServeMetrics,
    merge_results,
    nearest_rank,
    score_items,
)
from mmreward.serve.client import RemoteRewardError, RewardClient
from mmreward.serve.config import ServeConfig
from mmreward.serve.wire import (
    MAX_IMAGE_PIXELS,
    ROUTES,
    SCORER_KEYS,
    BadRequestError,
    Item,
    RequestTooLargeError,
    _output_json,
    decode_image,
    decode_tensor,
    encode_tensor,
    error_message,
    error_status,
    parse_json_object,
    prepare_request,
    prepare_scorer_request,
    read_body,
    scorer_body,
    validate_media,
)

__all__ = [
    "BadRequestError", "Item", "MAX_IMAGE_PIXELS", "MicroBatcher", "ROUTES", "RemoteRewardError", "RequestTooLargeError",
    "RewardCall", "RewardClient", "SCORER_KEYS", "ScoringApp", "ServeConfig", "ServeMetrics", "build_app",
    "decode_image", "decode_tensor", "encode_tensor", "error_message", "error_status", "load_reward",
    "merge_results", "nearest_rank", "parse_json_object", "prepare_request", "prepare_scorer_request", "read_body",
    "score_items", "scorer_body", "shutdown", "start", "validate_media",
    "_free_loopback_port", "_is_loopback", "_loopback_ray", "_output_json", "_replica_grpc_on_loopback",
]
