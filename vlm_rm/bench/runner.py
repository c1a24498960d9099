"""Run a reward or a judge over benchmark items into a resumable JSONL file keyed by item id.

Each line is one finished item: {"id", "mode": "score", "scores": [...], "details": {...}} for
scalar rewards or {"id", "mode": "judge", "outputs": {"AB": text, "BA": text}} for judges. A
rerun reads the file, skips the ids already there (a torn last line from a crash is ignored) and
appends the rest, so an interrupted run resumes where it stopped.

An item that fails (an unreadable image, a reward or judge error on it, a NaN or infinite score,
a judge answer that is not text) is written as {"id", "mode", "error": "..."} and the run goes on;
a failing batch is retried item by item so that one bad item costs only itself. The file is strict
JSON (no bare NaN). A rerun retries the failed items.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from mmreward.errors import CheckpointError, ConfigError, MissingExtraError
from vlm_rm.bench.items import BenchItem
from vlm_rm.bench.judges import Judge
from vlm_rm.bench.suites.base import ORDERS, Benchmark

logger = logging.getLogger(__name__)

# scorer(prompts, media paths) -> (scores, {detail name: scores})
Scorer = Callable[[list[str], list[str]], tuple[list[float], dict[str, list[float]]]]
# errors that are the run's, not an item's: a wrong option, missing weights or extra stop the run
RUN_ERRORS: tuple[type[BaseException], ...] = (ConfigError, CheckpointError, MissingExtraError)


def _item_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def failed(record: dict[str, Any]) -> bool:
    """Whether a run record is an item failure (its 'error' says why)."""
    return record.get("error") is not None


def reward_scorer(reward: Any) -> Scorer:
    """Adapt an `mmreward.Reward` (or anything with `.score(prompts, media)`) to a Scorer."""

    def score(prompts: list[str], media: list[str]) -> tuple[list[float], dict[str, list[float]]]:
        out = reward.score(prompts, media)
        details = {k: v.float().tolist() for k, v in out.details.items() if v.ndim == 1 and v.shape[0] == len(media)}
        return out.scores.float().tolist(), details

    return score


def read_run(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    p = Path(path)
    if not p.exists():
        return records
    with p.open(encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a crash: its item is simply redone
            if isinstance(rec, dict) and "id" in rec:
                records[str(rec["id"])] = rec
    return records


def run_items(
    benchmark: Benchmark,
    items: Sequence[BenchItem],
    out_path: str | os.PathLike,
    *,
    scorer: Scorer | None = None,
    judge: Judge | None = None,
    orders: Sequence[str] = ORDERS,
    batch_size: int = 16,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Score (or judge) every item not yet in `out_path`; returns all records, old and new."""
    if (scorer is None) == (judge is None):
        raise ConfigError("run_items needs exactly one of scorer= (a scalar reward) or judge= (a text judge)")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    bad_orders = [o for o in orders if o not in ORDERS]
    if bad_orders or not orders:
        raise ConfigError(f"orders must be a non-empty subset of {ORDERS}, got {list(orders)}")
    mode = "score" if scorer is not None else "judge"
    ids = [it.id for it in items]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ConfigError(f"{benchmark.name}: item ids must be unique to resume a run; {dup!r} repeats")
    records = read_run(out_path)
    wrong_mode = [k for k, r in records.items() if r.get("mode") != mode]
    if wrong_mode:
        raise ConfigError(
            f"{out_path} holds {len(wrong_mode)} records of another mode (e.g. {wrong_mode[0]!r}); "
            f"use a fresh --out folder for a {mode} run"
        )
    # failed items are retried: the image may have been fixed, a remote judge may answer now
    todo = [it for it in items if it.id not in records or failed(records[it.id])]
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(todo), desc=f"{benchmark.name} ({mode})", disable=not progress or not todo)
    with open(out_path, "a+", encoding="utf-8") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(f.tell() - 1)
            if f.read(1) != "\n":
                f.write("\n")  # end a line torn by a crash so the next record starts clean
        if mode == "score":
            batches = _score_batches(todo, scorer, batch_size)
        else:
            batches = _judge_batches(benchmark, todo, judge, orders, batch_size)
        for done in batches:
            for rec in done:
                if failed(rec):
                    logger.warning("%s: item %s failed and is excluded from the metrics: %s",
                                   benchmark.name, rec["id"], rec["error"])
                f.write(json.dumps(rec, allow_nan=False) + "\n")
                records[rec["id"]] = rec
            f.flush()
            bar.update(len(done))
    bar.close()
    return records


def _score_keys(scorer: Scorer, keys: list[tuple[str, str]]) -> list[tuple[float, dict[str, float]]]:
    scores, details = scorer([k[0] for k in keys], [k[1] for k in keys])
    if len(scores) != len(keys):
        raise ConfigError(f"the scorer returned {len(scores)} scores for {len(keys)} candidates")
    return [(float(scores[j]), {d: float(v[j]) for d, v in details.items()}) for j in range(len(keys))]


def _non_finite(score: float, details: dict[str, float]) -> str | None:
    bad = [name for name, v in (("score", score), *details.items()) if not math.isfinite(v)]
    if not bad:
        return None
    values = {"score": score, **details}
    return "RewardValueError: the reward returned " + ", ".join(f"{b}={values[b]}" for b in bad)


def _score_batches(items: Sequence[BenchItem], scorer: Scorer, batch_size: int):
    # identical (prompt, media) candidates (e.g. a video shared by many pairs) are scored once per run;
    # a cache entry is (score, details) or the candidate's error text
    cache: dict[tuple[str, str], tuple[float, dict[str, float]] | str] = {}
    pending: list[BenchItem] = []
    for it in items:
        pending.append(it)
        new = {(c.prompt, c.media) for p in pending for c in p.candidates} - cache.keys()
        if len(new) >= batch_size or it is items[-1]:
            keys = sorted(new)
            if keys:
                try:
                    got_all: list[Any] = _score_keys(scorer, keys)
                except RUN_ERRORS:
                    raise
                except Exception as exc:  # one bad candidate must not cost the batch: retry one by one
                    logger.warning("scoring a batch of %d candidates failed (%s); retrying one by one",
                                   len(keys), _item_error(exc))
                    got_all = []
                    for key in keys:
                        try:
                            got_all.append(_score_keys(scorer, [key])[0])
                        except RUN_ERRORS:
                            raise
                        except Exception as item_exc:
                            got_all.append(f"{key[1]}: {_item_error(item_exc)}")
                for key, got in zip(keys, got_all):
                    bad = None if isinstance(got, str) else _non_finite(*got)
                    cache[key] = f"{key[1]}: {bad}" if bad else got
            done = []
            for p in pending:
                got = [cache[(c.prompt, c.media)] for c in p.candidates]
                errors = [f"candidate {j}: {g}" for j, g in enumerate(got) if isinstance(g, str)]
                if errors:
                    done.append({"id": p.id, "mode": "score", "error": "; ".join(errors)})
                    continue
                rec: dict[str, Any] = {"id": p.id, "mode": "score", "scores": [g[0] for g in got]}
                if got[0][1]:
                    rec["details"] = {d: [g[1][d] for g in got] for d in got[0][1]}
                done.append(rec)
            pending = []
            yield done


def _ask(judge: Judge, requests: list[tuple]) -> list[str]:
    answers = list(judge([r[2] for r in requests], [r[3] for r in requests]))
    if len(answers) != len(requests):
        raise ConfigError(f"the judge returned {len(answers)} answers for {len(requests)} prompts")
    return answers


def _judge_item(judge: Judge, requests: list[tuple]) -> dict[str, str] | str:
    """One item's answers per order, or its error text (a judge error, or an answer that is not text)."""
    try:
        answers = _ask(judge, requests)
    except RUN_ERRORS:
        raise
    except Exception as exc:
        return _item_error(exc)
    return _answers(requests, answers)


def _answers(requests: list[tuple], answers: list[Any]) -> dict[str, str] | str:
    out: dict[str, str] = {}
    for (_, order, _, _), text in zip(requests, answers):
        if not isinstance(text, str):  # None or a float NaN is no verdict to parse: the item failed
            return f"RewardValueError: the judge answered {text!r} ({type(text).__name__}) in order {order}, not text"
        out[order] = text
    return out


def _judge_batches(benchmark: Benchmark, items: Sequence[BenchItem], judge: Judge, orders, batch_size: int):
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        requests = {it.id: [(it, o, *benchmark.judge_request(it, o)) for o in benchmark.orders_for(it, orders)]
                    for it in chunk}
        flat = [r for it in chunk for r in requests[it.id]]
        try:
            answers = _ask(judge, flat)
        except RUN_ERRORS:
            raise
        except Exception as exc:  # retry item by item so that one failing item costs only itself
            logger.warning("judging a batch of %d items failed (%s); retrying one by one", len(chunk), _item_error(exc))
            outputs = {it.id: _judge_item(judge, requests[it.id]) for it in chunk}
        else:
            outputs, k = {}, 0
            for it in chunk:
                n = len(requests[it.id])
                outputs[it.id] = _answers(requests[it.id], answers[k : k + n])
                k += n
        yield [{"id": it.id, "mode": "judge", **({"error": out} if isinstance(out, str) else {"outputs": out})}
               for it, out in ((it, outputs[it.id]) for it in chunk)]
