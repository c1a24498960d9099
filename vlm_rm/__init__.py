"""vlm_rm: CLIP/VLM zero-shot rewards for RL environments, a reward-model benchmark harness, and adapters that
feed mmreward rewards into MLLM RL trainers (trl, verl, EasyR1).

    >>> from vlm_rm import trl_reward_function
    >>> reward_fn = trl_reward_function("shapes-vqa")   # pass to trl.GRPOTrainer(reward_funcs=[reward_fn])

The names below are imported on first use, so `import vlm_rm` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "VLMRMReward": "vlm_rm.clip_reward",
    "vlm_rm_reward": "vlm_rm.clip_reward",
    "run_benchmark": "vlm_rm.bench.api",
    "trl_reward_function": "vlm_rm.adapters.trl",
    "media_ref": "vlm_rm.adapters.media_refs",
}

__all__ = ["VLMRMReward", "easyr1", "media_ref", "run_benchmark", "trl_reward_function", "verl", "vlm_rm_reward"]

if TYPE_CHECKING:
    from vlm_rm.adapters import easyr1, verl
    from vlm_rm.adapters.media_refs import media_ref
    from vlm_rm.adapters.trl import trl_reward_function
    from vlm_rm.bench.api import run_benchmark
    from vlm_rm.clip_reward import VLMRMReward, vlm_rm_reward


def __getattr__(name: str) -> Any:
    if name in ("verl", "easyr1"):  # the trainer adapters, as modules: vlm_rm.verl.compute_score
        value = importlib.import_module(f"vlm_rm.adapters.{name}")
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module 'vlm_rm' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
