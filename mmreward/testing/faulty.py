"""A reward that fails on demand, for testing that a server or trainer isolates failures.

`FaultyMockReward` scores exactly like the `mock` reward, except that a prompt containing
"raise-untyped" makes the whole reward call raise a plain RuntimeError (an untyped bug), and one
containing "nan-score" gives that item a NaN score (which `Reward.score` turns into a RewardValueError
for the whole call). Load it by source: `mmreward.load("mmreward.testing.faulty:FaultyMockReward")`.
"""

from __future__ import annotations

from mmreward.models.mock import MockReward
from mmreward.types import RewardOutput

RAISE = "raise-untyped"
NAN = "nan-score"


class FaultyMockReward(MockReward):
    name = "faulty-mock"

    def _score(self, prompts, media) -> RewardOutput:
        if any(RAISE in p for p in prompts):
            raise RuntimeError(f"FaultyMockReward: a prompt contains {RAISE!r}")
        out = super()._score(prompts, media)
        bad = [i for i, p in enumerate(prompts) if NAN in p]
        if bad:
            out.scores = out.scores.clone()
            out.scores[bad] = float("nan")
        return out
