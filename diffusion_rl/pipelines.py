"""Diffusers pipelines for reward fine-tuning: loading them, and picking the adapter of a loaded one.

The adapters themselves live one per file in `diffusion_rl.adapters` (SD 1.x/2.x, SDXL, SD3, FLUX.1, FLUX.1
Kontext, Qwen-Image-Edit, Wan, HunyuanVideo, CogVideoX, LTX-Video, and whatever registers itself there); the
table that maps a pipeline class to its adapter is `diffusion_rl.adapters.PIPELINE_ADAPTERS`. This module keeps
what turns a config into a pipeline and an adapter (`load_pipeline`, `run_pipeline`, `make_adapter`,
`adapter_for_config`), the checks made before sampling (`check_reward_modalities`, `check_token_limit`) and
`pipeline_family`, the one place that tells the families apart (the inference code uses it too). The adapter
classes and shared pieces are re-exported here so that older imports keep working.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from diffusion_rl.adapters import (  # noqa: F401 - the adapters and shared pieces, re-exported for callers
    ADAPTERS,
    DEFAULT_LORA_TARGETS,
    DTYPES,
    PIPELINE_ADAPTERS,
    VIDEO_FAMILIES,
    CogVideoXAdapter,
    FluxAdapter,
    FluxKontextAdapter,
    HunyuanVideoAdapter,
    LTXAdapter,
    PipelineAdapter,
    PromptEmbeds,
    QwenImageEditAdapter,
    Schedule,
    SD3Adapter,
    SDAdapter,
    SDXLAdapter,
    VideoAdapter,
    WanAdapter,
    adapter_class_for,
    decode_chunked,
    flow_schedule,
    prompt_list,
    register_adapter,
)
from mmreward.errors import CheckpointError, ConfigError


def pipeline_family(pipe: Any, purpose: str = "") -> str:
    """The family name ('sd', 'flux', 'wan', ...) of a pipeline, from `diffusion_rl.adapters.PIPELINE_ADAPTERS`
    by the class names in its MRO, so subclasses (e.g. ReNO-style wrappers) count and a caller need not import
    diffusers first; ConfigError naming the supported pipeline classes otherwise."""
    return adapter_class_for(pipe, purpose)[0]


def check_reward_modalities(adapter: PipelineAdapter, rewards: dict[str, Any], train_prompts: Sequence[str] = (),
                            eval_prompts: Sequence[str] = ()) -> None:
    """ConfigError naming each reward that cannot score what the pipeline makes (a video reward on an image
    pipeline, or an image reward on a video one), before any sampling. Video rewards are told the
    pipeline's frame rate, so the ones that sample by time (`card_fps`) keep the frames their card asks for.
    With the prompts: an editing pipeline or edit reward needs edit records (`mmreward.edit.check_edit_run`)."""
    from mmreward.edit import check_edit_run

    check_edit_run(adapter.family, {"train": train_prompts, "eval": eval_prompts},
                   [n for n, r in rewards.items() if r is not None])
    check_source_counts(adapter, {"train": train_prompts, "eval": eval_prompts})
    bad = [name for name, r in rewards.items() if r is not None and adapter.modality not in r.modalities]
    if bad:
        hint = ("score videos with video rewards, or wrap an image reward per frame (mmreward's video-frames)"
                if adapter.modality == "video" else "use image rewards, or a video pipeline (WanPipeline)")
        raise ConfigError(f"reward(s) {bad} cannot score the {adapter.modality}s a {adapter.family} pipeline makes "
                          f"({', '.join(f'{n}: {list(rewards[n].modalities)}' for n in bad)}); {hint}")
    if adapter.modality == "video":
        for reward in rewards.values():
            if reward is not None and hasattr(reward, "set_clip_fps"):
                reward.set_clip_fps(adapter.fps)


def check_source_counts(adapter: PipelineAdapter, prompts: dict[str, Sequence[str]]) -> None:
    """ConfigError, before any sampling, for edit records with more source images than the pipeline conditions on
    (`adapter.source_images`), or, where the rows' condition tokens are stacked, records of one role with different
    numbers of images."""
    for role, plist in prompts.items():
        counts = {len(p.sources): i for i, p in reversed(list(enumerate(plist))) if hasattr(p, "sources")}
        if adapter.source_images == "one" and max(counts, default=1) > 1:
            i = counts[max(counts)]
            raise ConfigError(f"prompts.{role}[{i}] is an edit record with {max(counts)} source images, but a "
                              f"{adapter.family} pipeline conditions on one; give one source image per record, or "
                              "use a multi-image editing pipeline (QwenImageEditPlusPipeline, QwenImage21Pipeline, "
                              "Flux2Pipeline, Flux2KleinPipeline)")
        if adapter.source_images == "same_count" and len(counts) > 1:
            raise ConfigError(f"prompts.{role} has edit records with {sorted(counts)} source images; a "
                              f"{adapter.family} pipeline stacks the records' condition tokens, so give every record "
                              "the same number of source images")


def check_token_limit(pipeline: Any, max_sequence_length: int | None) -> None:
    """A sequence longer than the text encoder's position table fails deep in its forward; say so first."""
    from diffusion_rl.model_card import text_token_limit

    limit = text_token_limit(pipeline)
    if max_sequence_length is not None and limit is not None and max_sequence_length > limit[1]:
        raise ConfigError(f"max_sequence_length={max_sequence_length} is more than {type(pipeline).__name__}'s "
                          f"{limit[0]} can take ({limit[1]} positions); set max_sequence_length <= {limit[1]}")


def make_adapter(pipeline: Any, height: int | None = None, width: int | None = None,
                 max_sequence_length: int | None = None, num_frames: int | None = None) -> PipelineAdapter:
    """The adapter for a diffusers pipeline instance (by family, so subclasses work too); `num_frames` is
    for video pipelines and an error for image ones."""
    _, adapter_cls = adapter_class_for(pipeline, " for reward fine-tuning")
    # settings left unset come from the folder's card (load_pipeline reads it), then from the adapter's defaults
    card = getattr(pipeline, "generation_defaults", None) or {}
    height = height if height is not None else card.get("height")
    width = width if width is not None else card.get("width")
    max_sequence_length = max_sequence_length if max_sequence_length is not None else card.get("max_sequence_length")
    video = adapter_cls.modality == "video"
    if num_frames is None and video:
        num_frames = card.get("num_frames")
    check_token_limit(pipeline, max_sequence_length)
    if video:
        return adapter_cls(pipeline, height, width, max_sequence_length, num_frames)
    if num_frames is not None:
        raise ConfigError(f"num_frames={num_frames} was given for {type(pipeline).__name__}, which makes images; "
                          "leave num_frames unset or use a video pipeline (WanPipeline)")
    return adapter_cls(pipeline, height, width, max_sequence_length)


def adapter_for_config(pipeline: Any, model_cfg: Any) -> PipelineAdapter:
    """`make_adapter` with a run's `model` section (height, width, max_sequence_length, num_frames), so that the
    trainer and the scripts build the adapter from the config the same way."""
    adapter = make_adapter(pipeline, model_cfg.height, model_cfg.width, model_cfg.max_sequence_length,
                           model_cfg.num_frames)
    fps = getattr(model_cfg, "fps", None)
    if fps is not None:
        if adapter.modality != "video":
            raise ConfigError(f"model.fps={fps} was given for {type(pipeline).__name__}, which makes images; "
                              "leave model.fps unset or use a video pipeline")
        adapter.fps = float(fps)
    # model-specific settings: each applies where the adapter has it, and is an error where it would be ignored
    specific = {"lora_experts": ("both", "Wan 2.2 A14B (two experts)"),
                "guidance_scale_2": (None, "Wan 2.2 A14B (two experts)"),
                "cfg_normalization": (None, "Z-Image"), "cfg_truncation": (None, "Z-Image")}
    for key, (default, model) in specific.items():
        value = getattr(model_cfg, key, default)
        if value == default:
            continue
        if not hasattr(adapter, key) or (key in ("lora_experts", "guidance_scale_2")
                                         and getattr(adapter, "_experts", None) is None):
            raise ConfigError(f"model.{key}={value!r} is for {model} pipelines; {type(pipeline).__name__} has no "
                              f"such setting: leave model.{key} unset")
        setattr(adapter, key, float(value) if key != "lora_experts" else value)
    # LTX-2's guidance arguments: checked together by the adapter, an error for any other pipeline
    from diffusion_rl.adapters.ltx2 import LTX2_GUIDANCE_KEYS

    ltx2 = {key: getattr(model_cfg, key) for key in LTX2_GUIDANCE_KEYS if getattr(model_cfg, key, None) is not None}
    if ltx2:
        if not hasattr(adapter, "configure_guidance"):
            raise ConfigError(f"model.{next(iter(ltx2))} is an LTX-2 (LTX2Pipeline) guidance setting; "
                              f"{type(pipeline).__name__} has no such setting: leave model.{next(iter(ltx2))} unset")
        adapter.configure_guidance(**ltx2)
    # context parallelism (video transformers): every forward pass of the rollouts splits the clip's tokens
    if getattr(model_cfg, "context_parallel", None) is not None:
        from diffusion_rl.context_parallel import enable_context_parallel

        enable_context_parallel(adapter, model_cfg.context_parallel)
    return adapter


def pipeline_from_pretrained(source: str, what: str = "model.pretrained", **kwargs):
    """`DiffusionPipeline.from_pretrained` with a typed error that names the setting (`what`) and the fix
    when the source is empty, missing, not a pipeline folder, or not cached offline."""
    import os
    from pathlib import Path

    from diffusers import DiffusionPipeline

    source = str(source).strip()
    if not source:
        raise ConfigError(f"{what} is empty: set it to a diffusers pipeline folder (with model_index.json) or a hub id")
    local = Path(source).expanduser()
    looks_local = local.is_absolute() or source.startswith(".") or os.sep in source.strip("/").split("/", 1)[-1]
    if local.is_dir() and not (local / "model_index.json").is_file():
        raise CheckpointError(f"{what}: {source!r} has no model_index.json, so it is not a diffusers pipeline folder; "
                              "give the folder written by pipeline.save_pretrained(...)")
    if not local.exists() and looks_local:
        raise CheckpointError(f"{what}: {source!r} does not exist; give a diffusers pipeline folder or a hub id")
    try:
        return DiffusionPipeline.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:  # hub ids not cached offline, bad repo ids, missing component files
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{what}: cannot load a diffusers pipeline from {source!r} ({reason}); give a local "
                              "pipeline folder, or a hub id that is in the local cache when offline") from exc


def load_pipeline(pretrained: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                  attention: str = "auto", what: str = "model.pretrained"):
    """A diffusers pipeline from a local folder or hub id (official layout), frozen, on `device`, with every
    attention module running the `attention` choice (see `mmreward.attention`). `what` names the setting the
    source came from in error messages."""
    from mmreward.attention import apply_to_pipeline, check_choice

    check_choice(attention, "model.attention")  # before the (slow) load
    from diffusion_rl.model_card import read_generation_defaults

    pipe = pipeline_from_pretrained(pretrained, what, dtype=dtype)
    pipe.generation_defaults = read_generation_defaults(pretrained)  # the folder's card: make_adapter's defaults
    pipe.set_progress_bar_config(disable=True)
    for name in ("vae", "text_encoder", "text_encoder_2", "text_encoder_3", "unet", "transformer", "transformer_2",
                 "image_encoder", "connectors", "audio_vae", "vocoder"):
        module = getattr(pipe, name, None)
        if isinstance(module, torch.nn.Module):
            module.requires_grad_(False)
    pipe = pipe.to(device)
    apply_to_pipeline(pipe, attention)
    return pipe


def run_pipeline(model_cfg: Any, device: str | torch.device, pipeline: Any = None) -> Any:
    """The run's pipeline: `model.pretrained` loaded frozen on `device`, or the one passed in; either way with
    the configured attention backend and no progress bars."""
    if pipeline is None:
        if not model_cfg.pretrained.strip():
            raise ConfigError("model.pretrained is empty: set it to a diffusers pipeline folder or hub id")
        pipeline = load_pipeline(model_cfg.pretrained, DTYPES[model_cfg.dtype], device, model_cfg.attention)
    else:  # a pipeline passed in runs the configured attention too
        from mmreward.attention import apply_to_pipeline

        apply_to_pipeline(pipeline, model_cfg.attention)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline
