"""Counter-based seeds: every random draw is keyed by what it is for, never by how many draws came before.

A seed that is a hash of counters (seed, iteration, prompt slot, sample, step, ...) makes a run independent
of the batch layout, the number of processes and whether it was resumed. Both hashes below fold their
counters with the same SplitMix64 step; they differ only in their starting value and in how they drop to
63 bits, and each keeps the exact numbers its users were built with:

- `noise_key` — the training side (rollouts, prompt draws, SDE windows, trained steps, DRaFT's K);
- `mix_seed` — the inference side (ReNO, best-of-N, noise exploration, experiment seeds).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _splitmix64(z: int) -> int:
    z = (z + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _fold(start: int, counters: Sequence[int]) -> int:
    h = start
    for c in counters:
        h = _splitmix64(h ^ (int(c) & _MASK64))
    return h


def noise_key(*counters: int) -> int:
    """A 63-bit seed that depends on every counter (order matters); collisions are astronomically unlikely."""
    return _fold(0x6A09E667F3BCC909, counters) >> 1


def mix_seed(*parts: int) -> int:
    """SplitMix64 of a tuple of integers: a counter-based seed, so sample (prompt p, index i) gets the same
    noise whatever the batch size or the number of samples drawn next to it."""
    return _fold(_GOLDEN, parts) & ((1 << 63) - 1)


def counter_noise(
    shape: Sequence[int],
    seed: int,
    epoch: int,
    prompt_ids: Sequence[int],
    sample_ids: Sequence[int],
    step: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Standard normal noise of shape (B, *shape); row b depends only on (seed, epoch, prompt_ids[b], sample_ids[b], step)."""
    rows = []
    gen = torch.Generator(device="cpu")
    for p, i in zip(prompt_ids, sample_ids):
        gen.manual_seed(noise_key(seed, epoch, p, i, step))
        rows.append(torch.randn(tuple(shape), generator=gen))
    return torch.stack(rows).to(device)
