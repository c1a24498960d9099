"""Tiny random Qwen2-VL / Qwen2.5-VL checkpoints in the official Hugging Face layout, built offline.

What `tiny=True` loads for the Qwen-VL rewards (vqascore, hpsv3, videoalign, the VLM judges, paco-reward):
the real processor, chat template and model classes with tiny sizes, so smoke runs, serving benchmarks and
the conformance suite exercise the real code path without a hub. The tokenizer is a real byte-level BPE (the
Qwen2 pre-tokenizer and byte alphabet) trained in milliseconds on a small fixed corpus, with Qwen's special
tokens at the end of the vocabulary and a chat template that renders conversations exactly as
Qwen2-VL-Instruct's does (system turn, vision placeholders, generation prompt). Everything is written with
`save_pretrained`, so the real loaders read it.
"""

from __future__ import annotations

import os
from pathlib import Path

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Renders like Qwen2-VL-Instruct's template: a default system turn, images and videos as
# <|vision_start|><|image_pad|><|vision_end|> in content order, then the text.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}{% set image_count.value = image_count.value + 1 %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "Does this figure show a red circle? Please answer yes or no. Yes No yes no",
    "You are a helpful assistant. system user assistant",
    "a photo of a cat, a dog, two blue squares, a green triangle above a yellow star",
    "Please provide the overall ratings of this image: END Visual Quality Motion Quality Text Alignment",
    "Final Score: 1 2 3 4 5 6 7 8 9 10 0.5 Image 1 is better. Image 2 is better. <answer> </answer>",
    "visual quality: 3 text-to-video alignment: 4 physical/common-sense consistency: 2",
    "The quick brown fox jumps over the lazy dog. evaluate the video and the prompt",
]


def _reward_prompts() -> list[str]:
    """The long trained prompts of the VLM rewards. Learning merges for them keeps the tiny models' sequences
    near real Qwen lengths (the HPSv3 prompt is ~1.5k tokens with byte-level pieces, ~400 with merges), which
    is what makes tests on the tiny models fast.

    Every tiny model sees all of their prompts, so that one seeded tokenizer (and model) serves them all."""
    from mmreward.prompt_templates.vlm import (
        EDIT_CONSISTENCY,
        EDIT_FOLLOWING,
        FAMILIES,
        HPSV3_INSTRUCTION,
        HPSV3_SUFFIX,
        TEMPLATES,
        VIDEOALIGN_PROMPT,
    )

    texts = [HPSV3_INSTRUCTION, HPSV3_SUFFIX, VIDEOALIGN_PROMPT, EDIT_CONSISTENCY, EDIT_FOLLOWING, *TEMPLATES.values()]
    for fam in FAMILIES.values():
        texts += list(fam.pointwise.values()) + list((fam.pairwise or {}).values())
    return texts


def build_qwen_tokenizer(out_dir: str | os.PathLike, extra_special_tokens: list[str] | tuple[str, ...] = ()):
    """A Qwen2 byte-level BPE tokenizer with Qwen's special tokens, saved in `out_dir`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(_CORPUS * 4 + _reward_prompts() * 2, trainer=trainer)
    import json

    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    tok = Qwen2TokenizerFast(
        vocab=state["vocab"],
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tok.add_special_tokens({"additional_special_tokens": QWEN_SPECIAL_TOKENS[1:] + list(extra_special_tokens)})
    tok.add_special_tokens({"pad_token": "<|endoftext|>"})
    tok.chat_template = QWEN2_VL_CHAT_TEMPLATE
    tok.save_pretrained(str(out))
    return tok


def tiny_qwen_vl_config(tokenizer, variant: str = "qwen2_vl", hidden: int = 32):
    """A Qwen2-VL (or Qwen2.5-VL) config with one tiny layer in each tower."""
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig

    ids = tokenizer.convert_tokens_to_ids
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        tie_word_embeddings=False,
        pad_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
        bos_token_id=ids("<|endoftext|>"),
        # a large init makes a one-layer random model depend visibly on the pixels and the prompt
        initializer_range=0.5,
    )
    vision = dict(depth=1, embed_dim=16, hidden_size=hidden, num_heads=2, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_chans=3,
                  initializer_range=0.5)
    if variant == "qwen2_5_vl":
        vision = dict(depth=1, hidden_size=16, out_hidden_size=hidden, intermediate_size=32, num_heads=2,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                      fullatt_block_indexes=[0], in_channels=3, initializer_range=0.5)
        cls = Qwen2_5_VLConfig
    elif variant == "qwen2_vl":
        cls = Qwen2VLConfig
    else:
        raise ValueError(f"variant must be 'qwen2_vl' or 'qwen2_5_vl', got {variant!r}")
    return cls(
        text_config=text,
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        **{k: v for k, v in text.items() if k in ("vocab_size", "hidden_size", "pad_token_id", "eos_token_id")},
    )


def build_tiny_qwen_vl(
    out_dir: str | os.PathLike,
    variant: str = "qwen2_vl",
    seed: int = 0,
    extra_special_tokens: list[str] | tuple[str, ...] = (),
    max_pixels: int = 56 * 56,
):
    """Write a tiny random Qwen2-VL-family checkpoint (model, tokenizer, processor) to `out_dir`.

    Returns (model, processor). Images are resized to at most `max_pixels` pixels, so a 56x56 image
    costs 4 visual tokens.
    """
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    out = Path(out_dir)
    tok = build_qwen_tokenizer(out, extra_special_tokens)
    config = tiny_qwen_vl_config(tok, variant)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config)
    model.save_pretrained(str(out))
    size = {"shortest_edge": 28 * 28, "longest_edge": max_pixels}
    image_processor = Qwen2VLImageProcessor(size=size, patch_size=14, merge_size=2, temporal_patch_size=2)
    video_processor = Qwen2VLVideoProcessor(size=size, patch_size=14, merge_size=2, temporal_patch_size=2)
    processor = Qwen2VLProcessor(
        image_processor=image_processor, tokenizer=tok, video_processor=video_processor,
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(out))
    return model, AutoProcessor.from_pretrained(str(out))


def tiny_qwen_vl_folder(extra_special_tokens: list[str] | tuple[str, ...] = ()) -> str:
    """A fresh temporary folder holding the seeded tiny Qwen2-VL checkpoint (what tiny=True loads)."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="mmreward-tiny-qwen2vl-")
    build_tiny_qwen_vl(folder, extra_special_tokens=list(extra_special_tokens))
    return folder
