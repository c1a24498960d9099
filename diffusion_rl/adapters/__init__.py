"""One adapter per generator family, and the data that maps a diffusers pipeline class to its adapter.

Like diffusers' `auto_pipeline.py`, the dispatch is a table, not a chain of isinstance checks:
`PIPELINE_ADAPTERS` maps a pipeline class *name* to (family, adapter class), so a caller need not import
diffusers first, and a subclass of a supported pipeline (e.g. a ReNO-style wrapper) finds its parent's adapter.
`adapter_class_for` walks the pipeline's MRO from the most derived class and takes the first registered name, so a
registered subclass always wins over its parent whatever the table's order.

A new family lives in its own file here and registers itself at import time:

    from diffusion_rl.adapters import register_adapter
    register_adapter("MyPipeline", "my_family", MyAdapter, ["to_q", "to_k", "to_v", "to_out.0"])

and gets one import line at the bottom of this module (docs/adding_a_model.md walks through it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from diffusion_rl.adapters.base import (
    DTYPES,
    PipelineAdapter,
    PromptEmbeds,
    Schedule,
    VideoAdapter,
    decode_chunked,
    flow_schedule,
    prompt_list,
)
from diffusion_rl.adapters.cogvideox import CogVideoXAdapter
from diffusion_rl.adapters.flux import FluxAdapter
from diffusion_rl.adapters.flux_kontext import FluxKontextAdapter
from diffusion_rl.adapters.hunyuan_video import HunyuanVideoAdapter
from diffusion_rl.adapters.ltx import LTXAdapter
from diffusion_rl.adapters.qwen_image_edit import QwenImageEditAdapter
from diffusion_rl.adapters.sd import SDAdapter
from diffusion_rl.adapters.sd3 import SD3Adapter
from diffusion_rl.adapters.sdxl import SDXLAdapter
from diffusion_rl.adapters.wan import WanAdapter
from mmreward.errors import ConfigError

# pipeline class name -> (family, adapter class). Lookup walks the pipeline's MRO from its own class upwards
# (`adapter_class_for`), so a registered subclass resolves before its base wherever it sits here; no two built-in
# entries are related by inheritance in diffusers 0.42 (tests/test_adapter_registry.py checks it)
PIPELINE_ADAPTERS: dict[str, tuple[str, type[PipelineAdapter]]] = {
    "StableDiffusionPipeline": ("sd", SDAdapter),
    "StableDiffusionXLPipeline": ("sdxl", SDXLAdapter),
    "StableDiffusion3Pipeline": ("sd3", SD3Adapter),
    "FluxPipeline": ("flux", FluxAdapter),
    "FluxKontextPipeline": ("flux_kontext", FluxKontextAdapter),
    "QwenImageEditPipeline": ("qwen_image_edit", QwenImageEditAdapter),
    "WanPipeline": ("wan", WanAdapter),
    "HunyuanVideoPipeline": ("hunyuan_video", HunyuanVideoAdapter),
    "CogVideoXPipeline": ("cogvideox", CogVideoXAdapter),
    "LTXPipeline": ("ltx", LTXAdapter),
}

# family -> adapter class (one adapter per family; several pipeline classes may share a family)
ADAPTERS: dict[str, type[PipelineAdapter]] = {family: cls for family, cls in PIPELINE_ADAPTERS.values()}

# LoRA target modules per family: the attention projections, as the Flow-GRPO / DanceGRPO / DDPO code trains
_JOINT_ATTENTION = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
DEFAULT_LORA_TARGETS: dict[str, list[str]] = {
    "sd": ["to_q", "to_k", "to_v", "to_out.0"],
    "sdxl": ["to_q", "to_k", "to_v", "to_out.0"],
    "sd3": list(_JOINT_ATTENTION),
    "flux": list(_JOINT_ATTENTION),
    "wan": ["to_q", "to_k", "to_v", "to_out.0"],  # self- (attn1) and cross-attention (attn2) of every Wan block
    # HunyuanVideo: the joint attention of the dual-stream blocks (image and text projections, as FLUX), the
    # q/k/v of the single-stream blocks, and the token refiner's self-attention (same names inside it)
    "hunyuan_video": list(_JOINT_ATTENTION),
    # CogVideoX: the joint text+video attention (attn1) of every block, as diffusers' train_cogvideox_lora.py
    "cogvideox": ["to_q", "to_k", "to_v", "to_out.0"],
    "ltx": ["to_q", "to_k", "to_v", "to_out.0"],  # self- (attn1) and cross-attention (attn2) of every LTX block
    "flux_kontext": list(_JOINT_ATTENTION),
    # Qwen-Image's dual-stream blocks: image and text projections of the joint attention, as FLUX
    "qwen_image_edit": list(_JOINT_ATTENTION),
}

# the families whose adapters make videos (B, T, 3, H, W); a list so that registration extends it in place and
# every module that imported it sees the new family
VIDEO_FAMILIES: list[str] = [family for family, cls in ADAPTERS.items() if cls.modality == "video"]


def register_adapter(pipeline_class_name: str, family: str, adapter_cls: type[PipelineAdapter],
                     lora_targets: Sequence[str]) -> None:
    """Make `adapter_cls` the adapter of pipelines whose class (or a base class) is named `pipeline_class_name`.

    `family` is the adapter's name in configs, LoRA defaults and reports (`adapter_cls.family` must say the same);
    `lora_targets` are the module-name suffixes a LoRA trains by default. Registering a pipeline class again
    replaces its entry (a plugin may override a built-in adapter); video adapters join VIDEO_FAMILIES."""
    if not isinstance(pipeline_class_name, str) or not pipeline_class_name.isidentifier():
        raise ConfigError(f"register_adapter: pipeline_class_name must be a class name such as 'FluxPipeline', "
                          f"got {pipeline_class_name!r}")
    if not (isinstance(adapter_cls, type) and issubclass(adapter_cls, PipelineAdapter)):
        raise ConfigError(f"register_adapter({pipeline_class_name!r}): the adapter must be a PipelineAdapter "
                          f"subclass (diffusion_rl.adapters.base), got {adapter_cls!r}")
    if not family or adapter_cls.family != family:
        raise ConfigError(f"register_adapter({pipeline_class_name!r}): family {family!r} differs from "
                          f"{adapter_cls.__name__}.family = {adapter_cls.family!r}; set the class attribute to it")
    targets = [lora_targets] if isinstance(lora_targets, str) else list(lora_targets)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ConfigError(f"register_adapter({pipeline_class_name!r}): lora_targets must be module-name suffixes "
                          f"such as ['to_q', 'to_k', 'to_v', 'to_out.0'], got {lora_targets!r}")
    PIPELINE_ADAPTERS[pipeline_class_name] = (family, adapter_cls)
    ADAPTERS[family] = adapter_cls
    DEFAULT_LORA_TARGETS[family] = targets
    if adapter_cls.modality == "video" and family not in VIDEO_FAMILIES:
        VIDEO_FAMILIES.append(family)


def adapter_class_for(pipe: Any, purpose: str = "") -> tuple[str, type[PipelineAdapter]]:
    """(family, adapter class) of a pipeline instance (or class): the most derived class in its MRO whose name is
    registered; ConfigError listing the supported pipeline classes otherwise."""
    cls = pipe if isinstance(pipe, type) else type(pipe)
    names = [c.__name__ for c in cls.__mro__]
    for name in names:
        if name in PIPELINE_ADAPTERS:
            return PIPELINE_ADAPTERS[name]
    raise ConfigError(
        f"pipeline: {cls.__name__} is not supported{purpose}; expected a {', '.join(PIPELINE_ADAPTERS)} (or a "
        "subclass). Load one with DiffusionPipeline.from_pretrained(...), or add an adapter (docs/adding_a_model.md)"
    )


__all__ = [
    "ADAPTERS", "DEFAULT_LORA_TARGETS", "DTYPES", "PIPELINE_ADAPTERS", "VIDEO_FAMILIES", "CogVideoXAdapter",
    "FluxAdapter", "FluxKontextAdapter", "HunyuanVideoAdapter", "LTXAdapter", "PipelineAdapter", "PromptEmbeds",
    "QwenImageEditAdapter", "SD3Adapter", "SDAdapter", "SDXLAdapter", "Schedule", "VideoAdapter", "WanAdapter",
    "adapter_class_for", "decode_chunked", "flow_schedule", "prompt_list", "register_adapter",
]

# adapters in their own files that register themselves (import order = registration order); keep last, after
# register_adapter exists, since these modules import it from this package
from diffusion_rl.adapters import (  # noqa: E402, F401
    flux2,  # Flux2Pipeline (FLUX.2-dev), Flux2KleinPipeline (FLUX.2-klein)
    qwen_image,  # QwenImagePipeline (Qwen-Image text-to-image)
    wan22,  # Wan 2.2 (WanImageToVideoPipeline)
    z_image,  # ZImagePipeline (Z-Image, Z-Image-Turbo)
)
