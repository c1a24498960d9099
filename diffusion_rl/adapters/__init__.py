"""One adapter per generator family, and the data that maps a diffusers pipeline class to its adapter.

Like diffusers' `auto_pipeline.py`, the dispatch is a table, not a chain of isinstance checks:
`PIPELINE_ADAPTERS` maps a pipeline class *name* to (family, adapter class), so a caller need not import
diffusers first, and a subclass of a supported pipeline (e.g. a ReNO-style wrapper) finds its parent's adapter.
`adapter_class_for` walks the pipeline's MRO from the most derived class and takes the first registered name, so a
registered subclass always wins over its parent whatever the table's order.

A new family lives in its own file here and registers itself at import time (from the registry module, which
imports no adapter, so that the package importing the file is not imported back):

    from diffusion_rl.adapters.registry import register_adapter
    register_adapter("MyPipeline", "my_family", MyAdapter, ["to_q", "to_k", "to_v", "to_out.0"])

and gets one import line at the bottom of this module (docs/adding_a_model.md walks through it).
"""

from __future__ import annotations

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
from diffusion_rl.adapters.registry import (
    ADAPTERS,
    DEFAULT_LORA_TARGETS,
    PIPELINE_ADAPTERS,
    VIDEO_FAMILIES,
    adapter_class_for,
    register_adapter,
)
from diffusion_rl.adapters.sd import SDAdapter
from diffusion_rl.adapters.sd3 import SD3Adapter
from diffusion_rl.adapters.sdxl import SDXLAdapter
from diffusion_rl.adapters.wan import WanAdapter

# pipeline class name -> (family, adapter class). Lookup walks the pipeline's MRO from its own class upwards
# (`adapter_class_for`), so a registered subclass resolves before its base wherever it sits here; no two built-in
# entries are related by inheritance in diffusers 0.42 (tests/diffusion_rl/test_adapter_registry.py checks it)
_BUILTIN: dict[str, tuple[str, type[PipelineAdapter]]] = {
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

# LoRA target modules per family: the attention projections, as the Flow-GRPO / DanceGRPO / DDPO code trains
_JOINT_ATTENTION = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
_BUILTIN_LORA_TARGETS: dict[str, list[str]] = {
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

for _name, (_family, _cls) in _BUILTIN.items():
    register_adapter(_name, _family, _cls, _BUILTIN_LORA_TARGETS[_family])


__all__ = [
    "ADAPTERS", "DEFAULT_LORA_TARGETS", "DTYPES", "PIPELINE_ADAPTERS", "VIDEO_FAMILIES", "CogVideoXAdapter",
    "FluxAdapter", "FluxKontextAdapter", "HunyuanVideoAdapter", "LTXAdapter", "PipelineAdapter", "PromptEmbeds",
    "QwenImageEditAdapter", "SD3Adapter", "SDAdapter", "SDXLAdapter", "Schedule", "VideoAdapter", "WanAdapter",
    "adapter_class_for", "decode_chunked", "flow_schedule", "prompt_list", "register_adapter",
]

# adapters in their own files that register themselves (diffusion_rl.adapters.registry); import order =
# registration order
from diffusion_rl.adapters import (  # noqa: E402, F401
    flux2,  # Flux2Pipeline (FLUX.2-dev), Flux2KleinPipeline (FLUX.2-klein)
    hunyuan_video15,  # HunyuanVideo15Pipeline, HunyuanVideo15ImageToVideoPipeline (HunyuanVideo 1.5)
    ltx2,  # LTX2Pipeline (LTX-2: video with audio)
    qwen_image,  # QwenImagePipeline (Qwen-Image text-to-image)
    qwen_image21,  # QwenImage21Pipeline (Qwen-Image-2.1 text-to-image)
    qwen_image_edit_plus,  # QwenImageEditPlusPipeline (Qwen-Image-Edit-2509/2511: multi-image edits)
    wan22,  # Wan 2.2 (WanImageToVideoPipeline)
    z_image,  # ZImagePipeline (Z-Image, Z-Image-Turbo)
)
