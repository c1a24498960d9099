"""LAION aesthetic predictor v2 (improved-aesthetic-predictor, "sac+logos+ava1-l14-linearMSE").

score = MLP(normalize(CLIP ViT-L/14 image embedding)) on the AVA 1-10 scale. The head is five Linear
layers without activations (dropout between them), keys layers.{0,2,4,6,7}; the official .pth was
saved on CUDA and is read with map_location="cpu". The backbone is OpenAI's ViT-L/14 in the
transformers layout (openai/clip-vit-large-patch14), or any folder holding config.json + weights next
to the head file. The reference predictor preprocesses with OpenAI CLIP's torchvision pipeline, so the
crop offset is rounded and RGBA images are resized (premultiplied) before alpha is dropped;
crop_rounding="floor" reproduces DDPO/TRL's CLIPProcessor variant instead (offset floored, alpha dropped
first).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from mmreward.types import Reward, RewardOutput

HEAD_FILE = "sac+logos+ava1-l14-linearMSE.pth"
BACKBONE_REPO = "openai/clip-vit-large-patch14"


class AestheticHead(nn.Module):
    """The predictor's MLP: Linear(d, 1024), Dropout, Linear(1024, 128), Dropout, Linear(128, 64), Dropout,
    Linear(64, 16), Linear(16, 1) (its ReLUs are commented out in the reference)."""

    def __init__(self, input_size: int = 768) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024), nn.Dropout(0.2),
            nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Aesthetic(Reward):
    name = "aesthetic"
    differentiable = True
    requires_prompt = False
    # Precision: the CLIP tower may run in bf16; the L2 norm and the MLP head, whose output is the score,
    # run in fp32 (a bf16 head output alone is off by 0.4% of the score, more than the batch's spread).
    keep_fp32 = ("head",)

    def __init__(self, backbone, head: AestheticHead, micro_batch_size: int = 32) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
        self.backbone = backbone
        self.head = head

    def _score(self, prompts: list[str], media) -> RewardOutput:
        emb = F.normalize(self.backbone.image_features(media).float(), dim=-1)
        return RewardOutput(self.head(emb).squeeze(-1))

    @property
    def image_alpha(self) -> str:
        return self.backbone.preprocess.alpha


def load_aesthetic(
    checkpoint: str | None,
    *,
    weights: str = "pretrained",
    backbone: str | None = None,
    config: dict[str, Any] | None = None,
    crop_rounding: Literal["round", "floor"] = "round",
    resize_backend: Literal["pil", "torch"] = "pil",
    micro_batch_size: int = 32,
) -> Aesthetic:
    """checkpoint: the head file, or a folder/repo holding it (and optionally the CLIP backbone files)."""
    from pathlib import Path

    from mmreward.backbones import clip as cb
    from mmreward.checkpoints import load_state_dict, load_strict, resolve_files

    # OpenAI CLIP's preprocess converts to RGB after resizing; the CLIPProcessor variant before
    alpha = "resize_then_drop" if crop_rounding == "round" else "drop_first"
    if weights == "random":
        net = cb.build_hf_backbone(checkpoint if backbone is None else backbone, weights="random", config=config,
                                   crop_rounding=crop_rounding, resize_backend=resize_backend, alpha=alpha)
        head = AestheticHead(net.model.config.projection_dim)
        return Aesthetic(net, head.eval(), micro_batch_size=micro_batch_size)
    path = Path(str(checkpoint)).expanduser()
    head_file = path if path.is_file() else resolve_files(str(checkpoint), [HEAD_FILE])[HEAD_FILE]
    if backbone is None:
        backbone = str(path) if path.is_dir() and (path / "config.json").exists() else BACKBONE_REPO
    net = cb.build_hf_backbone(backbone, weights="pretrained", crop_rounding=crop_rounding,
                               resize_backend=resize_backend, alpha=alpha)
    sd = load_state_dict(head_file)
    head = AestheticHead(int(sd["layers.0.weight"].shape[1]) if "layers.0.weight" in sd else 768)
    load_strict(head, sd, str(head_file))
    return Aesthetic(net, head.float().eval(), micro_batch_size=micro_batch_size)
