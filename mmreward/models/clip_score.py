"""CLIPScore: image-text cosine similarity of a CLIP model, in the two published conventions.

- convention="torchmetrics": `max(100 * cos, 0)` per sample. torchmetrics' CLIPScore has the same
  scale but clamps the batch mean; we clamp each sample so that scores do not depend on the batch.
- convention="clip-s": Hessel et al. (2021) CLIP-S `2.5 * max(cos, 0)`, with the paper's text prefix
  "A photo depicts " prepended to each prompt (set text_prefix="" to drop it).

Backbones: transformers CLIPModel folders/repos (torchmetrics' default openai/clip-vit-large-patch14;
Hugging Face processor preprocessing, crop offset floored, alpha dropped first) or open_clip models (hub
layout open_clip_config.json + weights, or a weights file with model_name=...; torchvision preprocessing,
crop offset rounded, RGBA resized premultiplied before alpha is dropped).
"""

from __future__ import annotations

from typing import Any, Literal

import torch.nn.functional as F

from mmreward.catalog import TINY_CLIP_CONFIG as TINY_CLIP_CONFIG  # demos and tests build tiny CLIPs from it
from mmreward.errors import ConfigError
from mmreward.types import Reward, RewardOutput

CLIP_S_PREFIX = "A photo depicts "


class ClipScore(Reward):
    name = "clipscore"
    differentiable = True

    def __init__(
        self,
        backbone,
        convention: Literal["torchmetrics", "clip-s"] = "torchmetrics",
        text_prefix: str | None = None,
        micro_batch_size: int = 32,
    ) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
        if convention not in ("torchmetrics", "clip-s"):
            raise ConfigError(f"convention: expected 'torchmetrics' or 'clip-s', got {convention!r}")
        self.backbone = backbone
        self.convention = convention
        self.text_prefix = text_prefix if text_prefix is not None else (CLIP_S_PREFIX if convention == "clip-s" else "")
        # one unit of logit per 0.01 of cosine in both conventions
        self.compare_temperature = 1.0 if convention == "torchmetrics" else 0.025

    def _score(self, prompts: list[str], media) -> RewardOutput:
        img = F.normalize(self.backbone.image_features(media).float(), dim=-1)
        txt = F.normalize(self.backbone.text_features([self.text_prefix + p for p in prompts]).float(), dim=-1)
        cos = (img * txt).sum(dim=-1)
        scores = (100.0 * cos).clamp(min=0.0) if self.convention == "torchmetrics" else 2.5 * cos.clamp(min=0.0)
        return RewardOutput(scores, {"cosine": cos})

    @property
    def image_alpha(self) -> str:
        return self.backbone.preprocess.alpha


def load_clipscore(
    checkpoint: str | None,
    *,
    weights: str = "pretrained",
    convention: Literal["torchmetrics", "clip-s"] = "torchmetrics",
    backbone: Literal["auto", "transformers", "open_clip"] = "auto",
    text_prefix: str | None = None,
    tokenizer: str | None = None,
    config: dict[str, Any] | None = None,
    model_name: str | None = None,
    model_cfg: dict[str, Any] | None = None,
    crop_rounding: Literal["round", "floor"] | None = None,
    resize_backend: Literal["pil", "torch"] = "pil",
    cache_size: int = 4096,
    seed: int | None = None,
    micro_batch_size: int = 32,
) -> ClipScore:
    from mmreward.backbones import clip as cb

    if backbone == "auto":
        if model_name or model_cfg:
            backbone = "open_clip"
        elif config is not None:
            backbone = "transformers"
        else:
            backbone = "open_clip" if cb.has_files(checkpoint, (cb.OPEN_CLIP_CONFIG,)) else "transformers"
    if backbone == "open_clip":
        net = cb.build_open_clip_backbone(
            checkpoint, weights=weights, model_name=model_name, model_cfg=model_cfg,
            resize_backend=resize_backend, cache_size=cache_size,
        )
        if crop_rounding is not None:
            net.preprocess = _with(net.preprocess, crop_rounding=crop_rounding)
    elif backbone == "transformers":
        net = cb.build_hf_backbone(
            checkpoint, weights=weights, tokenizer=tokenizer, config=config,
            crop_rounding=crop_rounding or "floor", resize_backend=resize_backend, cache_size=cache_size,
            seed=seed,
        )
    else:
        raise ConfigError(f"backbone: expected 'auto', 'transformers' or 'open_clip', got {backbone!r}")
    return ClipScore(net, convention=convention, text_prefix=text_prefix, micro_batch_size=micro_batch_size)


def _with(card, **changes):
    import dataclasses

    return dataclasses.replace(card, **changes)
