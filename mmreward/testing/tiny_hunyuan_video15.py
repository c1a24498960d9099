"""A tiny seeded diffusers `HunyuanVideo15Pipeline` (HunyuanVideo 1.5 text-to-video) built from config with random
weights, for offline tests of `diffusion_rl.adapters.hunyuan_video15`.

The components are the real classes at tiny sizes, with the geometry of diffusers' own `get_dummy_components`
(tests/pipelines/hunyuan_video1_5/test_hunyuan_1_5.py, huggingface/diffusers@071190d): a
`HunyuanVideo15Transformer3DModel` with in_channels 9 = 4 noise + 4 condition latents + 1 mask, an
`AutoencoderKLHunyuanVideo15` with spatial factor 4 and temporal factor 2, `FlowMatchEulerDiscreteScheduler(shift=7)`
(the released 480p/720p T2V scheduler shift), a Qwen2.5-VL text model (three layers, so the pipeline's third-to-last
hidden state is a real layer's output) with the Qwen2 byte-level BPE tokenizer and chat template
(`mmreward.backbones.tiny_qwen_vl`), a T5 encoder with the real `ByT5Tokenizer` (bytes, no vocabulary file), and
`ClassifierFreeGuidance`. A few MB in float32 (most of it the transformer's ByT5 projection, whose 2048-wide
hidden layer is fixed in the class).

`kind="i2v"` builds `HunyuanVideo15ImageToVideoPipeline` instead: the same components plus a SigLIP vision encoder
whose hidden size is the transformer's `image_embed_dim` (12; 16 tokens of a 16 x 16 image) and its image processor.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

HV15_SHIFT = 7.0  # hunyuanvideo-community/HunyuanVideo-1.5-*_t2v scheduler_config.json (diffusers' dummy uses it too)


def build_tiny_hunyuan_video15(seed: int = 0, guidance_scale: float = 6.0, kind: str = "t2v") -> Any:
    """A `HunyuanVideo15Pipeline` ("t2v") or `HunyuanVideo15ImageToVideoPipeline` ("i2v") with seeded random tiny
    components (see the module docstring)."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import (
        ByT5Tokenizer,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    from mmreward.backbones.tiny_qwen_vl import build_qwen_tokenizer

    if kind not in ("t2v", "i2v"):
        raise ValueError(f"kind must be 't2v' or 'i2v', got {kind!r}")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_qwen_tokenizer(tmp)
    ids = tokenizer.convert_tokens_to_ids
    torch.manual_seed(seed)
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16, text_embed_2_dim=32,
        image_embed_dim=12, rope_axes_dim=(2, 2, 4), target_size=16, task_type=kind,
    ).eval()
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLHunyuanVideo15(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 16), layers_per_block=1,
        spatial_compression_ratio=4, temporal_compression_ratio=2, downsample_match_channel=False,
        upsample_match_channel=False,
    ).eval()
    torch.manual_seed(seed + 2)
    text_encoder = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=16, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=2048, rope_theta=1000000.0,
        rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
        pad_token_id=ids("<|endoftext|>"), bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
    )).eval()
    torch.manual_seed(seed + 3)
    tokenizer_2 = ByT5Tokenizer()
    text_encoder_2 = T5EncoderModel(T5Config(vocab_size=len(tokenizer_2), d_model=32, d_ff=37, d_kv=8, num_layers=2,
                                             num_heads=4, relative_attention_num_buckets=8)).eval()
    common = {"text_encoder": text_encoder, "tokenizer": tokenizer, "transformer": transformer, "vae": vae,
              "scheduler": FlowMatchEulerDiscreteScheduler(shift=HV15_SHIFT), "text_encoder_2": text_encoder_2,
              "tokenizer_2": tokenizer_2, "guider": ClassifierFreeGuidance(guidance_scale=guidance_scale)}
    if kind == "t2v":
        return HunyuanVideo15Pipeline(**common)
    from diffusers import HunyuanVideo15ImageToVideoPipeline
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    torch.manual_seed(seed + 4)
    image_encoder = SiglipVisionModel(SiglipVisionConfig(
        hidden_size=12, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2, image_size=16,
        patch_size=4)).eval()
    feature_extractor = SiglipImageProcessor(size={"height": 16, "width": 16})
    return HunyuanVideo15ImageToVideoPipeline(image_encoder=image_encoder, feature_extractor=feature_extractor,
                                              **common)


def save_tiny_hunyuan_video15(path: str | os.PathLike, seed: int = 0, kind: str = "t2v") -> Path:
    """`build_tiny_hunyuan_video15` in the diffusers folder layout (model_index.json + one folder per component),
    which `DiffusionPipeline.from_pretrained` and `diffusion_rl.pipelines.load_pipeline` read back."""
    out = Path(path)
    build_tiny_hunyuan_video15(seed, kind=kind).save_pretrained(str(out))
    return out
