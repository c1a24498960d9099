"""Checks the diffusion_rl algorithm tests share (tests/diffusion_rl/test_algorithm_*.py).

- `tiny_video`: the geometry the video checks run the tiny Wan pipeline at;
- `train_one_iteration`: one `train_iteration(0)`, asserting it moved the trainable weights;
- `assert_resumed_equals_straight`: a run checkpointed after 1 iteration and resumed equals an uninterrupted run,
  bit for bit (parameters and every logged metric but wall-clock times).

Each test keeps its own config and its algorithm's own assertions on the metrics.
"""

from __future__ import annotations

from typing import Any

import torch


def tiny_video(cfg: Any) -> Any:
    """`cfg` (a tiny Wan run's config) at 32 x 32 pixels, 9 frames (3 latent frames) and 16 text tokens."""
    cfg.model.height = cfg.model.width = 32
    cfg.model.num_frames, cfg.model.max_sequence_length = 9, 16
    return cfg


def train_one_iteration(trainer: Any) -> dict:
    """`trainer.train_iteration(0)`'s metrics, after asserting that it changed at least one trainable tensor."""
    before = [p.detach().clone() for p in trainer.trainable]
    metrics = trainer.train_iteration(0)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.trainable, strict=True)), "no weight moved"
    return metrics


def without_times(history: list[dict]) -> list[dict]:
    """The logged metrics without the wall-clock `time/*` entries (the only ones a resume may change)."""
    return [{k: v for k, v in h.items() if not k.startswith("time/")} for h in history]


def assert_resumed_equals_straight(straight: Any, resumed: Any) -> None:
    """The same trainable tensors, bit for bit, and the same metrics (times aside) in both runs' histories."""
    for a, b in zip(straight.trainable, resumed.trainable, strict=True):
        assert torch.equal(a, b)
    assert without_times(resumed.history) == without_times(straight.history)
