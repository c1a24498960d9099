"""Tiny, seeded Wan 2.2 A14B-style pipelines built from config with random weights (a few hundred KB), for
offline tests of `diffusion_rl.adapters.wan22`:

- "t2v": diffusers' WanPipeline with two experts, `transformer` (high noise) and `transformer_2` (low noise),
  switched at `boundary_ratio` 0.875 (Wan2.2-T2V-A14B-Diffusers' model_index.json);
- "i2v": WanImageToVideoPipeline with two experts and boundary_ratio 0.9, no image encoder, in_channels
  36 = 16 noise + 4 mask + 16 condition latents (Wan2.2-I2V-A14B-Diffusers, diffusers'
  scripts/convert_wan_to_diffusers.py "Wan2.2-I2V-14B-720p");
- "i2v_clip": WanImageToVideoPipeline with one transformer and a CLIP image encoder whose penultimate hidden
  states are `image_embeds` (the Wan 2.1 I2V layout: `image_dim` and `added_kv_proj_dim` set).

The two experts are built from different seeds, so a test can tell which one ran. Text encoder, tokenizer, VAE
and scheduler follow `mmreward.testing.tiny_models._tiny_wan` (UMT5 + unigram T5 tokenizer, AutoencoderKLWan
with spatial factor 8 and temporal factor 4, the official UniPC flow scheduler).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal

import torch

Wan22Kind = Literal["t2v", "i2v", "i2v_clip"]
WAN22_KINDS: tuple[str, ...] = ("t2v", "i2v", "i2v_clip")
T2V_BOUNDARY_RATIO = 0.875  # Wan2.2-T2V-A14B
I2V_BOUNDARY_RATIO = 0.9  # Wan2.2-I2V-A14B


def _transformer(seed: int, in_channels: int, image_dim: int | None = None):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=in_channels, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32, image_dim=image_dim, added_kv_proj_dim=None if image_dim is None else 24,
    ).eval()


def _image_encoder(seed: int):
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(seed)
    config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=32, patch_size=8, projection_dim=16)
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return CLIPVisionModelWithProjection(config).eval(), processor


def build_tiny_wan22(kind: Wan22Kind = "t2v", seed: int = 0):
    """A tiny two-expert WanPipeline ("t2v"), two-expert WanImageToVideoPipeline ("i2v") or one-expert
    WanImageToVideoPipeline with a CLIP image encoder ("i2v_clip"); see the module docstring."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    from mmreward.testing.tiny_models import build_t5_tokenizer

    if kind not in WAN22_KINDS:
        raise ValueError(f"kind must be one of {WAN22_KINDS}, got {kind!r}")
    with tempfile.TemporaryDirectory() as tmp:
        tok = build_t5_tokenizer(tmp)
    torch.manual_seed(seed)
    text_encoder = UMT5EncoderModel(UMT5Config(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4,
                                               vocab_size=len(tok), relative_attention_num_buckets=8)).eval()
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True]).eval()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    common = {"tokenizer": tok, "text_encoder": text_encoder, "vae": vae, "scheduler": scheduler}
    if kind == "t2v":
        return WanPipeline(transformer=_transformer(seed + 1, 16), transformer_2=_transformer(seed + 2, 16),
                           boundary_ratio=T2V_BOUNDARY_RATIO, **common)
    # image-to-video: noise (16) + first-frame mask (4 = the VAE's temporal factor) + condition latents (16)
    if kind == "i2v":
        return WanImageToVideoPipeline(transformer=_transformer(seed + 1, 36), transformer_2=_transformer(seed + 2, 36),
                                       boundary_ratio=I2V_BOUNDARY_RATIO, **common)
    image_encoder, image_processor = _image_encoder(seed + 3)
    return WanImageToVideoPipeline(transformer=_transformer(seed + 1, 36, image_dim=32), image_encoder=image_encoder,
                                   image_processor=image_processor, **common)


def save_tiny_wan22(kind: Wan22Kind, path: str | os.PathLike, seed: int = 0) -> Path:
    """`build_tiny_wan22` saved in the diffusers folder layout (model_index.json + one subfolder per component),
    for `DiffusionPipeline.from_pretrained(path)` and `model.pretrained`."""
    out = Path(path)
    pipe = build_tiny_wan22(kind, seed)
    pipe.save_pretrained(str(out))
    return out
