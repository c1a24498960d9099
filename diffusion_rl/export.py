"""Trained weights in the formats diffusers loads: what `final/` of a run holds.

- LoRA: `pytorch_lora_weights.safetensors` written by the pipeline class's own `save_lora_weights`, with the
  adapter's peft config (`r`, `lora_alpha`, `target_modules`, ...) in the safetensors header, so
  `pipe.load_lora_weights(final)` rebuilds the adapter with the trained scaling `lora_alpha / r`. Without that
  header diffusers assumes `lora_alpha = r`, which scales the trained update by `r / lora_alpha`.
- A denoiser made of several pipeline components (Wan 2.2 A14B's two experts, `WanExperts`) writes one LoRA
  folder per trained component, named after the pipeline attribute, because diffusers' `WanLoraLoaderMixin` loads
  one file per expert, its keys under the `transformer.` prefix in both: `pipe.load_lora_weights(final /
  "transformer")` for the high-noise expert and `pipe.load_lora_weights(final / "transformer_2",
  load_into_transformer_2=True)` for the low-noise one. Nothing sits at the top of `final/`, so a plain
  `load_lora_weights(final)` fails instead of loading one expert's update into the other.
- Full fine-tune: the whole pipeline (`model_index.json` and every component, safetensors) with the trained
  denoiser in place, so `DiffusionPipeline.from_pretrained(final)` is the trained model. Under FSDP the
  denoiser's shards are first gathered through `torch.distributed.checkpoint.state_dict`, as checkpoints are,
  into a plain copy of the model that the pipeline saves like any other (`export_sharded_pipeline`).

Both are written into a hidden temporary folder that is renamed into place once complete, so a run killed
mid-export never leaves a half-written `final/` (an earlier complete export stays until the new one is done).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mmreward.errors import CheckpointError, ConfigError

LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"  # the name `load_lora_weights(folder)` looks for


@contextlib.contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to write into; on success it replaces `path` (a rename), on error it
    is removed and `path` is left as it was."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"export: {path} exists and is not a folder; remove it or export elsewhere")
    path.parent.mkdir(parents=True, exist_ok=True)
    from mmreward.output_paths import remove_dead_temporaries

    remove_dead_temporaries(path.parent, path.name)  # left by an export that was killed (SIGTERM, SIGKILL)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    old = path.parent / f".{path.name}.old-{os.getpid()}"
    for stale in (tmp, old):
        if stale.exists():
            shutil.rmtree(stale)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def lora_layers_and_metadata(model: torch.nn.Module, family: str,
                             adapter_name: str = "default") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The adapter's weights as diffusers' training scripts hand them to `save_lora_weights` (UNet weights
    converted to diffusers' key names, transformer weights in peft's), and its peft config as metadata."""
    from peft.utils import get_peft_model_state_dict

    configs = getattr(model, "peft_config", None) or {}
    if adapter_name not in configs:
        raise ConfigError(f"export: the denoiser has no LoRA adapter named {adapter_name!r} (adapters: "
                          f"{sorted(configs)}); export a LoRA run, or a full fine-tune with model.lora=false")
    layers = get_peft_model_state_dict(model, adapter_name=adapter_name)
    if family in ("sd", "sdxl"):
        from diffusers.utils import convert_state_dict_to_diffusers

        layers = convert_state_dict_to_diffusers(layers)
    # the values are the parameters themselves (holding the EMA weights inside `Policy.averaged`), saved before
    # the block ends; safetensors wants them whole (FSDP shards gathered: a collective, in the same order on
    # every process), contiguous and on the CPU
    from torch.distributed.tensor import DTensor

    layers = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().contiguous()
              for k, v in layers.items()}
    return layers, configs[adapter_name].to_dict()


def denoiser_components(model: torch.nn.Module, denoiser_attr: str) -> dict[str, torch.nn.Module]:
    """The pipeline components the trained denoiser stands for, by pipeline attribute: `{denoiser_attr: model}`,
    or, for a module holding several (Wan 2.2's `WanExperts`), what its `pipeline_components()` names."""
    named = getattr(model, "pipeline_components", None)
    return dict(named()) if callable(named) else {denoiser_attr: model}


def export_lora(pipeline: Any, model: torch.nn.Module, denoiser_attr: str, family: str, path: str | Path,
                is_main_process: bool = True) -> Path:
    """Write the denoiser's LoRA adapter to `path` with the pipeline class's `save_lora_weights`, alpha and
    target modules included; `pipe.load_lora_weights(path)` on the base pipeline restores the trained model.
    A denoiser of several components writes one subfolder per component that has an adapter (module docstring).
    Under FSDP every process calls it (the shards are gathered) and only the main process writes."""
    components = denoiser_components(model, denoiser_attr)
    path = Path(path)
    save = getattr(type(pipeline), "save_lora_weights", None)
    if save is None and len(components) == 1:
        # a pipeline class without a LoRA loader mixin (HunyuanVideo15Pipeline in diffusers 0.42): the model's own
        # PEFT adapter file, which `pipe.transformer.load_lora_adapter(path, prefix=None)` reads back
        module = next(iter(components.values()))
        if not hasattr(module, "save_lora_adapter"):
            raise ConfigError(f"export: {type(pipeline).__name__} has no save_lora_weights and its {denoiser_attr} "
                              "has no save_lora_adapter; export a full fine-tune (model.lora=false) instead")
        if not is_main_process:
            return path
        with atomic_folder(path) as tmp:
            module.save_lora_adapter(str(tmp), adapter_name="default", weight_name=LORA_WEIGHT_NAME)
        return path
    if len(components) == 1:
        layers, metadata = lora_layers_and_metadata(model, family)
        if not is_main_process:
            return path
        with atomic_folder(path) as tmp:
            save(str(tmp), **{f"{denoiser_attr}_lora_layers": layers,
                              f"{denoiser_attr}_lora_adapter_metadata": metadata},
                 weight_name=LORA_WEIGHT_NAME, safe_serialization=True)
        return path
    # every process gathers the same components in the same order (FSDP collectives)
    per_component = {attr: lora_layers_and_metadata(module, family) for attr, module in components.items()
                     if "default" in (getattr(module, "peft_config", None) or {})}
    if not per_component:
        raise ConfigError(f"export: none of the denoiser's components {sorted(components)} has a LoRA adapter; "
                          "export a LoRA run, or a full fine-tune with model.lora=false")
    if not is_main_process:
        return path
    # the loader's save_lora_weights takes its primary transformer's layers only; `load_into_transformer_2`
    # reads the same `transformer.` prefix, so every component's file is written under that name
    name = getattr(type(pipeline), "transformer_name", denoiser_attr)
    with atomic_folder(path) as tmp:
        for attr, (layers, metadata) in per_component.items():
            save(str(tmp / attr), **{f"{name}_lora_layers": layers, f"{name}_lora_adapter_metadata": metadata},
                 weight_name=LORA_WEIGHT_NAME, safe_serialization=True)
    return path


def export_pipeline(pipeline: Any, model: torch.nn.Module, denoiser_attr: str, path: str | Path) -> Path:
    """Write the whole pipeline with `model` as its denoiser (safetensors, diffusers' folder layout), so that
    `DiffusionPipeline.from_pretrained(path)` loads the trained model. Components keep their dtypes: the
    denoiser is saved in its training precision (fp32 master weights); pass `torch_dtype` when loading.
    A denoiser of several components (Wan 2.2's experts) puts each in its own pipeline attribute."""
    components = denoiser_components(model, denoiser_attr)
    originals = {attr: getattr(pipeline, attr) for attr in components}
    path = Path(path)
    with atomic_folder(path) as tmp:
        # the pipeline may hold the module the accelerator wrapped, or a different object under DDP: save the
        # trained one, then put back whatever was there
        try:
            for attr, module in components.items():
                setattr(pipeline, attr, module)
            pipeline.save_pretrained(str(tmp), safe_serialization=True)
        finally:
            for attr, module in originals.items():
                setattr(pipeline, attr, module)
    return path


def _unsharded_class(model: torch.nn.Module) -> type:
    """The model's own class: `fully_shard` swaps a module's class for a generated `FSDP<Class>` subclass,
    whose name must not reach config.json (`from_pretrained` looks the class up by that name)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def export_sharded_pipeline(pipeline: Any, model: torch.nn.Module, denoiser_attr: str, path: str | Path,
                            is_main_process: bool) -> Path:
    """FSDP full fine-tune: the same complete pipeline folder as `export_pipeline`. A collective: every process
    calls it; the full weights are gathered onto the main process's CPU (torch's `get_model_state_dict`, the
    API checkpoints use), loaded into an unsharded copy of the denoiser built without allocating its weights
    twice (`init_empty_weights` + `assign=True`), and the main process writes the folder."""
    from accelerate import init_empty_weights
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if len(denoiser_components(model, denoiser_attr)) > 1:  # checked before the collective: every process raises
        raise ConfigError(f"export: a full FSDP fine-tune of a denoiser with several components "
                          f"({sorted(denoiser_components(model, denoiser_attr))}, Wan 2.2's experts) cannot be "
                          "exported as a pipeline folder yet; train with model.lora=true, or without FSDP")
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not is_main_process:
        return Path(path)
    with init_empty_weights():  # parameters on the meta device; buffers (e.g. non-persistent ones) built for real
        plain = _unsharded_class(model).from_config(model.config)
    try:
        plain.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise CheckpointError(f"export: the gathered FSDP weights do not fit {type(plain).__name__} ({exc})") from None
    return export_pipeline(pipeline, plain.eval(), denoiser_attr, path)
