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

from mmreward.errors import ConfigError
from mmreward.registry import RewardSpec
from mmreward.types import Reward, RewardOutput

CLIP_S_PREFIX = "A photo depicts "

TINY_CLIP_CONFIG: dict[str, Any] = {
    "projection_dim": 16,
    "text_config": {
        "vocab_size": 49408, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 77, "bos_token_id": 49406,
        "eos_token_id": 49407, "pad_token_id": 49407,
    },
    "vision_config": {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "image_size": 32, "patch_size": 8,
    },
}

SPECS = [
    RewardSpec(
        name="clipscore",
        loader="mmreward.models.clip_score:load_clipscore",
        description="CLIPScore: 100*cos clamped per sample (torchmetrics scale) or CLIP-S 2.5*max(cos, 0)",
        differentiable=True,
        default_checkpoint="openai/clip-vit-large-patch14",
        tags={
            "openai-l14": "openai/clip-vit-large-patch14",
            "openai-b32": "openai/clip-vit-base-patch32",
            "openai-b16": "openai/clip-vit-base-patch16",
            "laion-h14": "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
        },
        requires=("transformers", "open_clip"),
        score_range=(
            "torchmetrics: max(100*cos, 0) in [0, 100], about 15-35 for matching real pairs; "
            "clip-s: 2.5*max(cos, 0) in [0, 2.5], about 0.5-0.9. compare: Bradley-Terry on 100*delta(cos)"
        ),
        preprocess=(
            "transformers: RGB first (alpha: drop_first), resize shorter side 224 bicubic (Pillow on uint8), centre "
            "crop 224 (offset floored), OpenAI CLIP mean/std; open_clip: the same with the crop offset rounded and "
            "RGB after the crop (alpha: resize_then_drop)"
        ),
        # conformance compares the two paths to 1e-3; the Pillow-vs-torch deviation is measured in tests/test_zoo_*.
        # A fixed init seed whose cosines are mostly positive: the clamp would make an all-negative draw constant.
        tiny_options={"config": TINY_CLIP_CONFIG, "resize_backend": "torch", "seed": 2},
    )
]


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
    from mmreward.models import _clip_backbone as cb

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
