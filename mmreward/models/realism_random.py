"""Small random-weight synthetic-image detectors: what weights="random" builds when no checkpoint names one.

realism-classifier has no default checkpoint to take a config from, and UnivFD's CLIP ViT-L/14 would cost
seconds to initialise, so their random geometries are small and fixed here (plain data):

- an image classifier folder: config.json (with id2label) + model.safetensors + preprocessor_config.json,
  as `save_pretrained` writes it for hub detectors;
- UNIVFD_RANDOM_BACKBONE: the CLIPConfig of the CLIP backbone a random UnivFD probes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import torch

DEFAULT_ID2LABEL = {0: "fake", 1: "real"}


def tiny_image_classifier_config(
    arch: Literal["vit", "convnext"] = "vit", id2label: dict[int, str] | None = None, image_size: int = 32
):
    from transformers import ConvNextConfig, ViTConfig

    id2label = dict(id2label or DEFAULT_ID2LABEL)
    labels = {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}}
    if arch == "vit":
        return ViTConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=image_size,
            patch_size=8, **labels,
        )  # fmt: skip
    if arch == "convnext":
        return ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, **labels)
    raise ValueError(f"arch must be 'vit' or 'convnext', got {arch!r}")


def save_tiny_image_classifier(
    folder: str | os.PathLike,
    *,
    arch: Literal["vit", "convnext"] = "vit",
    id2label: dict[int, str] | None = None,
    image_size: int = 32,
    seed: int = 0,
) -> Path:
    """A random AutoModelForImageClassification checkpoint with its image processor, in the hub layout."""
    from transformers import (
        AutoModelForImageClassification,
        ConvNextImageProcessor,
        ViTImageProcessor,
    )

    out = Path(folder)
    torch.manual_seed(seed)
    model = AutoModelForImageClassification.from_config(tiny_image_classifier_config(arch, id2label, image_size)).eval()
    # random heads start near zero: widen them so probabilities differ visibly between images
    with torch.no_grad():
        model.classifier.weight.mul_(20.0)
    if arch == "vit":
        processor = ViTImageProcessor(size={"height": image_size, "width": image_size})
    else:  # below 384 px ConvNeXt resizes the shorter side to size / crop_pct, then centre-crops
        processor = ConvNextImageProcessor(size={"shortest_edge": image_size}, crop_pct=0.875)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


# CLIP ViT-B/32 geometry scaled down (CLIP's real vocabulary, so the real tokenizer fits it)
UNIVFD_RANDOM_BACKBONE: dict = {
    "projection_dim": 16,
    "text_config": {
        "vocab_size": 49408, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 77, "bos_token_id": 49406,
        "eos_token_id": 49407, "pad_token_id": 49407,
    },
    "vision_config": {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "image_size": 224, "patch_size": 32,
    },
}
