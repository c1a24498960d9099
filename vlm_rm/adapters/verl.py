"""verl custom reward functions built from any mmreward reward.

verl calls the function named by `custom_reward_function.name` with keyword arguments:

  - Reward Loop (verl's default): `compute_score(data_source=, solution_str=, ground_truth=,
    extra_info=, reward_router_address=, reward_model_tokenizer=, ...)` per sample, awaited when the
    function is `async def` (name `compute_score_async` here: concurrent samples of a worker are
    scored together in one reward call), else run in a thread pool (`compute_score`);
  - NaiveRewardManager: `compute_score(data_source, solution_str, ground_truth, extra_info)`;
  - BatchRewardManager (`reward_model.reward_manager=batch`): `compute_score_batch(data_sources=,
    solution_strs=, ground_truths=, extra_infos=)` on the whole batch.

Every entry point also receives `custom_reward_function.reward_kwargs`, which choose the reward:
{reward: clipscore, checkpoint: ..., device: cuda, dtype: float16, weights: pretrained, scale: 1.0,
shift: 0.0, batch_size: 64, failure_value: 0.0, options: {<loader options>}}. Any other keyword argument (verl adds new
ones between releases) is accepted and ignored. The reward is loaded once per worker process.

verl's reward workers never see the images, so each sample carries a media reference in extra_info
or ground_truth (see media_refs). A sample whose medium cannot be read or scored (or whose score is
NaN) gets `failure_value` (default 0.0: verl needs a finite number for every sample); the reason is
logged and counted in `vlm_rm.adapters.scoring.failure_counts`. A sample without a media reference,
mismatched batch lengths and a non-finite scale/shift/failure_value are typed errors.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from mmreward.errors import ConfigError, RewardInputError
from vlm_rm.adapters.media_refs import find_media
from vlm_rm.adapters.scoring import check_failure_value, finite_number, score_pairs

logger = logging.getLogger(__name__)

# The keys of custom_reward_function.reward_kwargs that this adapter reads.
CONFIG_KEYS = frozenset({"reward", "checkpoint", "device", "dtype", "weights", "scale", "shift", "batch_size",
                         "failure_value", "options"})
DEFAULT_FAILURE_VALUE = 0.0
# What verl's reward managers pass on their own; never meant for us, so ignored without a warning.
VERL_RUNTIME_KWARGS = frozenset({
    "reward_router_address", "reward_model_tokenizer", "reward_model", "strict_box_verify", "return_dict",
    "sandbox_fusion_url", "concurrent_semaphore", "memory_limit_mb", "tokenizer",
})
_warned: set[str] = set()
# the Reward Loop runs sync compute_score in a thread pool: load the reward once, not once per thread
_load_lock = threading.Lock()


@lru_cache(maxsize=4)
def _cached_reward(name: str, checkpoint: str | None, device: str | None, dtype: str | None, weights: str,
                   options_json: str):
    import mmreward

    return mmreward.load(name, checkpoint=checkpoint, device=device, dtype=dtype, weights=weights,
                         **json.loads(options_json))


class RewardConfig:
    """The reward a trainer's kwargs choose, plus how its values are shaped and batched."""

    def __init__(self, reward: Any, scale: float, shift: float, batch_size: int | None, key: tuple,
                 failure_value: float = DEFAULT_FAILURE_VALUE) -> None:
        self.reward, self.scale, self.shift, self.batch_size, self.key = reward, scale, shift, batch_size, key
        self.failure_value = failure_value


def split_kwargs(kwargs: dict[str, Any], trainer: str = "verl") -> dict[str, Any]:
    """The adapter's own settings from a trainer's keyword arguments; everything else is ignored."""
    unknown = sorted(k for k in kwargs if k not in CONFIG_KEYS and k not in VERL_RUNTIME_KWARGS)
    fresh = [k for k in unknown if k not in _warned]
    if fresh:
        _warned.update(fresh)
        # a typo in reward_kwargs (e.g. 'chekpoint') would otherwise go unnoticed
        logger.warning("%s reward: ignoring keyword arguments %s; the adapter reads %s (loader options go "
                       "under options: {...})", trainer, fresh, sorted(CONFIG_KEYS))
    return {k: v for k, v in kwargs.items() if k in CONFIG_KEYS}


def reward_from_kwargs(kwargs: dict[str, Any], trainer: str = "verl") -> RewardConfig:
    """Load (once per process) the reward named by a trainer's reward kwargs."""
    opts = split_kwargs(kwargs, trainer)
    options = opts.get("options") or {}
    if not isinstance(options, dict):
        raise ConfigError(f"{trainer} reward kwargs: options must be a mapping of loader options, "
                          f"got {type(options).__name__}")
    from mmreward.registry import refuse_load_arguments

    refuse_load_arguments(options, f"{trainer} reward kwargs: options", "set them as reward kwargs beside "
                          "options (e.g. device: cuda), not inside it")
    try:
        options_json = json.dumps(dict(options), sort_keys=True)
    except TypeError as exc:
        raise ConfigError(f"{trainer} reward kwargs: options must hold plain values (str, number, bool, "
                          f"list, dict): {exc}") from exc
    where = f"{trainer} reward kwargs"
    scale, shift = finite_number(opts.get("scale", 1.0), "scale", where), finite_number(opts.get("shift", 0.0), "shift", where)
    failure_value = check_failure_value(opts.get("failure_value", DEFAULT_FAILURE_VALUE), where, allow_none=False)
    try:
        batch_size = None if opts.get("batch_size") is None else int(opts["batch_size"])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{trainer} reward kwargs: batch_size must be an integer: {exc}") from exc
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"{trainer} reward kwargs: batch_size must be >= 1, got {batch_size}")
    checkpoint, device, dtype = (None if opts.get(k) is None else str(opts[k]) for k in ("checkpoint", "device", "dtype"))
    key = (str(opts.get("reward", "clipscore")), checkpoint, device, dtype, str(opts.get("weights", "pretrained")),
           options_json)
    with _load_lock:
        reward = _cached_reward(*key)
    return RewardConfig(reward, scale, shift, batch_size, key + (scale, shift, batch_size, failure_value), failure_value)


def _sample_media(data_source: Any, ground_truth: Any, extra_info: Any) -> str:
    found = find_media(extra_info, ground_truth)
    if found is None:
        raise RewardInputError(
            f"verl sample from {data_source!r} carries no media reference: put "
            "{'mmreward_media': '<image path>'} in extra_info or ground_truth (see vlm_rm.adapters.media_refs)"
        )
    return found[0]


def _values(values: Sequence[float | None], failure_value: float) -> list[float]:
    # verl needs a number for every sample (media are never None here, so None cannot come back)
    return [failure_value if v is None else v for v in values]


def make_compute_score(reward: Any, *, scale: float = 1.0, shift: float = 0.0, batch: bool = False,
                       batch_size: int | None = None, failure_value: float = DEFAULT_FAILURE_VALUE):
    """A verl compute_score (per-sample, or batched with batch=True) bound to a loaded reward."""
    where = "verl compute_score"
    scale, shift = finite_number(scale, "scale", where), finite_number(shift, "shift", where)
    failure_value = check_failure_value(failure_value, where, allow_none=False)

    def one(data_source, solution_str, ground_truth, extra_info=None, **_: Any) -> float:
        media = _sample_media(data_source, ground_truth, extra_info)
        return _values(score_pairs(reward, [solution_str], [media], scale=scale, shift=shift,
                                   failure_value=failure_value), failure_value)[0]

    def many(data_sources, solution_strs, ground_truths, extra_infos=None, **_: Any) -> list[float]:
        n = len(solution_strs)
        extra_infos = [None] * n if extra_infos is None else list(extra_infos)
        if not len(data_sources) == len(ground_truths) == len(extra_infos) == n:
            raise RewardInputError(
                f"verl batch: data_sources, solution_strs, ground_truths and extra_infos must have one entry per "
                f"sample; got {len(data_sources)}, {n}, {len(ground_truths)}, {len(extra_infos)}"
            )
        media = [_sample_media(s, g, i) for s, g, i in zip(data_sources, ground_truths, extra_infos)]
        return _values(score_pairs(reward, list(solution_strs), media, scale=scale, shift=shift,
                                   batch_size=batch_size, failure_value=failure_value), failure_value)

    return many if batch else one


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs: Any) -> float:
    """verl entry point (per sample); reward kwargs choose the reward, verl's own kwargs are ignored."""
    cfg = reward_from_kwargs(kwargs)
    return make_compute_score(cfg.reward, scale=cfg.scale, shift=cfg.shift, failure_value=cfg.failure_value)(
        data_source, solution_str, ground_truth, extra_info
    )


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, **kwargs: Any) -> list[float]:
    """verl entry point for reward_manager=batch: one reward call per batch_size samples."""
    cfg = reward_from_kwargs(kwargs)
    return make_compute_score(cfg.reward, scale=cfg.scale, shift=cfg.shift, batch=True, batch_size=cfg.batch_size,
                              failure_value=cfg.failure_value)(
        data_sources, solution_strs, ground_truths, extra_infos
    )


class _MicroBatcher:
    """Scores the samples that verl's Reward Loop awaits concurrently in one reward call.

    The first waiting sample starts a drain task; samples that arrive while a batch is being scored
    (in a worker thread, so the event loop keeps serving verl) form the next batch.
    """

    def __init__(self, cfg: RewardConfig) -> None:
        self.cfg = cfg
        self.pending: list[tuple[str, str, asyncio.Future]] = []
        self.draining = False

    async def score(self, text: str, media: str) -> float:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((text, media, fut))
        if not self.draining:
            self.draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            await asyncio.sleep(0)  # let the samples gathered in the same tick join this batch
            while self.pending:
                limit = self.cfg.batch_size or len(self.pending)
                batch, self.pending = self.pending[:limit], self.pending[limit:]
                try:
                    values = await asyncio.to_thread(
                        score_pairs, self.cfg.reward, [t for t, _, _ in batch], [m for _, m, _ in batch],
                        scale=self.cfg.scale, shift=self.cfg.shift, failure_value=self.cfg.failure_value,
                    )
                except Exception as exc:  # handed to every waiting sample, not swallowed
                    for _, _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, _, fut), value in zip(batch, _values(values, self.cfg.failure_value)):
                    if not fut.done():
                        fut.set_result(value)
        finally:
            self.draining = False


# one batcher per (event loop, reward config): futures belong to the loop that created them
_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, _MicroBatcher]] = weakref.WeakKeyDictionary()


async def compute_score_async(data_source, solution_str, ground_truth, extra_info=None, **kwargs: Any) -> float:
    """verl Reward Loop entry point (`custom_reward_function.name=compute_score_async`).

    Concurrent calls in one worker are scored together (up to batch_size per reward call).
    """
    media = _sample_media(data_source, ground_truth, extra_info)
    cfg = reward_from_kwargs(kwargs)
    per_loop = _batchers.setdefault(asyncio.get_running_loop(), {})
    batcher = per_loop.get(cfg.key)
    if batcher is None:
        batcher = per_loop[cfg.key] = _MicroBatcher(cfg)
    return await batcher.score(solution_str, media)
