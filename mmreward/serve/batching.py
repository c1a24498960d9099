"""Items of concurrent requests merged into reward calls and isolated on failure; metrics; the MicroBatcher."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from mmreward.serve.wire import Item, _output_json, error_message, error_status
from mmreward.types import PairwiseOutput, RewardOutput

_log = logging.getLogger("mmreward.serve")


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
