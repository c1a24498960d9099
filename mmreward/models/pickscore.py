"""PickScore (Kirstain et al., 2023): a CLIP ViT-H-14 fine-tuned on Pick-a-Pic preferences.

score = exp(logit_scale) * cos(image, prompt). Preferences between candidates of one prompt are the
softmax of their scores (`rank`); for a pair that softmax is sigmoid(s_a - s_b), which is what
`compare` returns (Bradley-Terry with temperature 1). The processor (preprocessing and tokenizer) lives
in the laion ViT-H-14 repo; a single local folder holding the model and the processor files works too.
Preprocessing is the Hugging Face CLIPImageProcessor's: Pillow bicubic, crop offset floored, and RGB
conversion first (alpha dropped; PickScore pins transformers 4.27, whose convert_to_rgb is PIL's
convert("RGB"); transformers 5 composites onto white instead).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F

from mmreward.types import Prompts, Reward, RewardOutput

PROCESSOR_REPO = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"


def group_softmax(scores: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """Softmax of `scores` within each group of items that share a prompt (PickScore's probabilities)."""
    keys = {p: i for i, p in enumerate(dict.fromkeys(prompts))}
    group = torch.tensor([keys[p] for p in prompts], device=scores.device)
    n = len(keys)
    gmax = torch.full((n,), float("-inf"), device=scores.device, dtype=scores.dtype)
    gmax = gmax.scatter_reduce(0, group, scores, reduce="amax")
    e = torch.exp(scores - gmax[group])
    denom = torch.zeros(n, device=scores.device, dtype=scores.dtype).index_add(0, group, e)
    return e / denom[group]


class PickScore(Reward):
    name = "pickscore"
    differentiable = True
    compare_temperature = 1.0  # softmax over a pair == sigmoid(s_a - s_b)
    # Precision: the towers may run in bf16; exp(logit_scale) multiplies every score, so it stays fp32,
    # and the cosine is taken in fp32 from the embeddings.
    keep_fp32 = ("backbone.model.logit_scale",)

    def __init__(self, backbone, micro_batch_size: int = 32) -> None:
        super().__init__(micro_batch_size=micro_batch_size)
        self.backbone = backbone

    def _score(self, prompts: list[str], media) -> RewardOutput:
        img = F.normalize(self.backbone.image_features(media).float(), dim=-1)
        txt = F.normalize(self.backbone.text_features(prompts).float(), dim=-1)
        cos = (img * txt).sum(dim=-1)
        return RewardOutput(self.backbone.logit_scale.float().exp() * cos, {"cosine": cos})

    @property
    def image_alpha(self) -> str:
        return self.backbone.preprocess.alpha

    def rank(self, prompts: Prompts, media: Any, **kwargs: Any) -> RewardOutput:
        """Scores plus details['prob']: the softmax over the candidates that share a prompt."""
        out = self.score(prompts, media, **kwargs)
        plist = [prompts] * len(out) if isinstance(prompts, str) else list(prompts)
        out.details["prob"] = group_softmax(out.scores, plist)
        return out


def load_pickscore(
    checkpoint: str | None,
    *,
    weights: str = "pretrained",
    processor: str = PROCESSOR_REPO,
    tokenizer: str | None = None,
    config: dict[str, Any] | None = None,
    resize_backend: Literal["pil", "torch"] = "pil",
    cache_size: int = 4096,
    micro_batch_size: int = 32,
) -> PickScore:
    from mmreward.backbones.clip import build_hf_backbone

    net = build_hf_backbone(
        checkpoint, weights=weights, tokenizer=tokenizer, processor=None if weights == "random" else processor,
        config=config, crop_rounding="floor", resize_backend=resize_backend, cache_size=cache_size,
    )
    return PickScore(net, micro_batch_size=micro_batch_size)
