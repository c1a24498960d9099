"""Reward functions for trl's GRPOTrainer built from any mmreward reward.

GRPOTrainer calls `f(prompts, completions, completion_ids, **columns)` with every dataset column
repeated per completion and expects one float (or None: "this function does not apply") per
completion; `async def` functions are awaited concurrently with the other reward functions
(trl 1.16.0: `GRPOTrainer._calculate_rewards`). The image comes from the `image`/`images` column
(what trl's VLM path uses), else from the prompt messages (`{"type": "image", "image": ...}` parts,
where trl puts dataset images before generation), else from a media reference in any column (see
`media_refs`).

`reward` is a loaded Reward or a string for `mmreward.load` ("name", "name:tag", "hf-hub:org/repo",
a folder), loaded once here, at construction, with `device`, `dtype`, `weights` and `options`.

A completion whose image cannot be read or scored gets `failure_value` (default None, which trl
reads as "not applicable" and ignores in the weighted sum); the reason is logged and counted in
`vlm_rm.adapters.scoring.failure_counts`. Mismatched column lengths are a RewardInputError.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from mmreward.errors import ConfigError, RewardInputError
from vlm_rm.adapters.media_refs import find_media
from vlm_rm.adapters.scoring import (
    check_failure_value,
    check_template,
    compose_text,
    finite_number,
    message_text,
    prepare_media,
    score_pairs,
)

IMAGE_COLUMNS = ("images", "image")
# where a response reward's reference answer comes from when `reference_column` is not given
REFERENCE_COLUMNS = ("answer", "solution", "ground_truth")
# What GRPOTrainer passes besides the dataset columns (trl 1.x); never searched for media references.
TRAINER_KWARGS = frozenset({"completion_ids", "trainer_state", "log_extra", "log_metric", "environments", "step",
                            "run_name"})


def _prompt_image(prompt: Any) -> Any:
    """The first image part of a conversational prompt (trl inserts dataset images there), or None."""
    if not isinstance(prompt, (list, tuple)):
        return None
    for message in prompt:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, (list, tuple)):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image" and part.get("image") is not None:
                    return part["image"]
    return None


def _media_per_item(n: int, columns: dict[str, Any], image_column: str | None,
                    prompts: Any = None) -> list[Any]:
    keys = [image_column] if image_column else [k for k in IMAGE_COLUMNS if k in columns]
    for key in keys:
        if key in columns:
            cells = columns[key]
            if not isinstance(cells, (list, tuple)) or len(cells) != n:
                got = f"{len(cells)} entries" if isinstance(cells, (list, tuple)) else type(cells).__name__
                raise RewardInputError(f"trl reward: column '{key}' must hold one image per completion "
                                       f"({n}), got {got}")
            return prepare_media(cells)
    if not image_column and prompts:
        embedded = [_prompt_image(p) for p in prompts]
        if any(m is not None for m in embedded):
            return prepare_media(embedded)
    data = [k for k in columns if k not in TRAINER_KWARGS and isinstance(columns[k], list) and len(columns[k]) == n]
    refs = [find_media(*(columns[k][i] for k in data)) for i in range(n)]
    return [r[0] if r else None for r in refs]


def _references(n: int, columns: dict[str, Any], reference_column: str | None) -> list[str | None] | None:
    """The reference answer per completion from a dataset column (None when the dataset has none)."""
    keys = [reference_column] if reference_column else [k for k in REFERENCE_COLUMNS if k in columns]
    if not keys:
        return None
    cells = columns.get(keys[0])
    if not isinstance(cells, (list, tuple)) or len(cells) != n:
        raise RewardInputError(f"trl reward: reference column '{keys[0]}' must hold one answer per completion ({n})")
    return [None if c is None else str(c) for c in cells]


def _load_reward(reward: Any, device: str | None, dtype: str | None, weights: str,
                 options: Mapping[str, Any] | None) -> Any:
    """The reward to score with: a loaded Reward as given, a string loaded now (not at the first step)."""
    if isinstance(reward, (str, os.PathLike)):
        if options is not None and not isinstance(options, Mapping):
            raise ConfigError(f"trl reward: options must be a mapping of loader options, got {type(options).__name__}")
        import mmreward

        return mmreward.load(reward, device=device, dtype=dtype, weights=weights, **dict(options or {}))
    if not callable(getattr(reward, "score", None)):
        raise ConfigError(f"trl reward: expected an mmreward Reward or a reward name such as 'clipscore', "
                          f"got {type(reward).__name__}")
    if device is not None or dtype is not None or options or weights != "pretrained":
        # silently ignoring them would leave a user believing the reward moved to their device
        raise ConfigError("trl reward: device, dtype, weights and options apply when `reward` is a name; "
                          "a loaded Reward is used as it is (call reward.to(...) yourself)")
    return reward


def trl_reward_function(
    reward: Any,
    *,
    text: str = "completion",
    template: str | None = None,
    image_column: str | None = None,
    scale: float = 1.0,
    shift: float = 0.0,
    batch_size: int | None = None,
    asynchronous: bool = False,
    name: str | None = None,
    failure_value: float | None = None,
    device: str | None = None,
    dtype: str | None = None,
    weights: str = "pretrained",
    options: Mapping[str, Any] | None = None,
    reference_column: str | None = None,
):
    """A GRPOTrainer reward function: `scale * reward(text, image) + shift` per completion.

    A response reward (`score_responses`, e.g. shapes-vqa) gets the completion as the response, the
    prompt's text as the question and the `reference_column` cell (default: the first of "answer",
    "solution", "ground_truth" the dataset has, else none) as the reference; `text`/`template` then
    do not apply.

    text: what the reward reads: "completion" (e.g. a caption to check against the image),
    "prompt", or "prompt+completion"; or a `template` with {prompt} and {completion}.
    asynchronous: return an `async def` that scores in a worker thread, so trl overlaps it with
    other (e.g. remote judge) reward functions.
    failure_value: what a completion whose image or score fails gets (None = not applicable, or a number).
    device, dtype, weights, options: how a reward given by name is loaded (`mmreward.load`).
    """
    # validate the options now, not at the first training step
    check_template(template)
    compose_text(text, "", "", template)
    scale, shift = finite_number(scale, "scale", "trl reward"), finite_number(shift, "shift", "trl reward")
    failure_value = check_failure_value(failure_value, "trl reward", allow_none=True)
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"trl reward: batch_size must be an integer >= 1 or None, got {batch_size!r}")
    reward = _load_reward(reward, device, dtype, weights, options)
    from mmreward.types import scores_responses

    responses = scores_responses(reward)
    if reference_column is not None and not responses:
        raise ConfigError(f"trl reward: reference_column applies to response rewards (score_responses); "
                          f"'{getattr(reward, 'name', 'reward')}' scores (text, image) pairs")

    def reward_fn(prompts, completions, **columns) -> list[float | None]:
        n = len(completions)
        if prompts and len(prompts) != n:
            raise RewardInputError(f"trl reward: got {len(prompts)} prompts for {n} completions; "
                                   "trl passes one prompt per completion")
        media = _media_per_item(n, columns, image_column, prompts)
        if responses:
            return score_pairs(reward, [message_text(c) for c in completions], media, scale=scale, shift=shift,
                               batch_size=batch_size, failure_value=failure_value,
                               questions=[message_text(p) for p in prompts] if prompts else None,
                               references=_references(n, columns, reference_column))
        texts = [compose_text(text, prompts[i] if prompts else None, completions[i], template) for i in range(n)]
        return score_pairs(reward, texts, media, scale=scale, shift=shift, batch_size=batch_size,
                           failure_value=failure_value)

    async def async_reward_fn(prompts, completions, **columns) -> list[float | None]:
        return await asyncio.to_thread(reward_fn, prompts, completions, **columns)

    fn = async_reward_fn if asynchronous else reward_fn
    fn.__name__ = name or f"mmreward_{getattr(reward, 'name', 'reward')}".replace("-", "_")
    return fn
