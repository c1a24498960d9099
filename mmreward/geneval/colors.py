"""Colour of a detected object from its pixels, for detectors that do not report colour.

GenEval classifies colour with CLIP ViT-L/14 zero-shot on the object's masked crop
(`mmreward.geneval.clip_colors`, the geneval reward's default). `HSVColors` is the named alternative
`colors="hsv"`: the median colour of the box's central half, named by hue, saturation and value
(thresholds tuned on saturated renders: a heuristic, not GenEval's classifier; no model needed).
"""

from __future__ import annotations

import colorsys
from collections.abc import Sequence

import torch

from mmreward.geneval import Detection

HUE_NAMES = ((15, "red"), (40, "orange"), (70, "yellow"), (165, "green"), (255, "blue"), (290, "purple"), (335, "pink"))


def name_color(rgb: tuple[float, float, float]) -> str:
    """A GenEval colour name for an RGB triple in [0, 1]."""
    h, s, v = colorsys.rgb_to_hsv(*rgb)
    if v < 0.2:
        return "black"
    if s < 0.2:
        return "white" if v > 0.75 else "gray"
    hue = h * 360
    for bound, name in HUE_NAMES:
        if hue < bound:
            if name == "orange" and v < 0.6:
                return "brown"
            return name
    return "red"


def box_color(image: torch.Tensor, box: tuple[float, float, float, float]) -> str:
    """Colour name of the central half of a (3, H, W) image's box (x1, y1, x2, y2) in pixels."""
    h, w = image.shape[-2:]
    x1, y1, x2, y2 = box
    cx, cy, bw, bh = (x1 + x2) / 2, (y1 + y2) / 2, max(x2 - x1, 1.0), max(y2 - y1, 1.0)
    # boxes may reach past the image (padding, regression overshoot): keep at least one pixel inside
    left = min(max(int(cx - bw / 4), 0), w - 1)
    top = min(max(int(cy - bh / 4), 0), h - 1)
    right = min(max(int(cx + bw / 4), left + 1), w)
    bottom = min(max(int(cy + bh / 4), top + 1), h)
    region = image[:, top:bottom, left:right].reshape(3, -1).float()
    median = region.median(dim=1).values.clamp(0, 1).tolist()
    return name_color(tuple(median))


class HSVColors:
    """The HSV heuristic behind the colour-classifier interface `classify(image, objects, name)`."""

    def classify(self, image: torch.Tensor, objects: Sequence[Detection], name: str) -> list[str]:
        return [box_color(image, d.box) for d in objects]
