"""benchmarks/algorithm_comparison.py: the tables (means over seeds, change from the start, the noise estimate, the
within-noise verdict, whether the monitor fired by each budget) equal a hand computation on hand-built runs; a
tiny real run (one ShapesWorld iteration) reaches both budgets and feeds the report; the slow test runs a reduced
comparison of two methods end to end."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("algorithm_comparison", ROOT / "benchmarks" / "algorithm_comparison.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["algorithm_comparison"] = mod
    spec.loader.exec_module(mod)
    return mod


def _ev(it, strict, se, tags=(), alarm=0.0, secs=0.0):
    return {"iteration": it, "samples": 12 * it, "train_seconds": secs, "tags": list(tags), "gold/shapes-eval": strict,
            "gold/shapes-eval_se": se, "eval/clipscore": 70.0 + it, "diversity": 0.1 + 0.01 * it, "hacking_alarm": alarm}


def _run(start, at_samples, at_time, alarm_it=None):
    evals = [_ev(0, start, 0.05, ["start"]),
             _ev(3, at_samples, 0.04, ["equal_samples"], alarm=1.0 if alarm_it == 3 else 0.0, secs=10.0),
             _ev(5, at_time, 0.03, ["equal_time"], alarm=1.0 if alarm_it == 5 else 0.0, secs=31.0)]
    return {"evals": evals, "start": evals[0], "alarm": alarm_it is not None}


def test_summary_rows_within_noise_and_table_by_hand(tmp_path):
    mod = _module()
    results = {
        "a": {"0": _run(0.60, 0.70, 0.80), "1": _run(0.50, 0.60, 0.62, alarm_it=5)},
        "b": {"0": _run(0.60, 0.61, 0.60), "1": _run(0.50, 0.50, 0.48)},
    }
    rows = {r["method"]: r for r in mod.summarise(results, "equal_time")}
    a = rows["a"]
    # changes 0.20 and 0.12: mean 0.16, sd sqrt(((0.04)^2 * 2) / 1); eval SE of the mean sqrt((0.03^2 + 0.03^2)/2/2)
    assert a["delta_strict"] == pytest.approx(0.16) and a["strict"] == pytest.approx(0.71)
    assert a["seed_sd"] == pytest.approx(math.sqrt(2 * 0.04 ** 2))
    assert a["eval_se"] == pytest.approx(math.sqrt(0.03 ** 2 / 2))
    assert a["noise"] == pytest.approx(math.sqrt(0.03 ** 2 / 2 + 2 * 0.04 ** 2 / 2))
    assert a["alarm"] == 1 and a["iterations"] == 5 and a["train_seconds"] == 31.0
    assert rows["b"]["delta_strict"] == pytest.approx(-0.01) and rows["b"]["alarm"] == 0
    # at the sample budget the alarm (at iteration 5) has not fired yet
    assert {r["method"]: r["alarm"] for r in mod.summarise(results, "equal_samples")} == {"a": 0, "b": 0}
    ordered = mod.summarise(results, "equal_time")
    assert [r["method"] for r in ordered] == ["a", "b"]
    gap, noise = 0.17, math.sqrt(ordered[0]["noise"] ** 2 + ordered[1]["noise"] ** 2)
    same, worse = mod.within_noise(ordered)
    assert (same, worse) == ((["a", "b"], []) if gap <= 2 * noise else (["a"], ["b"]))
    text = mod.write_report(results, {"seeds": [0, 1]}, tmp_path / "page.md", None)
    assert "| a | 0.710 | +0.160 |" in text and "| 1/2 |" in text and "## Equal sample count" in text


def test_a_tiny_shapesworld_run_reaches_both_budgets(tmp_path):
    """One method (DRaFT-1) on the ShapesWorld generator: 1 iteration of 2 prompts x 2, 1 evaluation image per
    held-out prompt; both budgets are tagged, and the report's row is that run's evaluation."""
    mod = _module()
    base = mod.base_config(prompts_per_iteration=2, group_size=2, num_steps=2, eval_samples=1, eval_every=1)
    base["sample"]["eval_num_steps"] = 2
    cfg = mod.method_config("draft", mod.METHODS["draft"], base, 0, tmp_path)
    run = mod.run_one(cfg, seconds=0.0, samples=4, eval_every=1)
    assert [e["iteration"] for e in run["evals"]] == [0, 1] and run["samples_per_iteration"] == 4
    end = run["evals"][-1]
    assert set(end["tags"]) == {"equal_samples", "equal_time"} and end["samples"] == 4
    assert 0.0 <= end["gold/shapes-eval"] <= 1.0 and end["gold/shapes-eval"] == end["eval/shapes-eval/strict"]
    rows = mod.summarise({"draft": {"0": run}}, "equal_samples")
    assert rows[0]["delta_strict"] == pytest.approx(end["gold/shapes-eval"] - run["start"]["gold/shapes-eval"])
    assert mod.main(["--methods", "nope"]) == 2  # unknown methods are a usage error


@pytest.mark.slow
def test_reduced_comparison_end_to_end(tmp_path):
    mod = _module()
    lines = []
    rc = mod.main(["--methods", "dgpo", "crd", "--seeds", "0", "1", "--seconds", "1", "--samples", "8",
                   "--prompts-per-iteration", "2", "--group-size", "4", "--num-steps", "4", "--eval-samples", "2",
                   "--eval-every", "1", "--output", str(tmp_path / "runs"), "--report", str(tmp_path / "cmp.md")],
                  log=lines.append)
    assert rc == 0
    text = (tmp_path / "cmp.md").read_text()
    assert "| dgpo |" in text and "| crd |" in text and (tmp_path / "cmp_curves.png").stat().st_size > 1000
    assert sum("seed" in line for line in lines) == 4
