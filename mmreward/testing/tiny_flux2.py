"""Tiny seeded FLUX.2 pipelines built from config (diffusers' get_dummy_components style), for the flux2 adapter.

`build_tiny_flux2("dev")` is diffusers' `Flux2Pipeline` (FLUX.2-dev's layout): a guidance-embedding
`Flux2Transformer2DModel`, an `AutoencoderKLFlux2` whose batch-norm statistics are set to non-trivial values
(decoding must un-normalise with them), and a `Mistral3ForConditionalGeneration` text encoder with 30 text layers
(the pipeline stacks hidden states 10, 20 and 30) read through a `PixtralProcessor` whose chat template renders
like Mistral-Small-3.1's ([SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]).

`build_tiny_flux2("klein")` / `("klein_distilled")` are `Flux2KleinPipeline` (FLUX.2-klein-base / the step-distilled
FLUX.2-klein): no guidance embedding, a `Qwen3ForCausalLM` text encoder with 27 layers (hidden states 9, 18, 27)
and a Qwen2 tokenizer whose chat template renders like Qwen3's with `enable_thinking=False`; the base model
samples with true CFG, the distilled one (`is_distilled=True`) without.

The scheduler is FLUX.2's FlowMatchEulerDiscreteScheduler config (dynamic shifting; the pipelines pass their own
empirical mu). Tokenizers are real byte-level BPEs trained in milliseconds on a small fixed corpus. Every module
is in eval mode, as `from_pretrained` leaves it; `save_tiny_flux2` writes the official diffusers folder layout.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal

import torch

Flux2Kind = Literal["dev", "klein", "klein_distilled"]
FLUX2_KINDS: tuple[str, ...] = ("dev", "klein", "klein_distilled")

TEXT_HIDDEN = 16  # per text-encoder layer; the transformer's joint_attention_dim is 3 x this (3 stacked layers)

# Mistral-Small-3.1's template, reduced to what the pipeline sends: a system turn and user turns whose content is
# a string or a list of text / image blocks
MISTRAL3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set text = message['content'] %}"
    "{%- else %}{%- set ns = namespace(text='') %}{%- for block in message['content'] %}"
    "{%- if block['type'] == 'text' %}{%- set ns.text = ns.text + block['text'] %}"
    "{%- elif block['type'] in ['image', 'image_url'] %}{%- set ns.text = ns.text + '[IMG]' %}{%- endif %}"
    "{%- endfor %}{%- set text = ns.text %}{%- endif %}"
    "{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[INST]' + text + '[/INST]' }}"
    "{%- else %}{{- text + eos_token }}{%- endif %}"
    "{%- endfor %}"
)
MISTRAL3_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]",
                           "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]

# Qwen3's template for the turns Flux2KleinPipeline sends (one user turn, generation prompt, thinking off)
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
QWEN3_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

_CORPUS = [
    "a photo of a cat, a dog, two blue squares, a green triangle above a yellow star",
    "a red circle left of a white square; one big purple star next to three small orange circles",
    "make the cat blue; turn the square into a circle; add a black dog on the right",
]


def _bpe(specials: list[str], extra_text: list[str]):
    """A byte-level BPE (vocabulary ~600) trained on the corpus, with `specials` at the start of the vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator((_CORPUS + extra_text) * 4, trainer=trainer)
    return bpe


def build_mistral3_processor(out_dir: str | os.PathLike):
    """A PixtralProcessor (PixtralImageProcessor + a fast BPE tokenizer with Mistral's control tokens) saved in
    `out_dir`, as FLUX.2-dev's `tokenizer` folder holds one."""
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
    from transformers import PixtralImageProcessor, PixtralProcessor, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=_bpe(MISTRAL3_SPECIAL_TOKENS, [SYSTEM_MESSAGE]),
                                  unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.add_special_tokens({"additional_special_tokens": MISTRAL3_SPECIAL_TOKENS[4:]})
    image_processor = PixtralImageProcessor(size={"longest_edge": 56}, patch_size=14)
    processor = PixtralProcessor(image_processor=image_processor, tokenizer=tok, patch_size=14,
                                 spatial_merge_size=2, chat_template=MISTRAL3_CHAT_TEMPLATE)
    processor.save_pretrained(str(out_dir))
    return processor


def build_qwen3_tokenizer(out_dir: str | os.PathLike):
    """A Qwen2TokenizerFast with Qwen3's special tokens and chat template, saved in `out_dir`."""
    import json

    from transformers import Qwen2TokenizerFast

    state = json.loads(_bpe([], []).to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    tok = Qwen2TokenizerFast(vocab=state["vocab"], merges=merges, unk_token=None, bos_token=None,
                             eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": QWEN3_SPECIAL_TOKENS[1:]})
    tok.add_special_tokens({"pad_token": "<|endoftext|>"})
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    tok.save_pretrained(str(out_dir))
    return tok


def _tiny_vae():
    """AutoencoderKLFlux2 with spatial factor 2 (two blocks) and 4 latent channels (16 after 2x2 patchify), its
    batch-norm running statistics set away from (0, 1) so that un-normalising them is visible."""
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4,
                             down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                             sample_size=32)
    channels = vae.bn.num_features
    with torch.no_grad():
        vae.bn.running_mean.copy_(0.2 * torch.randn(channels))
        vae.bn.running_var.copy_(0.5 + torch.rand(channels))
    return vae


def _tiny_transformer(guidance_embeds: bool):
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=3 * TEXT_HIDDEN,
                                   timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4),
                                   guidance_embeds=guidance_embeds)


def _scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    # FLUX.2-dev's scheduler_config.json (dynamic shifting; the pipeline supplies mu = compute_empirical_mu)
    return FlowMatchEulerDiscreteScheduler(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096,
                                           max_shift=1.15, num_train_timesteps=1000, shift=3.0,
                                           use_dynamic_shifting=True)


def build_tiny_flux2(kind: Flux2Kind = "dev", seed: int = 0):
    """A tiny Flux2Pipeline ("dev") or Flux2KleinPipeline ("klein": CFG, "klein_distilled": is_distilled=True)."""
    if kind not in FLUX2_KINDS:
        raise ValueError(f"kind must be one of {FLUX2_KINDS}, got {kind!r}")
    torch.manual_seed(seed)
    if kind == "dev":
        from diffusers import Flux2Pipeline
        from transformers import Mistral3Config, Mistral3ForConditionalGeneration

        with tempfile.TemporaryDirectory() as tmp:
            processor = build_mistral3_processor(tmp)
        tok = processor.tokenizer
        config = Mistral3Config(
            text_config=dict(model_type="mistral", vocab_size=len(tok), hidden_size=TEXT_HIDDEN, intermediate_size=32,
                             num_hidden_layers=30, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                             max_position_embeddings=1024, pad_token_id=tok.pad_token_id, initializer_range=0.2),
            vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                               num_attention_heads=2, head_dim=8, patch_size=14, image_size=56),
            image_token_index=tok.convert_tokens_to_ids("[IMG]"), spatial_merge_size=2,
        )
        text_encoder = Mistral3ForConditionalGeneration(config).eval()
        return Flux2Pipeline(scheduler=_scheduler(), vae=_tiny_vae().eval(), text_encoder=text_encoder,
                             tokenizer=processor, transformer=_tiny_transformer(guidance_embeds=True).eval())
    from diffusers import Flux2KleinPipeline
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        tok = build_qwen3_tokenizer(tmp)
    config = Qwen3Config(vocab_size=len(tok), hidden_size=TEXT_HIDDEN, intermediate_size=32, num_hidden_layers=27,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=1024,
                         pad_token_id=tok.pad_token_id, initializer_range=0.2)
    return Flux2KleinPipeline(scheduler=_scheduler(), vae=_tiny_vae().eval(), text_encoder=Qwen3ForCausalLM(config).eval(),
                              tokenizer=tok, transformer=_tiny_transformer(guidance_embeds=False).eval(),
                              is_distilled=kind == "klein_distilled")


def save_tiny_flux2(path: str | os.PathLike, kind: Flux2Kind = "dev", seed: int = 0) -> Path:
    """Build a tiny FLUX.2 pipeline and save it in the diffusers folder layout (model_index.json + subfolders)."""
    out = Path(path)
    build_tiny_flux2(kind, seed).save_pretrained(str(out))
    return out
