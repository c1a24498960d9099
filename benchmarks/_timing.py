"""Timing and peak-memory helpers shared by the benchmark scripts.

CUDA work is asynchronous, so every timed region ends with `torch.cuda.synchronize`; peak memory on CUDA is
`torch.cuda.max_memory_allocated` above what was allocated before the call. On CPU there is no allocator
counter, so the peak is the process's resident set size (RSS, read from /proc/self/statm, or psutil where
/proc is missing) sampled every millisecond by a thread during the call, above the RSS just before it; freed
heap pages are handed back to the OS first (glibc `malloc_trim`), so the call must fault its working set in again.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], repeats: int, device: torch.device | str = "cpu", reduce: str = "median") -> float:
    """Seconds per call of `fn` after one warm-up call (allocations, caches, lazy kernels): the median or the
    minimum of `repeats` calls."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return min(times) if reduce == "min" else statistics.median(times)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss


def _trim_heap() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def memory_metric(device: torch.device | str) -> str:
    if torch.device(device).type == "cuda":
        return "torch.cuda.max_memory_allocated above the allocation before the call"
    return "peak process RSS (sampled every 1 ms) above the RSS before the call, after malloc_trim"


def peak_memory_mb(fn: Callable[[], object], device: torch.device | str = "cpu") -> float:
    """Peak memory one call of `fn` adds, in MiB (see the module docstring for what is counted where)."""
    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    _trim_heap()
    base = _rss_bytes()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
        peak[0] = max(peak[0], _rss_bytes())
    finally:
        done.set()
        thread.join()
    return (peak[0] - base) / 2**20


def linear_fit_deviation(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    """|y - y_fit| / y for the least-squares line y_fit = a + b x through the points: how far each measured
    point sits from linear growth, relative to the measurement."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"need >= 2 points with one y per x, got {len(xs)} xs and {len(ys)} ys")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    return [abs(y - (a + b * x)) / abs(y) if y else float("inf") for x, y in zip(xs, ys)]
