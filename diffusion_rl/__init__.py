"""diffusion_rl: reward fine-tuning of diffusers pipelines and inference-time reward optimisation.

    >>> from diffusion_rl import load_config, train
    >>> cfg = load_config("configs/shapes_grpo.yaml", ["train.iterations=2"])
    >>> trainer = train(cfg)                      # prompt -> rollout -> reward -> advantage -> loss -> step

The names below are imported on first use, so `import diffusion_rl` stays cheap (no diffusers import).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "RunConfig": "diffusion_rl.config",
    "load_config": "diffusion_rl.config",
    "save_config": "diffusion_rl.config",
    "from_dict": "diffusion_rl.config",
    "Trainer": "diffusion_rl.trainer",
    "train": "diffusion_rl.trainer",
    "make_algorithm": "diffusion_rl.algorithms",
    "register_adapter": "diffusion_rl.adapters.registry",
    "load_pipeline": "diffusion_rl.pipelines",
    "make_adapter": "diffusion_rl.pipelines",
}

__all__ = ["RunConfig", "Trainer", "from_dict", "load_config", "load_pipeline", "make_adapter", "make_algorithm",
           "register_adapter", "save_config", "train"]

if TYPE_CHECKING:
    from diffusion_rl.adapters.registry import register_adapter
    from diffusion_rl.algorithms import make_algorithm
    from diffusion_rl.config import RunConfig, from_dict, load_config, save_config
    from diffusion_rl.pipelines import load_pipeline, make_adapter
    from diffusion_rl.trainer import Trainer, train


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'diffusion_rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
