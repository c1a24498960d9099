"""verl custom reward functions built from any mmreward reward.

verl 0.9.1 (PyPI wheel verl==0.9.1; verl/experimental/reward_loop) scores every sample in its Reward
Loop. The config names the function and the manager that calls it:

  reward.custom_reward_function.path=<this file>  reward.custom_reward_function.name=<entry point>
  reward.custom_reward_function.reward_kwargs={reward: clipscore, ...}
  reward.reward_manager.name=naive | dapo | gdpo | remote | rate_limited

(the legacy keys custom_reward_function.* and reward_model.reward_manager are migrated to these).
Every manager calls, per sample and with keywords only, `compute_score(data_source=, solution_str=,
ground_truth=, extra_info=)` plus `reward_router_address=, reward_model_tokenizer=` when verl runs a
reward model, the reward_kwargs merged in (verl.trainer.ppo.reward.get_custom_reward_fn):

  - naive, dapo, gdpo, rate_limited: an `async def` is awaited (`compute_score_async` here: the
    samples a worker awaits together are scored in one reward call), a plain function runs in a
    thread pool (`compute_score`);
  - remote: the function runs in Ray worker processes (`reward.num_workers`), sync only (verl asserts
    it is not async): use `compute_score`. It is a process pool, not an HTTP client; to share one GPU
    reward between those workers, run `mmreward serve` and pass `server: http://host:port` (the
    bearer token from $MMREWARD_TOKEN) instead of `reward`.

The answer is a float, or with `details: true` a dict {"score": <training reward>, <name>: <raw
score>, ...}: verl stores every key of that dict per sample (reward_extra_info), which is what
GDPO needs: `algorithm.adv_estimator=gdpo algorithm.gdpo_reward_keys=[<names>]` normalises each
component within its group before the weighted sum (verl.trainer.ppo.core_algos
compute_gdpo_outcome_advantage). Name several rewards with `rewards: {name: weight, ...}` (a weighted
sum whose components are the keys), or use one reward's own details.

`compute_score_batch` serves verl releases before the Reward Loop (verl.workers.reward_manager.batch,
`reward_model.reward_manager=batch`); verl 0.9.1's trainer no longer registers a `batch` manager.

A response reward (`score_responses`, e.g. shapes-vqa) gets solution_str as the response, the question
from extra_info["question"] and the reference from ground_truth (see scoring.response_fields). The ShapesWorld VQA
world (`mmreward.synthetic.vqa.to_verl_rows`) runs through verl 0.9.1's own RLHFDataset, reward managers
(naive, dapo) and RewardLoopManager.compute_rm_score in tests/vlm_rm/test_verl_reward_loop.py.

reward_kwargs choose the reward: {reward: clipscore | rewards: {name: weight}, checkpoint: ..., device:
cuda, dtype: float16, weights: pretrained, scale: 1.0, shift: 0.0, batch_size: 64, failure_value: 0.0,
details: false, server: null, options: {<loader options>}}. Any other keyword argument (verl adds new
ones between releases) is accepted and ignored. The reward is loaded once per worker process.

verl's reward functions never see the images (non_tensor_batch's multi_modal_data is not passed), so
each sample carries a media reference in extra_info or ground_truth (see media_refs). A sample whose
medium cannot be read or scored (or whose score is NaN) gets `failure_value` (default 0.0: verl needs a
finite number for every sample; with details, every component gets it too, so each sample has the same
keys); the reason is logged and counted in `vlm_rm.adapters.scoring.failure_counts`. A sample without a
media reference, mismatched batch lengths and a non-finite scale/shift/failure_value are typed errors.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from mmreward.errors import ConfigError, RewardInputError
from vlm_rm.adapters.media_refs import find_media
from vlm_rm.adapters.scoring import check_failure_value, finite_number, response_fields, score_pairs_detailed

logger = logging.getLogger(__name__)

# The keys of custom_reward_function.reward_kwargs that this adapter reads.
CONFIG_KEYS = frozenset({"reward", "rewards", "checkpoint", "device", "dtype", "weights", "scale", "shift",
                         "batch_size", "failure_value", "details", "server", "options"})
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
                   options_json: str, rewards_json: str | None = None, server: str | None = None):
    import mmreward

    if server is not None:  # one served reward shared by every worker (verl's remote manager runs many)
        from mmreward.serve import RewardClient

        return RewardClient(server, token=os.environ.get("MMREWARD_TOKEN"))
    if rewards_json is not None:  # a weighted sum whose details are the components, for GDPO
        from mmreward.compose import WeightedSum

        weights_by_name = json.loads(rewards_json)
        members = {n: mmreward.load(n, device=device, dtype=dtype, weights=weights) for n in weights_by_name}
        return WeightedSum(members, weights_by_name)
    return mmreward.load(name, checkpoint=checkpoint, device=device, dtype=dtype, weights=weights,
                         **json.loads(options_json))


class RewardConfig:
    """The reward a trainer's kwargs choose, plus how its values are shaped and batched."""

    def __init__(self, reward: Any, scale: float, shift: float, batch_size: int | None, key: tuple,
                 failure_value: float = DEFAULT_FAILURE_VALUE, details: bool = False) -> None:
        self.reward, self.scale, self.shift, self.batch_size, self.key = reward, scale, shift, batch_size, key
        self.failure_value, self.details = failure_value, details


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
    details = opts.get("details", False)
    if not isinstance(details, bool):
        raise ConfigError(f"{where}: details must be true or false, got {details!r}")
    rewards_json = _rewards_json(opts, where)
    server = opts.get("server")
    if server is not None and (not isinstance(server, str) or not server.startswith(("http://", "https://"))):
        raise ConfigError(f"{where}: server must be the URL of `mmreward serve` (http://host:port), got {server!r}")
    chosen = [k for k in ("reward", "rewards", "server") if opts.get(k) is not None]
    if len(chosen) > 1:
        raise ConfigError(f"{where}: name the reward once: one of reward, rewards or server, got {chosen}")
    if (rewards_json or server) and (checkpoint is not None or options):
        raise ConfigError(f"{where}: checkpoint and options apply to a single `reward`; with rewards/server "
                          "name each reward by name or name:tag")
    key = (str(opts.get("reward", "clipscore")), checkpoint, device, dtype, str(opts.get("weights", "pretrained")),
           options_json, rewards_json, server)
    with _load_lock:
        reward = _cached_reward(*key)
    return RewardConfig(reward, scale, shift, batch_size, key + (scale, shift, batch_size, failure_value, details),
                        failure_value, details)


def _rewards_json(opts: dict[str, Any], where: str) -> str | None:
    """`rewards: {name: weight}` as canonical JSON (the cache key), or None when not given."""
    rewards = opts.get("rewards")
    if rewards is None:
        return None
    if not isinstance(rewards, dict) or not rewards:
        raise ConfigError(f"{where}: rewards must be a non-empty mapping {{name: weight}}, got {rewards!r}")
    clean = {}
    for name, weight in rewards.items():
        if not isinstance(name, str) or not name or name == "score":
            # 'score' is verl's key for the training reward itself
            raise ConfigError(f"{where}: rewards: names must be reward names other than 'score', got {name!r}")
        clean[name] = finite_number(weight, f"rewards[{name!r}]", where)
    return json.dumps(clean, sort_keys=True)


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


# the component names each reward reported, so that a failed sample gets the same keys (verl stacks
# reward_extra_info key by key over the batch and fails on a key missing from one sample)
_detail_keys: dict[int, list[str]] = {}


def _answers(reward: Any, rows: Sequence[tuple[float | None, dict[str, float]]], failure_value: float,
             details: bool) -> list[Any]:
    """Floats, or with details one {"score": ..., <component>: ...} dict per sample with the same keys."""
    values = _values([v for v, _ in rows], failure_value)
    if not details:
        return values
    keys = list(getattr(reward, "member_names", None) or [])
    if not keys:
        keys = next((list(d) for _, d in rows if d), None) or _detail_keys.get(id(reward), [])
    _detail_keys[id(reward)] = keys
    return [{"score": v, **{k: d.get(k, failure_value) for k in keys}} for v, (_, d) in zip(values, rows)]


def make_compute_score(reward: Any, *, scale: float = 1.0, shift: float = 0.0, batch: bool = False,
                       batch_size: int | None = None, failure_value: float = DEFAULT_FAILURE_VALUE,
                       details: bool = False):
    """A verl compute_score (per-sample, or batched with batch=True) bound to a loaded reward.

    details=True answers {"score": value, <component>: raw score, ...} per sample (for GDPO).
    """
    where = "verl compute_score"
    scale, shift = finite_number(scale, "scale", where), finite_number(shift, "shift", where)
    failure_value = check_failure_value(failure_value, where, allow_none=False)

    def one(data_source, solution_str, ground_truth, extra_info=None, **_: Any) -> Any:
        media = _sample_media(data_source, ground_truth, extra_info)
        question, reference = response_fields(extra_info, ground_truth)
        rows = score_pairs_detailed(reward, [solution_str], [media], scale=scale, shift=shift,
                                    failure_value=failure_value, questions=[question], references=[reference])
        return _answers(reward, rows, failure_value, details)[0]

    def many(data_sources, solution_strs, ground_truths, extra_infos=None, **_: Any) -> list[float]:
        n = len(solution_strs)
        extra_infos = [None] * n if extra_infos is None else list(extra_infos)
        if not len(data_sources) == len(ground_truths) == len(extra_infos) == n:
            raise RewardInputError(
                f"verl batch: data_sources, solution_strs, ground_truths and extra_infos must have one entry per "
                f"sample; got {len(data_sources)}, {n}, {len(ground_truths)}, {len(extra_infos)}"
            )
        media = [_sample_media(s, g, i) for s, g, i in zip(data_sources, ground_truths, extra_infos)]
        fields = [response_fields(i, g) for g, i in zip(ground_truths, extra_infos)]
        rows = score_pairs_detailed(reward, list(solution_strs), media, scale=scale, shift=shift,
                                    batch_size=batch_size, failure_value=failure_value,
                                    questions=[q for q, _ in fields], references=[r for _, r in fields])
        return _answers(reward, rows, failure_value, details)

    return many if batch else one


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs: Any) -> Any:
    """verl entry point (per sample; every 0.9.1 manager, the only one `remote` accepts): a float, or
    a dict with `details: true`. Reward kwargs choose the reward, verl's own kwargs are ignored."""
    cfg = reward_from_kwargs(kwargs)
    return make_compute_score(cfg.reward, scale=cfg.scale, shift=cfg.shift, failure_value=cfg.failure_value,
                              details=cfg.details)(
        data_source, solution_str, ground_truth, extra_info
    )


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, **kwargs: Any) -> list[Any]:
    """Legacy entry point for verl's BatchRewardManager (reward_manager=batch, verl before the Reward Loop;
    verl 0.9.1's trainer has no batch manager): one reward call per batch_size samples."""
    cfg = reward_from_kwargs(kwargs)
    return make_compute_score(cfg.reward, scale=cfg.scale, shift=cfg.shift, batch=True, batch_size=cfg.batch_size,
                              failure_value=cfg.failure_value, details=cfg.details)(
        data_sources, solution_strs, ground_truths, extra_infos
    )


class _MicroBatcher:
    """Scores the samples that verl's Reward Loop awaits concurrently in one reward call.

    The first waiting sample starts a drain task; samples that arrive while a batch is being scored
    (in a worker thread, so the event loop keeps serving verl) form the next batch.
    """

    def __init__(self, cfg: RewardConfig) -> None:
        self.cfg = cfg
        # (text, media, answer future, (question, reference) for response rewards)
        self.pending: list[tuple[str, str, asyncio.Future, tuple[str, str | None]]] = []
        self.draining = False

    async def score(self, text: str, media: str, fields: tuple[str, str | None] = ("", None)) -> Any:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((text, media, fut, fields))
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
                    rows = await asyncio.to_thread(
                        score_pairs_detailed, self.cfg.reward, [b[0] for b in batch], [b[1] for b in batch],
                        scale=self.cfg.scale, shift=self.cfg.shift, failure_value=self.cfg.failure_value,
                        questions=[b[3][0] for b in batch], references=[b[3][1] for b in batch],
                    )
                    answers = _answers(self.cfg.reward, rows, self.cfg.failure_value, self.cfg.details)
                except Exception as exc:  # handed to every waiting sample, not swallowed
                    for _, _, fut, _ in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, _, fut, _), value in zip(batch, answers):
                    if not fut.done():
                        fut.set_result(value)
        finally:
            self.draining = False


# one batcher per (event loop, reward config): futures belong to the loop that created them
_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, _MicroBatcher]] = weakref.WeakKeyDictionary()


async def compute_score_async(data_source, solution_str, ground_truth, extra_info=None, **kwargs: Any) -> Any:
    """verl Reward Loop entry point (`custom_reward_function.name=compute_score_async`).

    Concurrent calls in one worker are scored together (up to batch_size per reward call).
    """
    media = _sample_media(data_source, ground_truth, extra_info)
    cfg = reward_from_kwargs(kwargs)
    per_loop = _batchers.setdefault(asyncio.get_running_loop(), {})
    batcher = per_loop.get(cfg.key)
    if batcher is None:
        batcher = per_loop[cfg.key] = _MicroBatcher(cfg)
    return await batcher.score(solution_str, media, response_fields(extra_info, ground_truth))
