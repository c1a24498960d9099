"""Reward functions for trl's GRPOTrainer built from any mmreward reward.

GRPOTrainer calls `f(prompts, completions, completion_ids, **columns)` with every dataset column
repeated per completion and expects one float (or None: "this function does not apply") per
completion; `async def` functions are awaited concurrently with the other reward functions. The
image comes from the `image`/`images` column (what trl's VLM path uses), or from a media
reference in any column (see `media_refs`).

A completion whose image cannot be read or scored gets `failure_value` (default None, which trl
reads as "not applicable" and ignores in the weighted sum); the reason is logged and counted in
`vlm_rm.adapters.scoring.failure_counts`. Mismatched column lengths are a RewardInputError.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mmreward.errors import ConfigError, RewardInputError
from vlm_rm.adapters.media_refs import find_media
from vlm_rm.adapters.scoring import (
    check_failure_value,
    check_template,
    compose_text,
    finite_number,
    prepare_media,
    score_pairs,
)

IMAGE_COLUMNS = ("images", "image")
# What GRPOTrainer passes besides the dataset columns (trl 1.x); never searched for media references.
TRAINER_KWARGS = frozenset({"completion_ids", "trainer_state", "log_extra", "log_metric", "environments", "step",
                            "run_name"})


def _media_per_item(n: int, columns: dict[str, Any], image_column: str | None) -> list[Any]:
    keys = [image_column] if image_column else [k for k in IMAGE_COLUMNS if k in columns]
    for key in keys:
        if key in columns:
            cells = columns[key]
            if not isinstance(cells, (list, tuple)) or len(cells) != n:
                got = f"{len(cells)} entries" if isinstance(cells, (list, tuple)) else type(cells).__name__
                raise RewardInputError(f"trl reward: column '{key}' must hold one image per completion "
                                       f"({n}), got {got}")
            return prepare_media(cells)
    data = [k for k in columns if k not in TRAINER_KWARGS and isinstance(columns[k], list) and len(columns[k]) == n]
    refs = [find_media(*(columns[k][i] for k in data)) for i in range(n)]
    return [r[0] if r else None for r in refs]


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
):
    """A GRPOTrainer reward function: `scale * reward(text, image) + shift` per completion.

    text: what the reward reads: "completion" (e.g. a caption to check against the image),
    "prompt", or "prompt+completion"; or a `template` with {prompt} and {completion}.
    asynchronous: return an `async def` that scores in a worker thread, so trl overlaps it with
    other (e.g. remote judge) reward functions.
    failure_value: what a completion whose image or score fails gets (None = not applicable, or a number).
    """
    # validate the options now, not at the first training step
    check_template(template)
    compose_text(text, "", "", template)
    scale, shift = finite_number(scale, "scale", "trl reward"), finite_number(shift, "shift", "trl reward")
    failure_value = check_failure_value(failure_value, "trl reward", allow_none=True)
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"trl reward: batch_size must be an integer >= 1 or None, got {batch_size!r}")

    def reward_fn(prompts, completions, **columns) -> list[float | None]:
        n = len(completions)
        if prompts and len(prompts) != n:
            raise RewardInputError(f"trl reward: got {len(prompts)} prompts for {n} completions; "
                                   "trl passes one prompt per completion")
        texts = [compose_text(text, prompts[i] if prompts else None, completions[i], template) for i in range(n)]
        media = _media_per_item(n, columns, image_column)
        return score_pairs(reward, texts, media, scale=scale, shift=shift, batch_size=batch_size,
                           failure_value=failure_value)

    async def async_reward_fn(prompts, completions, **columns) -> list[float | None]:
        return await asyncio.to_thread(reward_fn, prompts, completions, **columns)

    fn = async_reward_fn if asynchronous else reward_fn
    fn.__name__ = name or f"mmreward_{getattr(reward, 'name', 'reward')}".replace("-", "_")
    return fn
