"""A tiny seeded LTX2Pipeline (LTX-2: video with audio) built from config, in the diffusers folder layout.

Components follow Lightricks/LTX-2's model_index.json: an LTX2VideoTransformer3DModel (a video and an audio
stream with cross-modal attention), AutoencoderKLLTX2Video, AutoencoderKLLTX2Audio (mel-spectrogram latents),
an LTX2Vocoder (mel -> waveform), LTX2TextConnectors (the text features' video and audio connectors), a
Gemma3ForConditionalGeneration text encoder whose stacked hidden states are the caption feature, a Gemma BPE
tokenizer, and FlowMatchEulerDiscreteScheduler. Sizes follow diffusers' own
tests/pipelines/ltx2/testing_utils.py `get_ltx2_dummy_components` (VAE factors 2 x 2 x 2: 32 px, 5 frames make
a (4, 3, 16, 16) latent; 8 mel bins), with the Gemma text model built from config instead of the hub's
tiny-gemma3 (no hub here).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

_CORPUS = [
    "a robot dancing, a photo of a cat, a dog barking, two blue squares, a green triangle above a yellow star",
    "a red circle on the left of a blue square, rain on a window, a black cube, waves on a beach",
]


def build_gemma_tokenizer(out_dir: str | os.PathLike | None = None):
    """A small Gemma-style BPE (GemmaTokenizerFast with <pad>/<eos>/<bos>/<unk>, left padding as LTX2Pipeline
    sets it); saved in `out_dir` when given."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GemmaTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False)
    bpe.train_from_iterator(_CORPUS * 2, trainer=trainer)
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    tok = GemmaTokenizerFast(vocab=state["vocab"], merges=merges)
    tok.padding_side = "left"
    if out_dir is not None:
        tok.save_pretrained(str(out_dir))
    return tok


def build_tiny_ltx2_pipeline(seed: int = 0, perturbed_attn: bool = False):
    """An LTX2Pipeline with random weights: video latents 4 channels at VAE factors 2 (time) x 2 (space),
    audio latents 2 channels x 2 mel bins, a 2-layer transformer (video width 16, audio width 8), a 2-layer
    Gemma3 text model of width 16. `perturbed_attn` builds the transformer's blocks with the STG-capable
    attention processor (the config key LTX-2.3 sets; same weights, no STG effect unless a pass asks for it)."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    tokenizer = build_gemma_tokenizer()
    torch.manual_seed(seed)
    cfg = Gemma3Config(
        text_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, vocab_size=len(tokenizer), max_position_embeddings=256,
                         sliding_window=64, pad_token_id=tokenizer.pad_token_id),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4,
    )
    text_encoder = Gemma3ForConditionalGeneration(cfg).eval()
    hidden, layers = cfg.text_config.hidden_size, cfg.text_config.num_hidden_layers
    torch.manual_seed(seed + 1)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
        caption_channels=hidden, rope_double_precision=False, rope_type="split", perturbed_attn=perturbed_attn,
    )
    torch.manual_seed(seed + 2)
    connectors = LTX2TextConnectors(
        caption_channels=hidden, text_proj_in_factor=layers + 1, video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_theta=10000.0,
        rope_double_precision=False, causal_temporal_positioning=False, rope_type="split",
    )
    torch.manual_seed(seed + 3)
    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,),
        layers_per_block=(1,), decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False), downsample_type=("spatial",),
        upsample_residual=(False,), upsample_factor=(1,), timestep_conditioning=False, patch_size=1,
        patch_size_t=1, encoder_causal=True, decoder_causal=False,
    )
    vae.use_framewise_encoding = False
    vae.use_framewise_decoding = False
    torch.manual_seed(seed + 4)
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
        resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
        mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8,
    )
    torch.manual_seed(seed + 5)
    vocoder = LTX2Vocoder(
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins, hidden_channels=32,
        out_channels=2, upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2], resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]], leaky_relu_negative_slope=0.1, output_sampling_rate=16000,
    )
    # LTX-2's scheduler_config.json: dynamic shifting from the video sequence length
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                                                base_image_seq_len=1024, max_image_seq_len=4096)
    return LTX2Pipeline(scheduler=scheduler, vae=vae, audio_vae=audio_vae, text_encoder=text_encoder,
                        tokenizer=tokenizer, connectors=connectors, transformer=transformer, vocoder=vocoder)


def save_tiny_ltx2_pipeline(path: str | os.PathLike, seed: int = 0, perturbed_attn: bool = False) -> Path:
    """`build_tiny_ltx2_pipeline` saved with `save_pretrained` (model_index.json + one folder per component)."""
    out = Path(path)
    build_tiny_ltx2_pipeline(seed, perturbed_attn).save_pretrained(str(out))
    return out
