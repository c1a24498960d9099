"""ShapesVideoEval: the exact checker of moving-shapes clips as a video reward (no weights).

Each prompt is parsed into a motion spec (see mmreward.synthetic.motion); each (T, 3, H, W) clip is checked
frame by frame with ShapesWorld's analytic detector and the box-centre track of every object is fitted by
least squares. Scores:
  mode="strict"  1 when every clause holds (each object present once per frame, right colour per frame,
                 right direction and speed; the right number of objects in every frame), else 0
  mode="partial" the fraction of clauses that hold
  mode="soft"    partial with each motion clause scored by how close the fitted velocity is to the stated one,
                 exp(-(error / 1 px per frame)^2) (0 when the object is not found once per frame): dense for RL
  mode="motion"  the motion clauses alone, each scored by that closeness (a reward on motion only: shape, colour
                 and count enter only through tracking, which needs each object found once per frame)
details: strict, partial, soft, motion_soft and, per clause kind (object, color, motion, count), the fraction
that hold.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from mmreward.models.shapes_eval import ShapesEvalReward
from mmreward.types import RewardOutput


@lru_cache(maxsize=4096)
def _parse(prompt: str):
    from mmreward.synthetic.motion import parse_motion_prompt

    return parse_motion_prompt(prompt)


class ShapesVideoEvalReward(ShapesEvalReward):
    """The same modes and unknown-prompt policy as shapes-eval, on clips."""

    name = "shapes-video-eval"
    modalities = ("video",)
    modes = ("strict", "partial", "soft", "motion")

    def _score(self, prompts, media):
        from mmreward.synthetic.captions import PromptParseError
        from mmreward.synthetic.motion import check_clips

        if isinstance(media, list):  # clips of different sizes or lengths: check one by one
            return RewardOutput.concat([self._score([p], m[None]) for p, m in zip(prompts, media)])
        specs, known = [], []
        for p in prompts:
            try:
                specs.append(_parse(p))
                known.append(True)
            except PromptParseError:
                if self.unknown_prompt == "error":
                    raise
                specs.append(_parse("a red circle moving left"))  # placeholder, masked to NaN below
                known.append(False)
        result = check_clips(specs, media)
        mask = torch.tensor(known)
        nan = torch.tensor(float("nan"))
        details = {"strict": result.strict, "partial": result.partial, "soft": result.soft,
                   "motion_soft": result.motion_soft, **result.by_kind}
        details = {k: torch.where(mask, v, nan) for k, v in details.items()}
        return RewardOutput(details["motion_soft" if self.mode == "motion" else self.mode].clone(), details)


def load_shapes_video_eval(checkpoint=None, *, weights="pretrained", **options) -> ShapesVideoEvalReward:
    return ShapesVideoEvalReward(**options)
