"""accelerate's gather semantics for W threads, so a collective function runs as W processes would run it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class ThreadAccelerator:
    """`gather` concatenates every thread's tensor in rank order, as accelerate's all-gather does."""

    def __init__(self, rank: int, world: int, board: list, barrier: threading.Barrier) -> None:
        self.process_index, self.num_processes, self.device = rank, world, torch.device("cpu")
        self.board, self.barrier = board, barrier

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        self.board[self.process_index] = t.clone()
        self.barrier.wait()
        out = torch.cat(list(self.board))
        self.barrier.wait()  # nobody overwrites the board before everyone has read it
        return out


def run_threads(world: int, work: Callable[[ThreadAccelerator], Any]) -> list[Any]:
    """`work(accelerator)` on `world` threads, one accelerator each; their results in rank order (the first
    error is re-raised here)."""
    board: list = [None] * world
    barrier = threading.Barrier(world)
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = work(ThreadAccelerator(rank, world, board, barrier))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
