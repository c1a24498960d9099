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
from pathlib import Path
from typing import Any

from mmreward.testing.tiny_qwen_image import tiny_qwen_image_components


def build_tiny_qwen_image_edit_plus_pipeline(seed: int = 0, num_layers: int = 1) -> Any:
    """A `QwenImageEditPlusPipeline` with seeded random tiny components (see the module docstring): the same
    components as the text-to-image tiny pipeline; condition latents are packed like the noisy ones."""
    from diffusers import QwenImageEditPlusPipeline

    return QwenImageEditPlusPipeline(**tiny_qwen_image_components(seed, num_layers))


def save_tiny_qwen_image_edit_plus_pipeline(path: str | os.PathLike, seed: int = 0) -> Path:
    """The tiny pipeline written in the diffusers folder layout (model_index.json + one folder per component),
    which `DiffusionPipeline.from_pretrained` and `diffusion_rl.pipelines.load_pipeline` read back."""
    out = Path(path)
    build_tiny_qwen_image_edit_plus_pipeline(seed).save_pretrained(str(out))
    return out
