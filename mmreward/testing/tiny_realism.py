"""Tiny random synthetic-image detectors written in their official formats, for tests.

- a transformers image classifier folder (re-exported from `mmreward.models.realism_random`, where
  weights="random" builds it);
- UnivFD: a CLIP vision backbone (transformers CLIPModel folder) and `fc_weights.pth`, the
  {'weight', 'bias'} state dict of the linear probe that UnivFD's repository ships.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from mmreward.models.realism_random import (
    DEFAULT_ID2LABEL,
    save_tiny_image_classifier,
    tiny_image_classifier_config,
)

__all__ = [
    "DEFAULT_ID2LABEL",
    "save_tiny_image_classifier",
    "save_tiny_univfd",
    "tiny_clip_vision_config",
    "tiny_image_classifier_config",
]


def tiny_clip_vision_config(image_size: int = 224, patch_size: int = 32) -> dict:
    """A tiny transformers CLIPConfig (as a dict) for the CLIP-feature probes."""
    from mmreward.testing.tiny_models import tiny_clip_config

    return tiny_clip_config(image_size=image_size, patch_size=patch_size).to_dict()


def save_tiny_univfd(folder: str | os.PathLike, *, seed: int = 0, fc_outputs: int = 1) -> tuple[Path, Path]:
    """(backbone folder, fc_weights.pth): a tiny CLIPModel and a linear probe on its projected image features."""
    from transformers import CLIPConfig, CLIPModel

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    clip = CLIPModel(CLIPConfig(**tiny_clip_vision_config())).eval()
    clip.save_pretrained(out / "clip")
    fc = torch.nn.Linear(clip.config.projection_dim, fc_outputs)
    torch.save({k: v.clone() for k, v in fc.state_dict().items()}, out / "fc_weights.pth")
    return out / "clip", out / "fc_weights.pth"
