"""The run's `accelerate.Accelerator`, built the way accelerate users expect.

- Launch settings win unless the config names a value: `train.mixed_precision` unset (the default) leaves
  mixed precision to `accelerate launch --mixed_precision ...` / the accelerate config file (both reach
  the process as ACCELERATE_MIXED_PRECISION); set, it overrides them.
- Trackers are accelerate's (`log_with=log.trackers`, `project_dir=log.output_dir`); `init_trackers` gets
  `log.project`, and W&B the run name and tags.
- Distributed set-ups come from the launch config (configs/accelerate/{ddp,fsdp,deepspeed_zero2}.yaml).
  Two cases accelerate 1.x would not run as asked without saying so are refused here with one line:
  FSDP or DeepSpeed on CPU (accelerate falls back to plain DDP) and DeepSpeed without the package.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

from diffusion_rl.config import LogConfig, RunConfig
from mmreward.errors import ConfigError, require

_TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def check_launch_backend() -> None:
    """Refuse launch configurations that accelerate would silently run as something else."""
    on_cpu = _env_flag("ACCELERATE_USE_CPU") or not torch.cuda.is_available()
    if _env_flag("ACCELERATE_USE_DEEPSPEED"):
        if on_cpu:
            raise ConfigError("DeepSpeed needs CUDA GPUs (accelerate runs it on no CPU set-up): on CPU launch with "
                              "configs/accelerate/ddp.yaml; on GPUs `pip install deepspeed` and launch there")
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError("the accelerate config asks for DeepSpeed, which is not installed: `pip install "
                              "deepspeed` (needs CUDA), or launch with configs/accelerate/fsdp.yaml")
    if _env_flag("ACCELERATE_USE_FSDP") and on_cpu:
        raise ConfigError("FSDP needs GPUs under accelerate (on CPU it would quietly run plain DDP): launch with "
                          "configs/accelerate/ddp.yaml on CPU")


def name_fsdp_blocks(accelerator: Any, block_classes: tuple[str, ...]) -> list[str] | None:
    """Shard each transformer block on its own under FSDP2 (accelerate's TRANSFORMER_BASED_WRAP): fill the plugin's
    `transformer_cls_names_to_wrap` with the adapter's `block_classes` before `prepare`, unless the launch config
    names classes itself (`fsdp_transformer_layer_cls_to_wrap`, which wins). Without this accelerate falls back to
    the model's `_no_split_modules`, which LTX and LTX-2 do not declare (the whole transformer would be one FSDP
    unit, gathered whole for every forward pass) and which lists patch embedders and refiners for others.
    Returns the names in force, or None when the run is not FSDP with a transformer-based wrap policy."""
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is None:
        return None
    policy = getattr(plugin.auto_wrap_policy, "func", plugin.auto_wrap_policy)
    if policy is not transformer_auto_wrap_policy:
        return None
    if plugin.transformer_cls_names_to_wrap is None and block_classes:
        plugin.transformer_cls_names_to_wrap = list(block_classes)
    return list(plugin.transformer_cls_names_to_wrap or [])


def tracker_init_kwargs(log: LogConfig, output_dir: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Per-tracker keyword arguments for `Accelerator.init_trackers`: W&B takes the run name and tags (the
    other trackers' constructors name runs differently, so they keep their own defaults), and writes its
    `wandb/` folder under the run's output folder, not the working directory."""
    if "wandb" not in log.all_trackers():
        return {}
    return {"wandb": {"tags": list(log.tags), **({"name": log.run_name} if log.run_name else {}),
                      **({"dir": str(output_dir)} if output_dir is not None else {})}}


def make_accelerator(cfg: RunConfig) -> Any:
    """The Accelerator for `cfg` (see the module docstring for what wins over what)."""
    from accelerate import Accelerator

    check_launch_backend()
    trackers = cfg.log.all_trackers()
    for name in trackers:
        if name in _TRACKER_PACKAGES:  # accelerate would only warn and log nowhere
            require(_TRACKER_PACKAGES[name], "tracking", f"log.trackers: {name}")
    kwargs: dict[str, Any] = {}
    if cfg.train.mixed_precision is not None:
        kwargs["mixed_precision"] = cfg.train.mixed_precision
    return Accelerator(log_with=trackers or None, project_dir=cfg.log.output_dir, **kwargs)


def flat_config(cfg: RunConfig) -> dict[str, Any]:
    """The config as one level of `section.key` scalars: TensorBoard's hparams take no lists or nesting."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (bool, int, float, str)):
            out[prefix] = value
        else:
            out[prefix] = str(value)

    walk("", cfg.to_dict())
    return out
