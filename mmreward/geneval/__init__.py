"""GenEval compositional checking: prompts -> clauses, detections -> GenEval's accuracy, Flow-GRPO's strict and dense reward.

`prompt_parser` turns GenEval's prompt templates into a `CompositionSpec`; `evaluate` decides each
clause from a list of `Detection`s with GenEval's and Flow-GRPO's rules; `colors`/`clip_colors` name
object colours; detectors (`owlv2`, `grounding_dino`,
`shapesworld`) turn images and object names into detections.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class Detection:
    """One detected object: its class name, confidence, box (x1, y1, x2, y2) in pixels, if known its colour,
    and, from segmenting detectors, its mask ((H, W) bool, the image's size; GenEval's colour crops use it)."""

    label: str
    score: float
    box: tuple[float, float, float, float]
    color: str | None = None
    mask: Any = field(default=None, compare=False, repr=False)

    @staticmethod
    def from_any(d: Detection | Mapping[str, Any]) -> Detection:
        if isinstance(d, Detection):
            return d
        return Detection(
            str(d["label"]), float(d["score"]), tuple(float(v) for v in d["box"]), d.get("color"), d.get("mask")
        )


class Detector(Protocol):
    """Finds objects of the named classes: `names[i]` lists the class names wanted in image i."""

    def detect(self, images: torch.Tensor | list[torch.Tensor], names: Sequence[Sequence[str]]) -> list[list[Detection]]:
        ...
