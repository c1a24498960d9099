"""ShapesEditEval: the exact ShapesWorld edit checker as a reward (no weights).

Each item is an edited image, its instruction (a ShapesWorld edit: "make the circle blue", "turn the square
into a triangle", "add a circle") and its source image in the metadata ({"source_image": path or tensor},
what edit records carry). Images of different sizes are compared at the smaller size (area averaging). `mmreward.synthetic.edits.check_edits` detects the objects of both images and
checks the requested change, the other objects, the object count and the untouched background.
  mode="strict"  1 when every clause holds, else 0
  mode="partial" the fraction of the four clauses that hold
  mode="gated"   partial when the requested edit is there, else 0: a training reward for which leaving the
                 source untouched scores 0 (under "partial" it scores 0.75, a local optimum RL drifts to)
details: strict, partial and each clause (edit, preserved, no_extra, background) as 0/1.
"""

from __future__ import annotations

import torch

from mmreward.edit import source_image_list
from mmreward.errors import RewardInputError
from mmreward.types import Reward, RewardOutput

MODES = ("strict", "partial", "gated")


class ShapesEditEval(Reward):
    name = "shapes-edit-eval"
    accepts_metadata = True
    requires_prompt = True

    def __init__(self, mode: str = "strict", **kwargs) -> None:
        super().__init__(**kwargs)
        if mode not in MODES:
            raise RewardInputError(f"mode: expected one of {MODES}, got {mode!r}")
        self.mode = mode

    def _score(self, prompts, media, metadata=None):
        from mmreward.synthetic.edits import check_edits

        if isinstance(media, list):  # items of different sizes: one by one
            return RewardOutput.concat([self._score([p], m[None], metadata=[md]) for p, m, md in
                                        zip(prompts, media, metadata or [{}] * len(prompts))])
        srcs = source_image_list(metadata, len(prompts), self.name)
        # compare at the smaller of the two sizes, shrinking by area averaging (what the renderer's supersampling
        # does), so a 64-px edit of a 32-px source is checked like a 32-px one
        h = min([int(media.shape[-2])] + [int(s.shape[-2]) for s in srcs])
        w = min([int(media.shape[-1])] + [int(s.shape[-1]) for s in srcs])
        sources = torch.stack([_shrink(s[None].float(), h, w)[0] for s in srcs]).to(media.device)
        res = check_edits(list(prompts), sources, _shrink(media.float(), h, w))
        details = {"strict": res.strict, "partial": res.partial, **res.clauses}
        scores = {"strict": res.strict, "partial": res.partial, "gated": res.partial * res.clauses["edit"]}[self.mode]
        return RewardOutput(scores.to(torch.float32), details)


def _shrink(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    if tuple(x.shape[-2:]) == (h, w):
        return x
    return torch.nn.functional.interpolate(x, size=(h, w), mode="area").clamp(0, 1)


def load_shapes_edit_eval(checkpoint=None, *, weights="pretrained", mode: str = "strict",
                          micro_batch_size: int = 64) -> ShapesEditEval:
    if checkpoint is not None:
        raise RewardInputError("shapes-edit-eval has no weights; drop checkpoint=")
    return ShapesEditEval(mode=mode, micro_batch_size=micro_batch_size)
