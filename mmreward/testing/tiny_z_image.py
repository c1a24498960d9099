"""A tiny seeded ZImagePipeline (Z-Image / Z-Image-Turbo) built from config, in the diffusers folder layout.

Components follow the hub checkpoints' classes (Tongyi-MAI/Z-Image-Turbo's model_index.json): a
ZImageTransformer2DModel, an AutoencoderKL with shift/scaling factors, a Qwen3Model text encoder whose
second-to-last hidden state is the caption feature, a Qwen2-family byte-level BPE tokenizer with Qwen3's
chat template, and FlowMatchEulerDiscreteScheduler with Z-Image-Turbo's static shift 3.0 (its
scheduler_config.json: use_dynamic_shifting false). Sizes follow diffusers' own
tests/pipelines/z_image/test_z_image.py `get_dummy_components`, smaller where the tests allow.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

# the special tokens Qwen3's tokenizer has and Z-Image's prompt template uses
QWEN3_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# Qwen3's chat template, reduced to what ZImagePipeline renders (user turns, the generation prompt and the
# `enable_thinking` switch): "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n", plus an empty
# think block when thinking is off, as Qwen3-4B's template does
QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)

_CORPUS = [
    "a photo of a cat, a dog, two blue squares, a green triangle above a yellow star",
    "a red circle on the left of a blue square, a white background, a black cube",
    "user assistant system. The quick brown fox jumps over the lazy dog",
]


def build_qwen3_tokenizer(out_dir: str | os.PathLike | None = None):
    """A Qwen2-family byte-level BPE (Qwen's pre-tokenizer and byte alphabet, a few hundred merges) with
    Qwen3's special tokens and chat template; saved in `out_dir` when given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(_CORPUS * 2, trainer=trainer)
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    tok = Qwen2Tokenizer(vocab=state["vocab"], merges=merges, unk_token=None, bos_token=None,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": QWEN3_SPECIAL_TOKENS[1:]})
    tok.add_special_tokens({"pad_token": "<|endoftext|>"})
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    if out_dir is not None:
        tok.save_pretrained(str(out_dir))
    return tok


def build_tiny_z_image_pipeline(seed: int = 0, shift: float = 3.0):
    """A ZImagePipeline with random weights: latent 4 channels, VAE factor 4 (images a multiple of 8 pixels),
    a 1+1+1-layer transformer of width 32 and a 2-layer Qwen3 of width 16."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        ZImagePipeline,
        ZImageTransformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3Model

    tokenizer = build_qwen3_tokenizer()
    torch.manual_seed(seed)
    text_encoder = Qwen3Model(Qwen3Config(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=8, vocab_size=len(tokenizer), max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )).eval()
    torch.manual_seed(seed + 1)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=1, n_refiner_layers=1,
        n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True, cap_feat_dim=16, rope_theta=256.0, t_scale=1000.0,
        axes_dims=[8, 4, 4], axes_lens=[256, 32, 32],
    )
    with torch.no_grad():  # created with torch.empty upstream: fixed values keep the tiny model seeded (NaN-free)
        transformer.x_pad_token.copy_(torch.randn_like(transformer.x_pad_token))
        transformer.cap_pad_token.copy_(torch.randn_like(transformer.cap_pad_token))
    torch.manual_seed(seed + 2)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(8, 8, 8), layers_per_block=1,
        latent_channels=4, norm_num_groups=2, sample_size=32, scaling_factor=0.3611, shift_factor=0.1159,
        use_quant_conv=False, use_post_quant_conv=False,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift, use_dynamic_shifting=False)
    return ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                          transformer=transformer)


def save_tiny_z_image_pipeline(path: str | os.PathLike, seed: int = 0) -> Path:
    """`build_tiny_z_image_pipeline` saved with `save_pretrained` (model_index.json + one folder per component)."""
    out = Path(path)
    build_tiny_z_image_pipeline(seed).save_pretrained(str(out))
    return out
