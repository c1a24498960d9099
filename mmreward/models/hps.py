"""HPSv2 and HPSv2.1 (Wu et al., 2023): open_clip ViT-H-14 fine-tuned on human preference pairs.

score = cos(image, prompt), without the logit scale (hpsv2.score returns image_features @ text_features).
The official files `HPS_v2_compressed.pt` / `HPS_v2.1_compressed.pt` (hub repo xswu/HPSv2) hold
{'state_dict': fp16 tensors} of the whole model in open_clip's CLIP key layout; they are loaded
strictly into a ViT-H-14 built from config, so no base weights are downloaded.

Preprocessing (HPSv2's preprocess_val): convert to RGB, ToTensor, then resize the longer side to 224
(bicubic; torchvision on float tensors, hence antialiased) and zero-pad centred to 224x224, OpenAI CLIP
mean/std. Because the reference itself resizes float tensors, our scoring and differentiable paths are
the same computation. Two deviations, both where the reference fails: images whose longer side is
already 224 but are not square are padded (the reference skips padding and then cannot run them), and
RGBA input is reduced to RGB before anything else (alpha: drop_first). HPSv2's `_convert_to_rgb_or_rgba`
keeps RGBA, its ToTensor makes 4 channels and its 3-channel patch embedding then raises, so the original
has no score for any RGBA image; dropping alpha first is what its RGB path does for the converted image.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn.functional as F

from mmreward.types import Reward, RewardOutput

FILES = {"hpsv2": "HPS_v2_compressed.pt", "hpsv2.1": "HPS_v2.1_compressed.pt"}


class HPSv2(Reward):
    name = "hpsv2"
    differentiable = True
    compare_temperature = 0.01  # the logit scale (100) HPS was trained with

    def __init__(self, backbone, micro_batch_size: int = 32) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
        self.backbone = backbone

    def _score(self, prompts: list[str], media) -> RewardOutput:
        img = F.normalize(self.backbone.image_features(media).float(), dim=-1)
        txt = F.normalize(self.backbone.text_features(prompts).float(), dim=-1)
        return RewardOutput((img * txt).sum(dim=-1))

    @property
    def image_alpha(self) -> str:
        return self.backbone.preprocess.alpha


def _load(
    checkpoint: str | None,
    filename: str,
    *,
    weights: str = "pretrained",
    model_cfg: dict[str, Any] | None = None,
    cache_size: int = 4096,
    micro_batch_size: int = 32,
) -> HPSv2:
    import open_clip

    from mmreward.backbones import clip as cb
    from mmreward.checkpoints import resolve_files

    cfg = model_cfg or open_clip.get_model_config("ViT-H-14")
    model = cb.build_open_clip_model(cfg)
    if weights == "pretrained":
        path = Path(str(checkpoint)).expanduser()
        weight_file = path if path.is_file() else resolve_files(str(checkpoint), [filename])[filename]
        sd_model = model
        cb.load_open_clip_weights(sd_model, weight_file, key="state_dict")
    pre = cb.open_clip_preprocess(model, None, "torch", mode="longest-pad", alpha="drop_first")
    net = cb.OpenClipBackbone(model, cb.open_clip_tokenizer(cfg), pre, cache_size)
    reward = HPSv2(net, micro_batch_size=micro_batch_size)
    return reward


def load_hpsv2(
    checkpoint: str | None,
    *,
    weights: str = "pretrained",
    filename: str = FILES["hpsv2"],
    model_cfg: dict[str, Any] | None = None,
    cache_size: int = 4096,
    micro_batch_size: int = 32,
) -> HPSv2:
    return _load(checkpoint, filename, weights=weights, model_cfg=model_cfg, cache_size=cache_size,
                 micro_batch_size=micro_batch_size)


def load_hpsv2_1(
    checkpoint: str | None,
    *,
    weights: str = "pretrained",
    filename: str = FILES["hpsv2.1"],
    model_cfg: dict[str, Any] | None = None,
    cache_size: int = 4096,
    micro_batch_size: int = 32,
) -> HPSv2:
    reward = _load(checkpoint, filename, weights=weights, model_cfg=model_cfg, cache_size=cache_size,
                   micro_batch_size=micro_batch_size)
    reward.name = "hpsv2.1"
    return reward
