"""The torch thread count of a build step, given back to the caller afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block on `count` torch threads and restore the caller's count, also when the block raises.

    A caller in the same process (another build step, a test session) must not inherit our pool size:
    oversubscribed threads made later small-op work several times slower on a busy 2-core machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
