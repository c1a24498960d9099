"""One call from files on disk to a results card: load, run (resumably), evaluate, report."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmreward.errors import ConfigError, MMRewardError
from vlm_rm.bench.judges import Judge
from vlm_rm.bench.report import write_card
from vlm_rm.bench.results import EvalPolicy, Results, policy_dict
from vlm_rm.bench.runner import Scorer, failed, reward_scorer, run_items
from vlm_rm.bench.suites import get_benchmark
from vlm_rm.bench.suites.base import ORDERS

RUN_FILE = "run.jsonl"


def run_benchmark(
    benchmark: str,
    data: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    reward: Any = None,
    scorer: Scorer | None = None,
    judge: Judge | None = None,
    policy: EvalPolicy | None = None,
    media_root: str | None = None,
    options: dict[str, Any] | None = None,
    orders: Sequence[str] = ORDERS,
    batch_size: int = 16,
    progress: bool = True,
    run_info: dict[str, Any] | None = None,
) -> Results:
    """Evaluate a reward (an mmreward Reward, or a plain `scorer`) or a `judge` on a local benchmark copy.

    Writes `run.jsonl` (resumable), `results.json`, `results.md` and `results.png` into `out_dir`.
    Items that failed (their run records hold an "error") are excluded from every metric; how many
    is `results.counts["failed_items"]`, stated in the card's notes too.
    """
    if sum(x is not None for x in (reward, scorer, judge)) != 1:
        raise ConfigError("pass exactly one of reward=, scorer= or judge=")
    bench = get_benchmark(benchmark)
    policy = policy or EvalPolicy()
    mode = "judge" if judge is not None else "score"
    if mode == "judge" and bench.judge_template is None:
        raise ConfigError(f"benchmark '{bench.name}' is defined for scalar rewards only; pass reward= instead of judge=")
    out = Path(out_dir)
    try:
        items = bench.load(os.fspath(data), media_root=media_root, cache_dir=str(out / "media_cache"), **(options or {}))
    except MMRewardError:
        raise
    except (OSError, ValueError, KeyError, IndexError, TypeError, csv.Error) as exc:
        # the annotation file is user input: a malformed one is a usage error, not a crash
        raise ConfigError(
            f"data {os.fspath(data)}: cannot read it as a '{bench.name}' annotation file "
            f"({type(exc).__name__}: {exc}); pass the file in the benchmark's published layout"
        ) from exc
    bench.check_mode(items, mode)
    if reward is not None:
        scorer = reward_scorer(reward)
    records = run_items(bench, items, out / RUN_FILE, scorer=scorer, judge=judge, orders=orders,
                        batch_size=batch_size, progress=progress)
    results = _evaluate_excluding_failures(bench, items, records, policy, mode)
    info = {"benchmark": bench.name, "data": os.fspath(data), "mode": mode, "items": len(items),
            "schema": bench.schema, **(run_info or {})}
    if reward is not None:
        info.setdefault("reward", getattr(reward, "name", type(reward).__name__))
        frames = getattr(reward, "num_frames", None)
        info["reward_frames"] = frames if frames is not None else "reward default (no num_frames attribute)"
    if mode == "judge":
        info["orders"] = list(orders)
    write_card(results, out, info)
    return results


def _evaluate_excluding_failures(bench, items, records, policy: EvalPolicy, mode: str) -> Results:
    """Metrics over the items that were scored; the failed ones are counted and named, never scored as wrong."""
    bad = [it for it in items if failed(records[it.id])]
    ok = [it for it in items if not failed(records[it.id])]
    if ok:
        results = bench.evaluate(ok, records, policy, mode=mode)
    else:  # nothing to measure: a card that says so instead of a crash in the metric
        results = Results(bench.name, bench.primary, policy=policy_dict(policy), counts={"items": len(items)})
    results.counts["items_total"] = len(items)
    results.counts["failed_items"] = len(bad)
    if bad:
        results.counts["failed_item_ids"] = [it.id for it in bad[:20]]
        first = records[bad[0].id]["error"]
        results.notes.append(
            f"{len(bad)} of {len(items)} items failed and are excluded from every metric "
            f"(each failure's reason is the 'error' of its line in {RUN_FILE}; e.g. {bad[0].id}: {first})"
        )
    return results
