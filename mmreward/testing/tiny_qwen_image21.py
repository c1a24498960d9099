"""A tiny seeded diffusers `QwenImage21Pipeline` (Qwen-Image-2.1) built from config, for offline tests.

The components are the real classes at tiny sizes: a Qwen3-VL text encoder (`Qwen3VLForConditionalGeneration`,
one text layer, one vision layer) with a `Qwen3VLProcessor` around the real Qwen2 byte-level BPE tokenizer format
(`mmreward.backbones.tiny_qwen_vl.build_qwen_tokenizer`, whose chat template renders the system turn the pipeline
counts to drop), a one-block `QwenImage21Transformer2DModel` (single stream, block-causal attention,
`causal_condition` as released), an `AutoencoderKLQwenImage21` with five `dim_mult` stages, so four spatial
downsamples: the 16x factor the pipeline hard-codes; RGBA in and out, per-channel latent mean/std that are not
0/1), and the released checkpoint's scheduler settings (Qwen/Qwen-Image-2.1 scheduler/scheduler_config.json:
dynamic shift between 0.5 and 0.9 over 256..8192 tokens, shift_terminal 0.02, as Qwen-Image's). The random weights
are spread (N(0, 0.2^2)) because the zero-centred RMSNorm and the shared modulation initialise to values that make
every block an identity. About 1 MB in float32.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from mmreward.testing.tiny_qwen_image import QWEN_IMAGE_SCHEDULER

Z_DIM = 4  # latent channels (64 in the release)


def build_tiny_qwen_image21_pipeline(seed: int = 0, num_layers: int = 1) -> Any:
    """A `QwenImage21Pipeline` with seeded random tiny components (see the module docstring)."""
    from diffusers import (
        AutoencoderKLQwenImage21,
        FlowMatchEulerDiscreteScheduler,
        QwenImage21Pipeline,
        QwenImage21Transformer2DModel,
    )
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
    )
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    from mmreward.backbones.tiny_qwen_vl import QWEN2_VL_CHAT_TEMPLATE, build_qwen_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tok = build_qwen_tokenizer(tmp)
    ids = tok.convert_tokens_to_ids
    hidden = 32
    config = Qwen3VLConfig(
        text_config=dict(hidden_size=hidden, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, vocab_size=len(tok), max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                          "mrope_section": [4, 2, 2], "mrope_interleaved": True},
                         pad_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                         bos_token_id=ids("<|endoftext|>"), tie_word_embeddings=False),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=hidden,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                           deepstack_visual_indexes=[0]),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
    )
    torch.manual_seed(seed)
    text_encoder = Qwen3VLForConditionalGeneration(config).eval()
    transformer = QwenImage21Transformer2DModel(patch_size=1, in_channels=Z_DIM, out_channels=Z_DIM,
                                                num_layers=num_layers, attention_head_dim=16, num_attention_heads=2,
                                                context_in_dim=hidden, mlp_ratio=2, axes_dims_rope=(4, 6, 6))
    vae = AutoencoderKLQwenImage21(base_dim=4, decoder_base_dim=4, z_dim=Z_DIM, dim_mult=[1, 1, 1, 1, 1],
                                   num_res_blocks=1, attn_scales=[], temperal_downsample=[False, True, True, True],
                                   latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 0.8, 1.2, 1.0])
    with torch.no_grad():
        for module in (text_encoder, transformer, vae):
            for p in module.parameters():
                p.copy_(torch.randn_like(p) * 0.2)
        # the pipeline reads the last layer's states before the final norm: a norm weight that is not 1 makes
        # reading the normed states a visible difference
        text_encoder.model.language_model.norm.weight.copy_(torch.linspace(0.5, 2.0, hidden))
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2,
                                              min_pixels=32 * 32, max_pixels=64 * 64),
        tokenizer=tok, video_processor=Qwen3VLVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=2),
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
    )
    return QwenImage21Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER), vae=vae,
                               text_encoder=text_encoder, processor=processor, transformer=transformer)


def save_tiny_qwen_image21_pipeline(path: str | os.PathLike, seed: int = 0) -> Path:
    """The tiny pipeline written in the diffusers folder layout (model_index.json + one folder per component),
    which `DiffusionPipeline.from_pretrained` and `diffusion_rl.pipelines.load_pipeline` read back."""
    out = Path(path)
    build_tiny_qwen_image21_pipeline(seed).save_pretrained(str(out))
    return out
