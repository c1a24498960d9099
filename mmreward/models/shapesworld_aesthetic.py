"""ShapesWorld "aesthetic" head: an MLP on a tiny CLIP's normalised image embedding, as LAION's predictor.

It regresses a 0-10 quality score (10 = a clean render, lower = blurred, noisy, washed-out or broken
shapes) and ignores the prompt. The folder holds a transformers CLIPVisionModelWithProjection plus
`aesthetic_head.safetensors` (Linear-GELU-Linear-GELU-Linear).
"""

from __future__ import annotations

import torch

from mmreward.types import Reward, RewardOutput

HEAD_FILE = "aesthetic_head.safetensors"


def build_head(dim: int, hidden: int = 64) -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden // 2), torch.nn.GELU(),
        torch.nn.Linear(hidden // 2, 1),
    )


class AestheticHeadReward(Reward):
    name = "shapesworld-aesthetic"
    # Precision: the vision tower may run in bf16 on fp32-preprocessed pixels; the L2 norm and the
    # head, whose output is the score, run in fp32.
    keep_fp32 = ("head",)
    differentiable = True
    requires_prompt = False

    def __init__(self, vision, head: torch.nn.Module, **kwargs) -> None:
        super().__init__(**kwargs)
        self.vision = vision
        self.head = head
        self.image_size = vision.config.image_size

    def embed(self, media: torch.Tensor) -> torch.Tensor:
        from mmreward.synthetic.models import normalize_images

        emb = self.vision(pixel_values=normalize_images(media, self.image_size).to(self.dtype)).image_embeds
        return torch.nn.functional.normalize(emb.float(), dim=-1)

    def _score(self, prompts, media):
        if isinstance(media, list):
            media = torch.stack([
                torch.nn.functional.interpolate(m[None], size=(self.image_size,) * 2, mode="bicubic",
                                                antialias=True, align_corners=False)[0] for m in media
            ])
        return RewardOutput(self.head(self.embed(media)).squeeze(-1))


def load_shapesworld_aesthetic(checkpoint=None, *, weights="pretrained", **options) -> AestheticHeadReward:
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    if weights == "random":
        vision = CLIPVisionModelWithProjection(CLIPVisionConfig(
            image_size=32, patch_size=4, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, projection_dim=64,
        ))
        return AestheticHeadReward(vision, build_head(64), **options)
    from mmreward.checkpoints import load_pretrained, load_state_dict, load_strict, resolve_files

    files = resolve_files(checkpoint, ["config.json", "model.safetensors", HEAD_FILE])
    vision = load_pretrained(CLIPVisionModelWithProjection, files["config.json"].parent)
    head = build_head(vision.config.projection_dim)
    load_strict(head, load_state_dict(files[HEAD_FILE]), str(files[HEAD_FILE]))
    return AestheticHeadReward(vision.float().eval(), head, **options)
