"""A tiny seeded diffusers `QwenImageEditPlusPipeline` (Qwen-Image-Edit-2509/2511, multi-image edits) built from
config, for offline tests.

The components are the real classes at tiny sizes, the same as `tiny_models._tiny_qwen_image_edit` (the
single-image edit pipeline shares every component class): a Qwen2.5-VL text encoder with its real processor (the
condition images go into the prompt as vision tokens), a one-block `QwenImageTransformer2DModel`, an
`AutoencoderKLQwenImage` (spatial factor 8, per-channel latent mean/std that are not 0/1), and the released
checkpoint's scheduler settings (Qwen/Qwen-Image-Edit-2509 scheduler/scheduler_config.json, as Qwen-Image's).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from mmreward.testing.tiny_qwen_image import QWEN_IMAGE_SCHEDULER


def build_tiny_qwen_image_edit_plus_pipeline(seed: int = 0, num_layers: int = 1) -> Any:
    """A `QwenImageEditPlusPipeline` with seeded random tiny components (see the module docstring)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageEditPlusPipeline,
        QwenImageTransformer2DModel,
    )

    from mmreward.models._tiny_qwen_vl import build_tiny_qwen_vl

    with tempfile.TemporaryDirectory() as tmp:
        text_encoder, processor = build_tiny_qwen_vl(tmp, variant="qwen2_5_vl", seed=seed)
    torch.manual_seed(seed)
    z = 4
    vae = AutoencoderKLQwenImage(base_dim=4, z_dim=z, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                 temperal_downsample=[False, True, True], latents_mean=[0.1, -0.2, 0.3, 0.0],
                                 latents_std=[1.5, 0.8, 1.2, 1.0])
    hidden = text_encoder.config.text_config.hidden_size
    # in_channels = 4 z: 2x2 patches of the z-channel latents packed into one token (noisy and condition alike)
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=4 * z, out_channels=z, num_layers=num_layers,
                                              attention_head_dim=16, num_attention_heads=2,
                                              joint_attention_dim=hidden, axes_dims_rope=(4, 6, 6))
    scheduler = FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER)
    return QwenImageEditPlusPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder.eval(),
                                     tokenizer=processor.tokenizer, processor=processor, transformer=transformer)


def save_tiny_qwen_image_edit_plus_pipeline(path: str | os.PathLike, seed: int = 0) -> Path:
    """The tiny pipeline written in the diffusers folder layout (model_index.json + one folder per component),
    which `DiffusionPipeline.from_pretrained` and `diffusion_rl.pipelines.load_pipeline` read back."""
    out = Path(path)
    build_tiny_qwen_image_edit_plus_pipeline(seed).save_pretrained(str(out))
    return out
