"""`vlm-rm bench` on items that fail (issue 28 item 21).

An unreadable image, a reward that returns NaN, a judge that raises or answers something that is
not text: the item's line in run.jsonl records the error (strict JSON: no bare NaN), the item is
left out of every metric with the count stated in results.json/results.md, the run goes on, and
the CLI exits 1 (usage errors stay 2). A rerun retries the failed items.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from vlm_rm.bench import EvalPolicy, run_benchmark
from vlm_rm.bench.runner import read_run

FAST = EvalPolicy(n_boot=20)


def _strict_lines(path) -> list[dict]:
    def no_constants(name):
        raise AssertionError(f"{path} holds a bare {name}")

    return [json.loads(line, parse_constant=no_constants) for line in path.read_text().splitlines()]


def _genai(tmp_path, rows) -> str:
    """A GenAI-Bench file: rows of (prompt, left image, right image, vote)."""
    data = [{"prompt": p, "left_image": left, "right_image": right, "vote_type": v} for p, left, right, v in rows]
    path = tmp_path / "g.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in data))
    return str(path)


@pytest.fixture
def colours(tmp_path):
    Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "r.png")
    Image.new("RGB", (8, 8), (0, 255, 0)).save(tmp_path / "g.png")
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    return tmp_path


def test_cli_unreadable_image_is_recorded_and_the_run_goes_on(colours, capsys):
    from vlm_rm.cli import main

    # the registry's 'mock' reward: -mean((pixel - colour named in the prompt)^2)
    data = _genai(colours, [("red", "r.png", "g.png", "leftvote"),     # right
                            ("red", "corrupt.png", "g.png", "leftvote"),  # unreadable: excluded
                            ("green", "r.png", "g.png", "leftvote")])  # wrong
    out = colours / "out"
    code = main(["bench", "--reward", "mock", "--benchmark", "genai-bench-image", "--data", data,
                 "--out", str(out), "--n-boot", "20", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "1 of 3 items failed" in err
    lines = _strict_lines(out / "run.jsonl")
    assert len(lines) == 3
    failed = [r for r in lines if "error" in r]
    assert len(failed) == 1 and "corrupt.png" in failed[0]["error"] and "scores" not in failed[0]
    card = json.loads((out / "results.json").read_text())
    assert card["metrics"]["accuracy"]["value"] == pytest.approx(0.5) and card["metrics"]["accuracy"]["n"] == 2
    assert card["counts"]["failed_items"] == 1 and card["counts"]["items_total"] == 3
    assert "1 of 3 items failed and are excluded" in (out / "results.md").read_text()
    # usage errors keep exit 2
    assert main(["bench", "--reward", "mock", "--benchmark", "genai-bench-image", "--data", data,
                 "--out", str(out), "--batch-size", "0"]) == 2


def test_nan_scores_are_item_failures_in_strict_json(colours):
    data = _genai(colours, [("a", "r.png", "g.png", "leftvote"), ("nan", "r.png", "g.png", "leftvote"),
                            ("b", "g.png", "r.png", "rightvote")])

    def scorer(prompts, media):  # red scores 1, green 0, and any candidate of the "nan" prompt NaN
        return [float("nan") if p == "nan" else float(m.endswith("r.png")) for p, m in zip(prompts, media)], {}

    res = run_benchmark("genai-bench-image", data, colours / "o", scorer=scorer, policy=FAST, progress=False)
    lines = _strict_lines(colours / "o" / "run.jsonl")
    bad = [r for r in lines if "error" in r]
    assert len(bad) == 1 and "nan" in bad[0]["error"].lower()
    assert res.metrics["accuracy"].value == 1.0 and res.metrics["accuracy"].n == 2
    assert res.counts["failed_items"] == 1


def test_judge_errors_and_non_text_answers_fail_only_their_item(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "img.png")
    # the judge sees the answers' text: 'boom' makes it raise, 'none' makes it answer NaN
    rows = [("a", "q=0.9", "q=0.1", "Output1"), ("boom", "q=0.2 boom", "q=0.8", "Output2"),
            ("none", "q=0.2 none", "q=0.8", "Output2"), ("b", "q=0.3", "q=0.6", "Output2")]
    data = [{"ID": i, "Text": "describe", "Output1": a, "Output2": b, "Better": w, "Image": "img.png",
             "Category": "vqa"} for i, a, b, w in rows]
    (tmp_path / "all_data.json").write_text(json.dumps(data))
    import re

    def judge(prompts, media):
        if any("boom" in p for p in prompts):
            raise RuntimeError("the judge server closed the connection")
        out = []
        for p in prompts:
            if "none" in p:
                out.append(float("nan"))  # e.g. a remote judge client that returns NaN on a refusal
                continue
            qa, qb = (float(x) for x in re.findall(r"q=([\d.]+)", p)[:2])
            out.append("[[A]]" if qa > qb else "[[B]]")
        return out

    res = run_benchmark("multimodal-rewardbench", tmp_path / "all_data.json", tmp_path / "o", judge=judge,
                        policy=FAST, progress=False, batch_size=4)
    lines = {r["id"]: r for r in _strict_lines(tmp_path / "o" / "run.jsonl")}
    assert "connection" in lines["boom"]["error"] and "not text" in lines["none"]["error"]
    assert "outputs" in lines["a"] and "outputs" in lines["b"]
    assert res.metrics["accuracy"].value == 1.0 and res.metrics["accuracy"].n == 2
    assert res.counts["failed_items"] == 2


def test_rerun_retries_failed_items_and_all_failed_gives_a_card(colours):
    data = _genai(colours, [("a", "r.png", "missing.png", "leftvote"), ("b", "r.png", "g.png", "leftvote")])
    calls: list[str] = []

    def scorer(prompts, media):
        calls.extend(media)
        for m in media:
            if not (colours / m).exists():
                raise FileNotFoundError(m)
        return [float(m.endswith("r.png")) for m in media], {}

    first = run_benchmark("genai-bench-image", data, colours / "o", scorer=scorer, policy=FAST, progress=False)
    assert first.counts["failed_items"] == 1
    Image.new("RGB", (8, 8)).save(colours / "missing.png")  # the user fixes the file
    calls.clear()
    again = run_benchmark("genai-bench-image", data, colours / "o", scorer=scorer, policy=FAST, progress=False)
    assert sorted(Path(c).name for c in calls) == ["missing.png", "r.png"]  # only the failed item is redone
    assert again.counts["failed_items"] == 0 and again.metrics["accuracy"].n == 2
    assert all("error" not in r for r in read_run(colours / "o" / "run.jsonl").values())

    def broken(prompts, media):
        raise OSError("disk gone")

    none = run_benchmark("genai-bench-image", data, colours / "none", scorer=broken, policy=FAST, progress=False)
    assert none.counts["failed_items"] == 2 and not none.metrics
    assert "2 of 2 items failed" in (colours / "none" / "results.md").read_text()
