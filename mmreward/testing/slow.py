"""A reward that takes its time, for measuring what overlapping or moving rewards buys.

`SleepingReward` scores exactly like the reward it wraps (`inner`, default `mock`) after sleeping
`sleep_s` per call plus `per_item_s` per item: a stand-in for a judge on another GPU or machine, whose time
is spent outside this Python interpreter (the sleep releases the GIL, as a CUDA kernel or an HTTP wait
does). Load it by source:
`mmreward.load("mmreward.testing.slow:SleepingReward", inner="shapes-eval", inner_options={"mode": "soft"})`.
"""

from __future__ import annotations

import time
from typing import Any

from mmreward.errors import ConfigError
from mmreward.types import Reward, RewardOutput


class SleepingReward(Reward):
    name = "sleeping"

    def __init__(self, inner: str = "mock", inner_options: dict[str, Any] | None = None, sleep_s: float = 0.1,
                 per_item_s: float = 0.0, micro_batch_size: int = 1024) -> None:
        import mmreward

        if not (sleep_s >= 0 and per_item_s >= 0):
            raise ConfigError(f"sleep_s and per_item_s must be >= 0, got {sleep_s} and {per_item_s}")
        super().__init__(micro_batch_size=micro_batch_size)
        self.inner = mmreward.load(inner, **(inner_options or {}))
        self.sleep_s, self.per_item_s = float(sleep_s), float(per_item_s)
        # the wrapped reward's contract, per instance (its scores are what this reward returns)
        self.name, self.modalities = f"sleeping-{self.inner.name}", self.inner.modalities
        self.higher_is_better, self.requires_prompt = self.inner.higher_is_better, self.inner.requires_prompt

    def _score(self, prompts: list[str], media: Any) -> RewardOutput:
        time.sleep(self.sleep_s + self.per_item_s * len(prompts))
        return self.inner.score(prompts, media)
