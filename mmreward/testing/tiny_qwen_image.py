"""A tiny seeded diffusers `QwenImagePipeline` (Qwen-Image text-to-image) built from config, for offline tests.

The components are the real classes at tiny sizes, as diffusers' own `get_dummy_components` does for this
pipeline: a Qwen2.5-VL text encoder with the real Qwen2 byte-level BPE tokenizer format
(`mmreward.backbones.tiny_qwen_vl`), a one-block `QwenImageTransformer2DModel` and an `AutoencoderKLQwenImage`
(spatial factor 8, per-channel latent mean/std that are not 0/1 so decoding's un-normalisation is exercised),
and the released checkpoint's scheduler settings (dynamic shift between 0.5 and 0.9 over 256..8192 tokens,
shift_terminal 0.02; Qwen/Qwen-Image scheduler/scheduler_config.json). About 1 MB in float32.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

# the released scheduler's settings (Qwen/Qwen-Image, scheduler/scheduler_config.json)
QWEN_IMAGE_SCHEDULER = {"use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 0.9, "base_image_seq_len": 256,
                        "max_image_seq_len": 8192, "shift_terminal": 0.02, "time_shift_type": "exponential"}


def tiny_qwen_image_components(seed: int = 0, num_layers: int = 1) -> dict[str, Any]:
    """The seeded tiny components every Qwen-Image pipeline class takes: scheduler, VAE, Qwen2.5-VL text encoder,
    its tokenizer and processor, transformer (the text-to-image pipeline takes all but the processor)."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel

    from mmreward.backbones.tiny_qwen_vl import build_tiny_qwen_vl

    with tempfile.TemporaryDirectory() as tmp:
        text_encoder, processor = build_tiny_qwen_vl(tmp, variant="qwen2_5_vl", seed=seed)
    torch.manual_seed(seed)
    z = 4
    vae = AutoencoderKLQwenImage(base_dim=4, z_dim=z, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                 temperal_downsample=[False, True, True], latents_mean=[0.1, -0.2, 0.3, 0.0],
                                 latents_std=[1.5, 0.8, 1.2, 1.0])
    hidden = text_encoder.config.text_config.hidden_size
    # in_channels = 4 z: the transformer reads 2x2 patches of the z-channel latents, packed into one token
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=4 * z, out_channels=z, num_layers=num_layers,
                                              attention_head_dim=16, num_attention_heads=2,
                                              joint_attention_dim=hidden, axes_dims_rope=(4, 6, 6))
    return {"scheduler": FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER), "vae": vae,
            "text_encoder": text_encoder.eval(), "tokenizer": processor.tokenizer, "processor": processor,
            "transformer": transformer}


def build_tiny_qwen_image_pipeline(seed: int = 0, num_layers: int = 1) -> Any:
    """A `QwenImagePipeline` with seeded random tiny components (see the module docstring)."""
    from diffusers import QwenImagePipeline

    parts = tiny_qwen_image_components(seed, num_layers)
    parts.pop("processor")
    return QwenImagePipeline(**parts)


def save_tiny_qwen_image_pipeline(path: str | os.PathLike, seed: int = 0) -> Path:
    """The tiny pipeline written in the diffusers folder layout (model_index.json + one folder per component),
    which `DiffusionPipeline.from_pretrained` and `diffusion_rl.pipelines.load_pipeline` read back."""
    out = Path(path)
    build_tiny_qwen_image_pipeline(seed).save_pretrained(str(out))
    return out
