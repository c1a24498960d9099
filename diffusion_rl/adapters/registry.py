"""The adapter table's storage and `register_adapter`: pipeline class name -> (family, adapter class), LoRA targets
per family, the video families. It imports only the adapter base, so an adapter file can register itself
(`from diffusion_rl.adapters.registry import register_adapter`) without importing the package that imports it;
the built-in rows are written as data in `diffusion_rl.adapters`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from diffusion_rl.adapters.base import PipelineAdapter
from mmreward.errors import ConfigError

# pipeline class name -> (family, adapter class). Lookup walks the pipeline's MRO from its own class upwards
# (`adapter_class_for`), so a registered subclass resolves before its base wherever it sits in the table
PIPELINE_ADAPTERS: dict[str, tuple[str, type[PipelineAdapter]]] = {}
# family -> adapter class (one adapter per family; several pipeline classes may share a family)
ADAPTERS: dict[str, type[PipelineAdapter]] = {}
# family -> LoRA target module-name suffixes
DEFAULT_LORA_TARGETS: dict[str, list[str]] = {}
# the families whose adapters make videos (B, T, 3, H, W); a list so that registration extends it in place and
# every module that imported it sees the new family
VIDEO_FAMILIES: list[str] = []


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
