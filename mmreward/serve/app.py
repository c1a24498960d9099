"""The serving application (ScoringApp), the Ray Serve deployment around it, and start/shutdown."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import asdict

from mmreward.serve.batching import MicroBatcher, ServeMetrics, merge_results, score_items
from mmreward.serve.config import ServeConfig
from mmreward.serve.wire import (
    ROUTES,
    RequestTooLargeError,
    error_message,
    error_status,
    parse_json_object,
    prepare_request,
    prepare_scorer_request,
    read_body,
    scorer_body,
)
from mmreward.serve_http import SCORER_ROUTES, route_name, token_ok
from mmreward.types import Reward

_log = logging.getLogger("mmreward.serve")


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
        kw = {"max_items": self.cfg.max_request_items, "request_id": next(self._ids)}

        def decode() -> list:
            payload = parse_json_object(body)
            if route in SCORER_ROUTES:
                return prepare_scorer_request(payload, self.reward, **kw)
            return prepare_request(payload, route, self.reward, **kw)

        # JSON, base64 and image decoding of a large body take a while: off the loop that reads other requests
        items = await asyncio.to_thread(decode)
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
