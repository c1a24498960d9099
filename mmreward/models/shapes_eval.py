"""ShapesEval: the exact GenEval-style checker of ShapesWorld as a reward (no weights).

Each prompt is parsed into a structured spec (objects, counts, colours, relation); each image is
checked by analytic detection (see mmreward.synthetic.checker). Scores:
  mode="strict"  1 when every clause holds, else 0 (GenEval's accuracy)
  mode="partial" the fraction of clauses that hold
  mode="soft"    a dense variant: each clause scores the shape posterior of its best detections
details: strict, partial, soft and, per clause kind (object, count, color, position), the fraction
that hold (NaN when the prompt has no clause of that kind).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from mmreward.errors import RewardInputError
from mmreward.types import Reward, RewardOutput

MODES = ("strict", "partial", "soft")


@lru_cache(maxsize=4096)
def _parse(prompt: str):
    from mmreward.synthetic.captions import parse_prompt

    return parse_prompt(prompt)


class ShapesEvalReward(Reward):
    name = "shapes-eval"
    differentiable = False
    modes: tuple[str, ...] = MODES

    def __init__(self, mode: str = "strict", unknown_prompt: str = "error", **kwargs) -> None:
        super().__init__(**kwargs)
        if mode not in self.modes:
            raise RewardInputError(f"mode: expected one of {self.modes}, got {mode!r}")
        if unknown_prompt not in ("error", "nan"):
            raise RewardInputError(f"unknown_prompt: expected 'error' or 'nan', got {unknown_prompt!r}")
        self.mode = mode
        self.unknown_prompt = unknown_prompt
        # prompts outside ShapesWorld score NaN only when the user asked for it
        self.may_return_nan = unknown_prompt == "nan"

    def _score(self, prompts, media):
        from mmreward.synthetic.captions import PromptParseError
        from mmreward.synthetic.checker import check, detect

        if isinstance(media, list):  # items of different sizes: check one by one
            return RewardOutput.concat([self._score([p], m[None]) for p, m in zip(prompts, media)])
        specs, known = [], []
        for p in prompts:
            try:
                specs.append(_parse(p))
                known.append(True)
            except PromptParseError:
                if self.unknown_prompt == "error":
                    raise
                specs.append(_parse("a circle"))  # placeholder, masked to NaN below
                known.append(False)
        detections = detect(media)
        result = check(specs, detections)
        mask = torch.tensor(known)
        nan = torch.tensor(float("nan"))
        details = {"strict": result.strict, "partial": result.partial, "soft": result.soft, **result.by_kind}
        details = {k: torch.where(mask, v, nan) for k, v in details.items()}
        # an image with no objects (a uniform grey sample) scores 0 on every clause; this says why
        found = torch.bincount(detections.image, minlength=len(prompts)).float()
        details["objects_found"] = found
        rationales = ["no objects detected" if n == 0 else "" for n in found.tolist()]
        return RewardOutput(details[self.mode].clone(), details, rationales)


def load_shapes_eval(checkpoint=None, *, weights="pretrained", **options) -> ShapesEvalReward:
    return ShapesEvalReward(**options)
