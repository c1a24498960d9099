"""EasyR1 reward functions built from any mmreward reward.

EasyR1 (hiyouga/EasyR1@b44b311, verl/workers/reward/function.py AutoRewardManager) loads
`worker.reward.reward_function=<this file>:compute_score`, reads the module's REWARD_TYPE (default
"batch") and calls `partial(compute_score, **reward_function_kwargs)` with a list of reward inputs
(batch: one reward call for the whole batch) or with one input dict (sequential). The answer is one
dict of named scores per input, "overall" being the training reward.

Where the image comes from: at that commit a reward input is exactly {"response", "response_length",
"ground_truth"}: the dataset's images are popped into multi_modal_data for the rollout and never
reach the reward function. This adapter reads, in order: the input's own media keys
("multi_modal_data": {"images"/"videos": [...]}, "images", "image", "videos"; what a reward manager
that forwards the sample's media would pass), then, as the documented fallback for EasyR1 as released,
a media reference in ground_truth (`media_ref(path, answer=...)`, see media_refs) or extra_info.

A response reward (`score_responses`, e.g. shapes-vqa) gets the response, the question and the reference
answer from ground_truth: `media_ref(path, answer=..., question=...)` (see scoring.response_fields).

reward_function_kwargs choose the reward ({reward: clipscore, checkpoint: ..., device: ..., scale:,
shift:, batch_size:, failure_value:, options: {...}}); other keyword arguments are accepted and ignored.
An input whose medium cannot be read or scored gets `failure_value` (default 0.0, a finite number
as EasyR1's reward tensors need) in every score; the reason is logged and counted in
`vlm_rm.adapters.scoring.failure_counts`. An input without a string "response" or any medium is a
RewardInputError.
"""

from __future__ import annotations

from typing import Any

from mmreward.errors import RewardInputError
from vlm_rm.adapters.media_refs import find_media
from vlm_rm.adapters.scoring import (
    check_failure_value,
    finite_number,
    prepare_media,
    response_fields,
    score_pairs,
)
from vlm_rm.adapters.verl import DEFAULT_FAILURE_VALUE, reward_from_kwargs

REWARD_NAME = "mmreward"
REWARD_TYPE = "batch"  # EasyR1 reads this module constant; sequential calls are served too
MEDIA_KEYS = ("images", "image", "videos", "video")


def _input_media(item: dict[str, Any]) -> Any:
    """The first medium the input itself carries (multi_modal_data or a media key), or None."""
    mm = item.get("multi_modal_data")
    sources = [mm.get(k) for k in MEDIA_KEYS] if isinstance(mm, dict) else []
    sources += [item.get(k) for k in MEDIA_KEYS]
    for value in sources:
        if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
            continue
        return prepare_media([value])[0]  # a path, PIL image, HF {'bytes','path'} dict or a list of these
    return None


def make_compute_score(reward: Any, *, scale: float = 1.0, shift: float = 0.0, key: str | None = None,
                       batch_size: int | None = None, failure_value: float = DEFAULT_FAILURE_VALUE):
    """A compute_score bound to a loaded reward; `key` names the score next to "overall"."""
    key = key or getattr(reward, "name", "reward")
    scale, shift = finite_number(scale, "scale", "EasyR1 reward"), finite_number(shift, "shift", "EasyR1 reward")
    failure_value = check_failure_value(failure_value, "EasyR1 reward", allow_none=False)

    def compute(reward_inputs: Any, **_: Any) -> Any:
        if isinstance(reward_inputs, dict):  # reward_type=sequential: one input, one score dict
            return compute([reward_inputs])[0]
        if not isinstance(reward_inputs, (list, tuple)) or not all(isinstance(it, dict) for it in reward_inputs):
            raise RewardInputError(
                "EasyR1: expected a reward input dict (reward_type=sequential) or a list of them "
                f"(reward_type=batch), got {type(reward_inputs).__name__}"
            )
        media = []
        for i, item in enumerate(reward_inputs):
            if not isinstance(item.get("response"), str):
                got = "no 'response'" if "response" not in item else f"'response' of type {type(item['response']).__name__}"
                raise RewardInputError(f"EasyR1 reward input {i} has {got}; each input needs the decoded response "
                                       "text under 'response' (keys given: " + ", ".join(sorted(map(str, item))) + ")")
            medium = _input_media(item)
            if medium is None:  # EasyR1 as released passes no media: the ground_truth fallback
                found = find_media(item.get("ground_truth"), item.get("extra_info"))
                if found is None:
                    raise RewardInputError(
                        f"EasyR1 reward input {i} has no media reference and no medium of its own: EasyR1 passes only "
                        "response and ground_truth, so store ground_truth as vlm_rm.adapters.media_refs.media_ref('<image path>', answer=...)"
                    )
                medium = found[0]
            media.append(medium)
        fields = [response_fields(it.get("extra_info"), it.get("ground_truth")) for it in reward_inputs]
        values = score_pairs(reward, [it["response"] for it in reward_inputs], media, scale=scale, shift=shift,
                             batch_size=batch_size, failure_value=failure_value,
                             questions=[q for q, _ in fields], references=[r for _, r in fields])
        values = [failure_value if v is None else v for v in values]
        return [{"overall": v, key: v} for v in values]

    return compute


def compute_score(reward_inputs: Any, **reward_kwargs: Any) -> Any:
    """EasyR1 entry point (batch or sequential); reward_kwargs choose the reward, other kwargs are ignored."""
    cfg = reward_from_kwargs(reward_kwargs, trainer="EasyR1")
    return make_compute_score(cfg.reward, scale=cfg.scale, shift=cfg.shift, batch_size=cfg.batch_size,
                              failure_value=cfg.failure_value)(reward_inputs)
