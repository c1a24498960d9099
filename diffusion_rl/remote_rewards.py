"""Rewards on their own processes or machines: `reward.remote` of the run config.

    reward:
      rewards: {pickscore: 1.0, shapes-eval: 0.5}
      remote:
        pickscore: {url: http://10.0.0.8:8000, token_env: MMREWARD_TOKEN, timeout_s: 120, retries: 3}
        shapes-eval: {replicas: 2, devices: [cpu]}      # a local pool: worker processes on this machine

A `url` names a server that is already running: `mmreward serve` (Ray Serve: replicas, GPU fractions and a
Ray `runtime_env` per reward; `python -m diffusion_rl.remote_rewards serve` puts several rewards in one such
server, each at URL/NAME), or `python -m diffusion_rl.remote_rewards worker` (one plain process, several
rewards, no Ray); several urls are replicas the trainer spreads its requests over. Without `url`, the trainer
starts `replicas` worker processes itself (`devices` cycled over them, a random bearer token, loopback only)
and stops them when it exits. Rewards with the same device share a worker: several rewards in one server.
With `engine: ray` the trainer starts one Ray Serve server instead: `replicas` Ray actors per reward with
`num_gpus` GPUs each and the reward's own `runtime_env` (a reward whose dependencies conflict with the
trainer's).

Either way the trainer holds a `RemoteReward`: a `Reward` whose scores come over HTTP in the `mmreward serve`
wire format (float32 pixels, base64, so the server scores exactly the trainer's pixels), with a timeout per
request, retries with exponential backoff on another replica for what a retry can fix (unreachable, timeout,
HTTP 5xx/408/429), and the server's typed refusals raised as the in-process reward would raise them
(400/413 -> RewardInputError, 422 -> RewardValueError). A request carries at most `request_items` items; the
item chunks and their order do not depend on the number of replicas, so for a reward whose scores do not
depend on the batch an item is in (most do not, to float tolerance; ShapesEval exactly), a remote run equals
the in-process one bit for bit. Per-prompt metadata (GenEval rows) is not sent: rewards that read it must
run in the trainer.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import itertools
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from diffusion_rl.remote_specs import RemoteSpec, parse_remote_specs
from mmreward.errors import ConfigError, MMRewardError, RewardInputError, RewardValueError
from mmreward.serve import (
    RemoteRewardError,
    RequestTooLargeError,
    RewardClient,
    error_message,
    error_status,
    merge_results,
    parse_json_object,
    prepare_request,
    score_items,
)
from mmreward.serve.config import new_token
from mmreward.types import PairwiseOutput, Reward, RewardOutput

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
READY = "mmreward-worker ready"


# ----------------------------------------------------------------------------------------------
# the trainer's side: a Reward whose scores come from servers
# ----------------------------------------------------------------------------------------------
def _status(exc: BaseException) -> int | None:
    """The HTTP status of a RewardClient failure; None when the server did not answer (unreachable, timeout)."""
    for source in (exc, exc.__cause__):
        for attr in ("status", "status_code", "code"):
            value = getattr(source, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    found = re.search(r"answered HTTP (\d{3})", str(exc))  # RewardClient's message names the status
    return int(found.group(1)) if found else None


class RemoteReward(Reward):
    """A reward served elsewhere, over one or more replicas (`RewardClient`s of the same reward).

    `score` checks the media here as any reward does (`Reward.prepare`), then sends chunks of at most
    `request_items` items, spread over the replicas in parallel; a chunk that fails in a way a retry can fix
    is retried on the next replica after `backoff_s * 2**k` seconds, up to `retries` more times.
    """

    def __init__(self, name: str, urls: Sequence[str], token: str | None, *, timeout_s: float = 120.0,
                 retries: int = 2, backoff_s: float = 0.5, request_items: int = 32) -> None:
        # the base class would split a batch into micro-batches run one after another; we split and spread
        super().__init__(micro_batch_size=2**31 - 1)
        self.config_name, self.retries, self.backoff_s = name, retries, backoff_s
        self.clients = [self._connect(u, token, timeout_s, request_items) for u in urls]
        first = self.clients[0]
        for c in self.clients[1:]:
            if (c.name, c.modalities) != (first.name, first.modalities):
                raise ConfigError(f"reward.remote.{name}: {c.url} serves '{c.name}' {c.modalities} but {first.url} "
                                  f"serves '{first.name}' {first.modalities}; replicas must serve the same reward")
        self.name, self.modalities = first.name, first.modalities
        self.higher_is_better, self.requires_prompt = first.higher_is_better, first.requires_prompt
        self.request_items = min(request_items, min(c.micro_batch_size for c in self.clients))
        self._next = itertools.count()
        self._pool = ThreadPoolExecutor(max_workers=len(self.clients), thread_name_prefix=f"remote-{name}")
        weakref.finalize(self, self._pool.shutdown, wait=False)

    def _connect(self, url: str, token: str | None, timeout_s: float, request_items: int) -> RewardClient:
        def once() -> RewardClient:
            return RewardClient(url, token, timeout=timeout_s, micro_batch_size=request_items)

        return self._retrying(f"GET {url}/healthz", lambda attempt: once())

    def _retrying(self, what: str, call) -> Any:
        for attempt in range(self.retries + 1):
            try:
                return call(attempt)
            except RemoteRewardError as exc:
                status = _status(exc)
                if status in (400, 413):
                    raise RewardInputError(f"reward '{self.config_name}' (remote): {exc}") from exc
                if status == 422:
                    raise RewardValueError(f"reward '{self.config_name}' (remote): {exc}") from exc
                if status == 401:
                    raise ConfigError(f"reward.remote.{self.config_name}: the server refused the bearer token; set "
                                      "the environment variable named by token_env to the server's token") from exc
                if (status is not None and status not in _RETRY_STATUS) or attempt == self.retries:
                    raise RemoteRewardError(f"reward '{self.config_name}': {what} failed after {attempt + 1} "
                                            f"tries: {exc}") from exc
            time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def _request(self, start: int, call_on) -> Any:
        n = len(self.clients)
        return self._retrying("a score request", lambda attempt: call_on(self.clients[(start + attempt) % n]))

    def _score(self, prompts: list[str], media: torch.Tensor | list[torch.Tensor]) -> RewardOutput:
        k = self.request_items
        chunks = [(prompts[i:i + k], media[i:i + k]) for i in range(0, len(prompts), k)]
        first = next(self._next)
        futures = [self._pool.submit(self._request, first + j, lambda c, p=p, m=m: c._score(p, m))
                   for j, (p, m) in enumerate(chunks)]
        return RewardOutput.concat([f.result() for f in futures])

    def compare(self, prompts, media_a, media_b, *, value_range=None) -> PairwiseOutput:
        return self._request(next(self._next), lambda c: c.compare(prompts, media_a, media_b, value_range=value_range))


# ----------------------------------------------------------------------------------------------
# a plain worker process: several rewards behind one loopback HTTP server, no Ray
# ----------------------------------------------------------------------------------------------
class RewardWorker:
    """Serves `rewards` in the `mmreward serve` wire format: GET /NAME/healthz, POST /NAME/score and
    /NAME/compare (and /healthz, /score, /compare when it serves one reward), bearer token, bounded body.

    A plain ThreadingHTTPServer for a trainer's own workers on loopback: requests to one reward are scored
    one at a time (rewards are not thread-safe), each request alone, so its scores never depend on other
    clients. Public endpoints belong behind `mmreward serve` (bounded front end, dynamic batching, Ray).
    """

    def __init__(self, rewards: Mapping[str, Reward], *, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, max_request_bytes: int = 64 * 2**20, max_request_items: int = 256,
                 request_timeout_s: float = 120.0) -> None:
        if not rewards:
            raise ConfigError("a reward worker needs at least one reward")
        self.rewards, self.token = dict(rewards), token
        self.max_request_bytes, self.max_request_items = max_request_bytes, max_request_items
        self._locks = {name: threading.Lock() for name in self.rewards}
        self._ids = itertools.count()
        worker = self

        class Handler(BaseHTTPRequestHandler):
            timeout = request_timeout_s  # a client that stops sending is cut off

            def log_message(self, *args: Any) -> None:  # no line per request on stderr
                pass

            def do_GET(self) -> None:
                self._answer(*worker.handle("GET", self.path, self.headers, self.rfile))

            def do_POST(self) -> None:
                self._answer(*worker.handle("POST", self.path, self.headers, self.rfile))

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> str:
        """Serve in a background thread; returns the base URL (a reward's URL is base/NAME)."""
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="reward-worker",
                                        daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _route(self, path: str) -> tuple[str | None, str]:
        parts = [p for p in path.split("?", 1)[0].split("/") if p]
        if len(parts) == 2:
            return parts[0], parts[1]
        if len(parts) == 1:
            return (next(iter(self.rewards)) if len(self.rewards) == 1 else None), parts[0]
        return None, ""

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: Any) -> tuple[int, dict]:
        """(HTTP status, JSON body) for one request; `body` is the request's readable stream."""
        import hmac

        name, route = self._route(path)
        if method == "GET" and route == "healthz":
            if name is None:
                return 200, {"status": "ok", "rewards": sorted(self.rewards)}
            if name not in self.rewards:
                return 404, {"error": f"no reward {name!r} here; this worker serves {sorted(self.rewards)}"}
            r = self.rewards[name]
            return 200, {"status": "ok", "reward": r.name, "modalities": list(r.modalities),
                         "higher_is_better": r.higher_is_better, "requires_prompt": r.requires_prompt,
                         "max_request_items": self.max_request_items, "max_request_bytes": self.max_request_bytes}
        if self.token is not None:
            given = headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return 401, {"error": "missing or wrong bearer token (Authorization: Bearer <token>)"}
        if method != "POST" or route not in ("score", "compare") or name not in self.rewards:
            return 404, {"error": f"unknown route {method} {path}; use POST /NAME/score or /NAME/compare with NAME "
                                  f"one of {sorted(self.rewards)}"}
        try:
            length = headers.get("Content-Length")
            if length is None or not length.isdigit():
                return 411, {"error": "send the body with a Content-Length header"}
            if int(length) > self.max_request_bytes:
                raise RequestTooLargeError(f"request body of {length} bytes exceeds max_request_bytes="
                                           f"{self.max_request_bytes}")
            payload = parse_json_object(body.read(int(length)))
            reward = self.rewards[name]
            items = prepare_request(payload, route, reward, max_items=self.max_request_items,
                                    request_id=next(self._ids))
            if route == "score":
                def call(prompts, media):
                    return reward.score(prompts, media[0])
            else:
                def call(prompts, media):
                    return reward.compare(prompts, media[0], media[1])
            with self._locks[name]:
                results = score_items(items, call)
            out, status = merge_results(results)
            return status, out
        except Exception as exc:  # noqa: BLE001 - every failure is this request's JSON error
            return error_status(exc), {"error": error_message(exc)}


def load_worker_rewards(names: Sequence[str], options: Mapping[str, Mapping[str, Any]], device: str,
                        attention: str = "auto") -> dict[str, Reward]:
    """The rewards a worker serves, loaded as the trainer would (`diffusion_rl.rewards.load_reward`)."""
    from diffusion_rl.config import RewardConfig
    from diffusion_rl.reward_loading import load_reward

    rcfg = RewardConfig(rewards={n: 1.0 for n in names}, options={n: dict(options.get(n, {})) for n in names})
    return {n: load_reward(n, rcfg, device, attention) for n in names}


def _worker_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m diffusion_rl.remote_rewards worker",
                                description="serve rewards over loopback HTTP for a trainer (no Ray)")
    p.add_argument("--reward", action="append", required=True, help="a registered reward name (repeatable)")
    p.add_argument("--options", default="{}", help="JSON: reward name -> loader options")
    p.add_argument("--device", default="cpu")
    p.add_argument("--attention", default="auto")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    token = os.environ.get("MMREWARD_TOKEN") or None  # never on the command line, where `ps` shows it
    try:
        options = json.loads(args.options)
        if not isinstance(options, dict):
            raise ConfigError(f"--options must be a JSON object, got {args.options!r}")
        worker = RewardWorker(load_worker_rewards(args.reward, options, args.device, args.attention),
                              host=args.host, port=args.port, token=token)
    except (MMRewardError, ValueError, OSError) as exc:  # unknown reward, bad option, port taken: one line
        print(f"reward worker: {exc}", file=sys.stderr)
        return 2
    if token is None:
        print("reward worker: serving without a token (MMREWARD_TOKEN is not set)", file=sys.stderr)
    print(f"{READY} {worker.url}", flush=True)
    # nobody reads our stdout after this line: whatever a reward prints goes to stderr, so that a full pipe
    # can never block the worker
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        worker.server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


# ----------------------------------------------------------------------------------------------
# the local pool: worker processes the trainer starts and stops
# ----------------------------------------------------------------------------------------------
class LocalPool:
    """Worker processes on this machine: one per (device, replica slot), each serving every reward with a
    replica on that slot, so rewards on the same device share a process."""

    def __init__(self, specs: Mapping[str, RemoteSpec], options: Mapping[str, Mapping[str, Any]],
                 attention: str = "auto") -> None:
        self.token = new_token()
        slots: dict[tuple[str, int], list[str]] = {}
        for name, spec in specs.items():
            seen: dict[str, int] = {}
            for i in range(spec.replicas):
                dev = spec.devices[i % len(spec.devices)]
                slots.setdefault((dev, seen.get(dev, 0)), []).append(name)
                seen[dev] = seen.get(dev, 0) + 1
        self.procs: list[subprocess.Popen] = []
        self.urls: dict[str, list[str]] = {name: [] for name in specs}
        atexit.register(self.stop)
        try:
            started = [(self._spawn(names, dev, options, attention), names) for (dev, _), names in slots.items()]
            timeout = max(s.start_timeout_s for s in specs.values())
            for proc, names in started:
                base = self._wait_ready(proc, timeout, names)
                for n in names:
                    self.urls[n].append(f"{base}/{n}")
        except BaseException:
            self.stop()
            raise

    def _spawn(self, names: list[str], device: str, options: Mapping[str, Any], attention: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "diffusion_rl.remote_rewards", "worker", "--device", device,
               "--attention", attention, "--options", json.dumps({n: dict(options.get(n, {})) for n in names})]
        for n in names:
            cmd += ["--reward", n]
        env = {**os.environ, "MMREWARD_TOKEN": self.token}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
        self.procs.append(proc)
        return proc

    @staticmethod
    def _wait_ready(proc: subprocess.Popen, timeout: float, names: list[str]) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteRewardError(f"the reward worker for {names} did not start within {timeout:.0f} s "
                                        "(reward.remote.<name>.start_timeout_s); see its stderr above")
            ready, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
            if ready:
                line = proc.stdout.readline()
                if line.startswith(READY):
                    return line.split()[-1]
                if not line and proc.poll() is not None:
                    raise RemoteRewardError(f"the reward worker for {names} exited with code {proc.returncode} "
                                            "before serving; its error is on stderr above")
            elif proc.poll() is not None:
                raise RemoteRewardError(f"the reward worker for {names} exited with code {proc.returncode} "
                                        "before serving; its error is on stderr above")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()
        self.procs = []


def connect_remote_rewards(rcfg: Any, attention: str = "auto") -> dict[str, RemoteReward]:
    """name -> RemoteReward for every `reward.remote` entry of `rcfg` (a RewardConfig), starting the local
    pool's workers first when some entries have no url."""
    specs = parse_remote_specs(rcfg.remote)
    for name, spec in specs.items():
        if not spec.local and rcfg.options.get(name):
            raise ConfigError(f"reward.options.{name} cannot reach a reward served at {spec.urls[0]}: pass the "
                              f"options to the server (mmreward serve --option KEY=VALUE) and remove them here")
    local = {n: s for n, s in specs.items() if s.local}
    urls = {n: list(s.urls) for n, s in specs.items() if not s.local}
    token: dict[str, str | None] = {n: os.environ.get(s.token_env) or None for n, s in specs.items() if not s.local}
    owner: dict[str, LocalPool] = {}
    if local:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError(f"reward.remote: a local pool ({sorted(local)}: no url) would start one per training "
                              "process; start the server once (mmreward serve, or python -m diffusion_rl.remote_rewards "
                              "worker) and give its url instead")
        by_engine = {e: {n: s for n, s in local.items() if s.engine == e} for e in ("process", "ray")}
        if by_engine["process"]:
            pool = LocalPool(by_engine["process"], rcfg.options, attention)
            for n in by_engine["process"]:
                urls[n], token[n], owner[n] = pool.urls[n], pool.token, pool
        if by_engine["ray"]:
            ray_urls, ray_token = _start_ray_pool(by_engine["ray"], rcfg.options, attention)
            for n in by_engine["ray"]:
                urls[n], token[n] = [ray_urls[n]], ray_token
    out = {}
    for n, s in specs.items():
        out[n] = RemoteReward(n, urls[n], token[n], timeout_s=s.timeout_s, retries=s.retries, backoff_s=s.backoff_s,
                              request_items=s.request_items)
        if n in owner:
            out[n]._pool_owner = owner[n]  # the workers live as long as a reward that uses them
    return out


def _start_ray_pool(specs: Mapping[str, RemoteSpec], options: Mapping[str, Mapping[str, Any]],
                    attention: str) -> tuple[dict[str, str], str]:
    """The engine-'ray' entries as one Ray Serve server on loopback started from this process (`serve_rewards`):
    each reward its own application with `replicas` replicas of `num_gpus` GPUs and its `runtime_env`.
    Stopped when the trainer exits."""
    from mmreward.serve import ServeConfig, shutdown

    token = new_token()
    def device(s: RemoteSpec) -> str | None:  # the default 'cpu' means "the reward's own" when it gets a GPU
        return None if s.devices == ("cpu",) and s.num_gpus > 0 else s.devices[0]

    cfgs = [ServeConfig(reward=n, options={"attention": attention, **dict(options.get(n, {}))}, port=0, token=token,
                        num_replicas=s.replicas, num_gpus=s.num_gpus, runtime_env=s.runtime_env, device=device(s))
            for n, s in specs.items()]
    urls = serve_rewards(cfgs)
    atexit.register(shutdown)
    return urls, token


# ----------------------------------------------------------------------------------------------
# several rewards in one Ray Serve server
# ----------------------------------------------------------------------------------------------
def route_name(reward: str) -> str:
    """The URL path segment of a reward served next to others: its name, with anything but [A-Za-z0-9._-]
    replaced (a source such as pkg.module:Class has a colon)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", reward)


def serve_rewards(cfgs: Sequence[Any], *, ray_init: dict | None = None) -> dict[str, str]:
    """Several rewards behind one `mmreward serve` front end: each `ServeConfig` is its own Ray Serve
    application (its own replicas, GPU fraction, device and `runtime_env`), the first at the server's root
    and each at /NAME. Host, port, token and HTTP limits are the first config's. Returns reward -> URL.
    Stop with `mmreward.serve.shutdown()`."""
    from ray import serve

    from mmreward.serve import build_app, start

    if not cfgs:
        raise ConfigError("serve_rewards: give at least one ServeConfig")
    names = [route_name(c.reward) for c in cfgs]
    if len(set(names)) != len(names):
        raise ConfigError(f"serve_rewards: every reward must be served once, got {[c.reward for c in cfgs]}")
    url = start(cfgs[0], ray_init=ray_init)
    urls = {cfgs[0].reward: url}
    for i, (c, name) in enumerate(zip(cfgs[1:], names[1:]), 1):
        serve.run(build_app(c), name=f"mmreward-{i}", route_prefix=f"/{name}", blocking=False)
        urls[c.reward] = f"{url}/{name}"
    return urls


def _serve_main(argv: Sequence[str]) -> int:
    from mmreward.serve import ServeConfig

    p = argparse.ArgumentParser(prog="python -m diffusion_rl.remote_rewards serve",
                                description="several rewards in one mmreward serve server (Ray Serve)")
    p.add_argument("--reward", action="append", required=True, help="a registered reward name (repeatable)")
    p.add_argument("--options", default="{}", help="JSON: reward name -> loader options")
    p.add_argument("--runtime-env", default="{}", help="JSON: reward name -> Ray runtime_env of its replicas")
    p.add_argument("--device", default=None, help="device inside each replica (default: the reward's)")
    p.add_argument("--num-replicas", type=int, default=1)
    p.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica (a fraction shares one)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    try:
        options, envs = json.loads(args.options), json.loads(args.runtime_env)
        if not isinstance(options, dict) or not isinstance(envs, dict):
            raise ConfigError("--options and --runtime-env must be JSON objects keyed by reward name")
        token = os.environ.get("MMREWARD_TOKEN") or new_token()
        cfgs = [ServeConfig(reward=r, options=options.get(r, {}), runtime_env=envs.get(r), device=args.device,
                            num_replicas=args.num_replicas, num_gpus=args.num_gpus, host=args.host, port=args.port,
                            token=token) for r in args.reward]
    except (ConfigError, ValueError) as exc:
        print(f"reward server: {exc}", file=sys.stderr)
        return 2
    if not os.environ.get("MMREWARD_TOKEN"):
        print(f"reward server: generated bearer token: {token}", file=sys.stderr, flush=True)
    for reward, url in serve_rewards(cfgs).items():
        print(f"reward server: '{reward}' at {url}", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        from mmreward.serve import shutdown

        shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":
        return _worker_main(argv[1:])
    if argv and argv[0] == "serve":
        return _serve_main(argv[1:])
    print("usage: python -m diffusion_rl.remote_rewards {worker,serve} --reward NAME [--reward NAME ...] "
          "[--device cuda:7] [--port 8000]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
