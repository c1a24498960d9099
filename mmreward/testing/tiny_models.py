"""Tiny seeded models built from config and saved in the official formats (diffusers' get_dummy_components style).

Each `save_tiny_*` writes a folder that the real loaders (`from_pretrained`, `mmreward.load`) read; tokenizers
are real (the CLIP BPE from open_clip; a small unigram T5 tokenizer in the T5TokenizerFast format).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import torch

from mmreward.tokenizers import CLIP_VOCAB_SIZE, build_clip_tokenizer
from mmreward.tokenizers import build_bert_tokenizer as build_bert_tokenizer  # tests' historical import path

PipelineKind = Literal["sd", "sdxl", "sd3", "flux", "wan", "hunyuan_video", "cogvideox", "ltx"]


def _seeded(seed: int):
    torch.manual_seed(seed)


# ----------------------------------------------------------------------------------------------
# CLIP (transformers)
# ----------------------------------------------------------------------------------------------
def tiny_clip_text_config(hidden: int = 32, layers: int = 2, projection_dim: int | None = None):
    from transformers import CLIPTextConfig

    kwargs = {"projection_dim": projection_dim} if projection_dim else {}
    return CLIPTextConfig(
        vocab_size=CLIP_VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=77,
        bos_token_id=49406,
        eos_token_id=49407,
        pad_token_id=49407,
        **kwargs,
    )


def tiny_clip_config(image_size: int = 224, patch_size: int = 32, hidden: int = 32, projection_dim: int = 16):
    from transformers import CLIPConfig, CLIPVisionConfig

    text = tiny_clip_text_config(hidden)
    vision = CLIPVisionConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=image_size,
        patch_size=patch_size,
    )
    return CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=projection_dim)


def save_tiny_transformers_clip(
    path: str | os.PathLike, image_size: int = 224, patch_size: int = 32, seed: int = 0
) -> Path:
    """A CLIPModel + real CLIP tokenizer + CLIPImageProcessor in one folder (the hub repo layout)."""
    from transformers import CLIPImageProcessor, CLIPModel

    out = Path(path)
    _seeded(seed)
    model = CLIPModel(tiny_clip_config(image_size, patch_size)).eval()
    model.save_pretrained(out)
    build_clip_tokenizer(out)
    CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    ).save_pretrained(out)
    return out


# ----------------------------------------------------------------------------------------------
# T5 tokenizer (offline, unigram) and encoder
# ----------------------------------------------------------------------------------------------
_T5_WORDS = (
    "a an the of and on in left right above below next to photo picture image red green blue yellow purple "
    "orange white black cat dog circle square triangle star one two three four big small"
).split()


def build_t5_tokenizer(path: str | os.PathLike):
    """A T5TokenizerFast with a small unigram vocabulary (<pad>=0, </s>=1, <unk>=2 as in T5)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [("▁" + w, -5.0) for w in _T5_WORDS]
    pieces += [(c, -10.0) for c in "abcdefghijklmnopqrstuvwxyz0123456789.,"]
    tok = Tokenizer(models.Unigram(pieces, unk_id=2))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    fast = T5TokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", pad_token="<pad>", extra_ids=0)
    fast.model_max_length = 77
    fast.save_pretrained(str(path))
    return fast


# Llama-3's pre-tokenizer pattern: words with their leading space, 1-3 digit runs, punctuation runs, newlines
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def build_llama_tokenizer(path: str | os.PathLike):
    """A Llama-3-style fast tokenizer (tokenizer.json) for HunyuanVideo's Llama text encoder, saved in `path`.

    Word-level over Llama-3's pre-tokenizer split, with Llama-3's chat special tokens and <|begin_of_text|>
    prepended. Its vocabulary holds every piece of HunyuanVideoPipeline's default prompt template, so the
    template tokenises to the same 95 leading tokens as the real tokenizer and the pipeline's `crop_start`
    (95) cuts exactly the template off, as it does for the real model; other words are <unk> unless they are
    among the test prompts' words. Right padding, which HunyuanVideo's transformer assumes for its mask.
    """
    import re

    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")
    template = DEFAULT_PROMPT_TEMPLATE["template"]
    pieces = [piece for part in re.split("|".join(map(re.escape, _LLAMA3_SPECIAL)), template)
              for piece, _ in split.pre_tokenize_str(part)]
    words = [*_T5_WORDS, "moving", "up", "down", "colour", "changing", "to"]
    vocab = list(dict.fromkeys([*_LLAMA3_SPECIAL, "<unk>", *pieces, *words, *(" " + w for w in words)]))
    ids = {token: i for i, token in enumerate(vocab)}
    tok = Tokenizer(models.WordLevel(ids, unk_token="<unk>"))
    tok.pre_tokenizer = split
    tok.add_special_tokens(_LLAMA3_SPECIAL)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", ids["<|begin_of_text|>"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                                   pad_token="<|end_of_text|>", unk_token="<unk>", padding_side="right")
    fast.save_pretrained(str(path))
    return fast


# ----------------------------------------------------------------------------------------------
# diffusers pipelines
# ----------------------------------------------------------------------------------------------
def _tiny_vae(latent_channels: int, blocks: tuple[int, ...], flow: bool):
    from diffusers import AutoencoderKL

    kwargs = {"shift_factor": 0.0609, "scaling_factor": 1.5035, "use_quant_conv": False, "use_post_quant_conv": False}
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=blocks,
        down_block_types=("DownEncoderBlock2D",) * len(blocks),
        up_block_types=("UpDecoderBlock2D",) * len(blocks),
        latent_channels=latent_channels,
        layers_per_block=1,
        norm_num_groups=1 if flow else 2,
        sample_size=32,
        **(kwargs if flow else {}),
    )


def _tiny_t5(d_model: int):
    import tempfile

    from transformers import T5Config, T5EncoderModel

    with tempfile.TemporaryDirectory() as tmp:
        tok = build_t5_tokenizer(tmp)
    config = T5Config(d_model=d_model, d_ff=2 * d_model, d_kv=8, num_layers=2, num_heads=4, vocab_size=len(tok))
    return T5EncoderModel(config), tok


def frozen_tiny_pipeline(kind: PipelineKind, tokenizer_dir: str | os.PathLike):
    """`build_tiny_pipeline` with its CLIP tokenizer written to `tokenizer_dir`, the progress bar off and the
    denoiser frozen: what rollout and adapter tests sample from."""
    build_clip_tokenizer(tokenizer_dir)
    pipe = build_tiny_pipeline(kind, tokenizer_dir)
    pipe.set_progress_bar_config(disable=True)
    pipe.transformer.requires_grad_(False)
    return pipe


def build_tiny_pipeline(kind: PipelineKind, tokenizer_dir: str | os.PathLike, seed: int = 0):
    """A tiny StableDiffusionPipeline ("sd": UNet + DDIM), StableDiffusionXLPipeline ("sdxl": UNet with pooled
    text and size conditioning + DDIM), StableDiffusion3Pipeline ("sd3"), FluxPipeline ("flux") or
    WanPipeline ("wan": video; the CLIP tokenizer is unused), HunyuanVideoPipeline ("hunyuan_video": video),
    CogVideoXPipeline ("cogvideox") or LTXPipeline ("ltx"), both video with a tiny T5 and the CLIP tokenizer
    unused."""
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(str(tokenizer_dir))
    _seeded(seed)
    if kind == "sd":
        from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel

        unet = UNet2DConditionModel(
            block_out_channels=(8, 16),
            layers_per_block=1,
            sample_size=16,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=32,
            attention_head_dim=4,
            norm_num_groups=4,
        )
        scheduler = DDIMScheduler(
            beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False, set_alpha_to_one=False,
            steps_offset=1,
        )
        return StableDiffusionPipeline(
            unet=unet,
            scheduler=scheduler,
            vae=_tiny_vae(4, (4, 8), flow=False),
            text_encoder=CLIPTextModel(tiny_clip_text_config(32)),
            tokenizer=tokenizer,
            safety_checker=None,
            feature_extractor=None,
            image_encoder=None,
            requires_safety_checker=False,
        )
    if kind == "sdxl":
        from diffusers import DDIMScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

        # projection_class_embeddings_input_dim = 6 size/crop ids x addition_time_embed_dim + the pooled width
        unet = UNet2DConditionModel(
            block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
            addition_time_embed_dim=8, transformer_layers_per_block=(1, 1), projection_class_embeddings_input_dim=80,
            cross_attention_dim=64, norm_num_groups=4,
        )
        scheduler = DDIMScheduler(
            beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False, set_alpha_to_one=False,
            steps_offset=1,
        )
        return StableDiffusionXLPipeline(
            unet=unet, scheduler=scheduler, vae=_tiny_vae(4, (4, 8), flow=False),
            text_encoder=CLIPTextModel(tiny_clip_text_config(32)), tokenizer=tokenizer,
            text_encoder_2=CLIPTextModelWithProjection(tiny_clip_text_config(32, projection_dim=32)),
            tokenizer_2=tokenizer,
        )
    if kind == "sd3":
        from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

        t5, t5_tok = _tiny_t5(d_model=64)

        transformer = SD3Transformer2DModel(
            sample_size=16,
            patch_size=1,
            in_channels=4,
            num_layers=1,
            attention_head_dim=8,
            num_attention_heads=4,
            caption_projection_dim=32,
            joint_attention_dim=64,
            pooled_projection_dim=64,
            out_channels=4,
        )
        return StableDiffusion3Pipeline(
            transformer=transformer,
            scheduler=FlowMatchEulerDiscreteScheduler(),
            vae=_tiny_vae(4, (4, 8), flow=True),
            text_encoder=CLIPTextModelWithProjection(tiny_clip_text_config(32, projection_dim=32)),
            tokenizer=tokenizer,
            text_encoder_2=CLIPTextModelWithProjection(tiny_clip_text_config(32, projection_dim=32)),
            tokenizer_2=tokenizer,
            text_encoder_3=t5,
            tokenizer_3=t5_tok,
        )
    if kind == "flux":
        from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

        t5, t5_tok = _tiny_t5(d_model=32)
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=(4, 4, 8),
        )
        return FluxPipeline(
            transformer=transformer,
            scheduler=FlowMatchEulerDiscreteScheduler(),
            vae=_tiny_vae(4, (4,), flow=True),
            text_encoder=CLIPTextModel(tiny_clip_text_config(32)),
            tokenizer=tokenizer,
            text_encoder_2=t5,
            tokenizer_2=t5_tok,
        )
    if kind == "wan":
        return _tiny_wan()
    if kind == "hunyuan_video":
        return _tiny_hunyuan_video(tokenizer)
    if kind == "cogvideox":
        return _tiny_cogvideox()
    if kind == "ltx":
        return _tiny_ltx()
    raise ValueError(f"kind must be 'sd', 'sdxl', 'sd3', 'flux', 'wan', 'hunyuan_video', 'cogvideox' or 'ltx', "
                     f"got {kind!r}")


def _tiny_wan(expand_timesteps: bool = False):
    """A WanPipeline (Wan 2.1 layout): tiny WanTransformer3DModel, AutoencoderKLWan (spatial factor 8,
    temporal factor 4) and UMT5 encoder with the unigram T5 tokenizer; the official UniPC flow scheduler."""
    import tempfile

    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    with tempfile.TemporaryDirectory() as tmp:
        tok = build_t5_tokenizer(tmp)
    text_encoder = UMT5EncoderModel(UMT5Config(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4,
                                               vocab_size=len(tok), relative_attention_num_buckets=8))
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    for module in (text_encoder, vae, transformer):  # eval as from_pretrained leaves them: UMT5 has dropout
        module.eval()
    return WanPipeline(tokenizer=tok, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=scheduler, expand_timesteps=expand_timesteps)


def _tiny_hunyuan_video(clip_tokenizer):
    """A HunyuanVideoPipeline (the hunyuanvideo-community/HunyuanVideo layout): tiny guidance-distilled
    HunyuanVideoTransformer3DModel (patch 2, one dual- and one single-stream block), AutoencoderKLHunyuanVideo
    (spatial factor 8, temporal factor 4), a 3-layer LlamaModel with the Llama-3-style tokenizer above and a
    CLIPTextModel (pooled) with the CLIP tokenizer; FlowMatchEulerDiscreteScheduler with the real shift 7."""
    import tempfile

    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import CLIPTextModel, LlamaConfig, LlamaModel

    with tempfile.TemporaryDirectory() as tmp:
        tok = build_llama_tokenizer(tmp)
    # hidden_states[-3] (the pipeline skips the last 2 layers) is then the first layer's output, not the embeddings
    text_encoder = LlamaModel(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                                          max_position_embeddings=512, pad_token_id=tok.pad_token_id))
    vae = AutoencoderKLHunyuanVideo(latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
                                    norm_num_groups=4, spatial_compression_ratio=8, temporal_compression_ratio=4)
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=2, patch_size_t=1, guidance_embeds=True,
        text_embed_dim=16, pooled_projection_dim=32, rope_axes_dim=(2, 2, 4),
    )
    for module in (text_encoder, vae, transformer):
        module.eval()
    return HunyuanVideoPipeline(text_encoder=text_encoder, tokenizer=tok, transformer=transformer, vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
                                text_encoder_2=CLIPTextModel(tiny_clip_text_config(32)), tokenizer_2=clip_tokenizer)
def _tiny_cogvideox(patch_size_t: int | None = None, rotary: bool = True):
    """A CogVideoXPipeline in CogVideoX-5B's layout: tiny CogVideoXTransformer3DModel with 3-D rotary embeddings,
    AutoencoderKLCogVideoX (spatial factor 8 from 4 blocks, temporal factor 4), T5 encoder, and the official
    CogVideoXDPMScheduler configured as the released checkpoints are (v-prediction, zero terminal SNR,
    snr_shift_scale, trailing timesteps). `patch_size_t=2` gives CogVideoX 1.5's layout (temporal patches,
    no patch-embedding bias); `rotary=False` CogVideoX-2B's (fixed sin-cos positions over max_text_seq_length text
    tokens + the video patches)."""
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXDPMScheduler,
        CogVideoXPipeline,
        CogVideoXTransformer3DModel,
    )

    t5, tok = _tiny_t5(d_model=32)
    # head dim 16 splits into the 4 / 6 / 6 (time / height / width) rotary bands of get_3d_rotary_pos_embed;
    # sample 4x4 latents = 32x32 pixels is the default size; max_text_seq_length = the adapter tests' 16 tokens
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=8,
        text_embed_dim=32, num_layers=1, sample_width=4, sample_height=4, sample_frames=9, patch_size=2,
        temporal_compression_ratio=4, max_text_seq_length=16, use_rotary_positional_embeddings=rotary,
        patch_size_t=patch_size_t, patch_bias=patch_size_t is None,
    )
    vae = AutoencoderKLCogVideoX(
        down_block_types=("CogVideoXDownBlock3D",) * 4, up_block_types=("CogVideoXUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1, norm_num_groups=2,
        temporal_compression_ratio=4, sample_height=32, sample_width=32, scaling_factor=0.7,
    )
    scheduler = CogVideoXDPMScheduler(
        beta_schedule="scaled_linear", prediction_type="v_prediction", rescale_betas_zero_snr=True,
        set_alpha_to_one=True, snr_shift_scale=1.0, timestep_spacing="trailing", clip_sample=False,
    )
    for module in (t5, vae, transformer):
        module.eval()
    return CogVideoXPipeline(tokenizer=tok, text_encoder=t5, vae=vae, transformer=transformer, scheduler=scheduler)


def _tiny_ltx():
    """An LTXPipeline in LTX-Video 0.9.1's layout: tiny LTXVideoTransformer3DModel, AutoencoderKLLTXVideo with the
    real compression (patch 4 x three 2x down-samplings = spatial 32; temporal 8) and a timestep-conditioned
    decoder, T5 encoder and the dynamically shifted FlowMatchEulerDiscreteScheduler of the release."""
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )

    t5, tok = _tiny_t5(d_model=32)
    transformer = LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, num_layers=1, caption_channels=32,
    )
    vae = AutoencoderKLLTXVideo(
        latent_channels=8, block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True, False), decoder_spatio_temporal_scaling=(True, True, True, False),
        decoder_inject_noise=(False, False, False, False, False), upsample_residual=(False, False, False, False),
        upsample_factor=(1, 1, 1, 1), timestep_conditioning=True, patch_size=4, patch_size_t=1,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_image_seq_len=1024, max_image_seq_len=4096, base_shift=0.95, max_shift=2.05,
        shift_terminal=0.1,
    )
    for module in (t5, vae, transformer):
        module.eval()
    return LTXPipeline(scheduler=scheduler, vae=vae, text_encoder=t5, tokenizer=tok, transformer=transformer)


def save_tiny_pipeline(kind: PipelineKind, path: str | os.PathLike, seed: int = 0) -> Path:
    """Build a tiny pipeline and save it in the diffusers folder layout (model_index.json + subfolders)."""
    out = Path(path)
    tok_dir = out.parent / f".{out.name}_clip_tokenizer"
    if not (tok_dir / "vocab.json").exists():
        build_clip_tokenizer(tok_dir)
    pipe = build_tiny_pipeline(kind, tok_dir, seed)
    pipe.save_pretrained(str(out))
    return out


# ----------------------------------------------------------------------------------------------
# image-editing pipelines
# ----------------------------------------------------------------------------------------------
def build_tiny_edit_pipeline(kind: str, tokenizer_dir: str | os.PathLike, seed: int = 0):
    """A tiny instruction-editing pipeline: "flux_kontext" is diffusers' FluxKontextPipeline on the tiny FLUX
    components (the transformer reads the source image's latents concatenated after the noisy ones);
    "qwen_image_edit" is QwenImageEditPipeline (see `_tiny_qwen_image_edit`)."""
    if kind == "qwen_image_edit":
        return _tiny_qwen_image_edit(seed)
    if kind != "flux_kontext":
        raise ValueError(f"kind must be 'flux_kontext' or 'qwen_image_edit', got {kind!r}")
    from diffusers import FluxKontextPipeline

    return FluxKontextPipeline(**build_tiny_pipeline("flux", tokenizer_dir, seed).components)


def _tiny_qwen_image_edit(seed: int = 0):
    """QwenImageEditPipeline: a tiny Qwen2.5-VL text encoder with its real processor (the source image goes into
    the prompt), a tiny QwenImageTransformer2DModel and AutoencoderKLQwenImage (spatial factor 8)."""
    import tempfile

    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageEditPipeline,
        QwenImageTransformer2DModel,
    )

    from mmreward.backbones.tiny_qwen_vl import build_tiny_qwen_vl

    with tempfile.TemporaryDirectory() as tmp:
        text_encoder, processor = build_tiny_qwen_vl(tmp, variant="qwen2_5_vl", seed=seed)
    _seeded(seed)
    z = 4
    vae = AutoencoderKLQwenImage(base_dim=4, z_dim=z, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                 temperal_downsample=[False, True, True], latents_mean=[0.1, -0.2, 0.3, 0.0],
                                 latents_std=[1.5, 0.8, 1.2, 1.0])
    hidden = text_encoder.config.text_config.hidden_size
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=4 * z, out_channels=z, num_layers=1,
                                              attention_head_dim=16, num_attention_heads=2,
                                              joint_attention_dim=hidden, axes_dims_rope=(4, 6, 6))
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                                                base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02)
    return QwenImageEditPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder.eval(),
                                 tokenizer=processor.tokenizer, processor=processor, transformer=transformer)
