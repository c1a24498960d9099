"""The ShapesWorld CLIP's architecture and preprocessing, shared by the rewards that load it and the script
that trains it (mmreward.synthetic.build.train_clip), so a runtime reward never imports a training script."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmreward.preprocess import OPENAI_CLIP_MEAN as CLIP_MEAN
from mmreward.preprocess import OPENAI_CLIP_STD as CLIP_STD

TEXT_LENGTH = 24  # longest ShapesWorld prompt is ~14 tokens; the model keeps 77 positions for other users


def build_clip(vocab_size: int, image_size: int = 32):
    """A random-weight tiny CLIPModel (0.32M parameters) of the ShapesWorld architecture."""
    from transformers import CLIPConfig, CLIPModel

    config = CLIPConfig(
        text_config=dict(
            vocab_size=vocab_size, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=77,
            bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1, pad_token_id=vocab_size - 1,
        ),
        vision_config=dict(
            image_size=image_size, patch_size=4 * image_size // 32, hidden_size=64, intermediate_size=256,
            num_hidden_layers=3, num_attention_heads=4,
        ),
        projection_dim=64,
    )
    return CLIPModel(config)


def normalize_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """CLIP preprocessing on a [0, 1] batch: bicubic resize to the model size, then mean/std."""
    if images.shape[-1] != size:
        images = F.interpolate(images, size=(size, size), mode="bicubic", align_corners=False, antialias=True)
    mean = torch.tensor(CLIP_MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD, device=images.device).view(1, 3, 1, 1)
    return (images - mean) / std
