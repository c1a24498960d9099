"""VideoRewardBench and VLRMBench on hand-written fixtures in their published layouts.

Every expected number is worked out by hand from tests/fixtures/{videorewardbench,vlrmbench} (comments
show the arithmetic) or by an independent re-implementation of the official formula written here.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from mmreward.errors import ConfigError
from vlm_rm.bench import EvalPolicy, run_benchmark
from vlm_rm.bench.judges import judge_factory
from vlm_rm.bench.suites.vlrmbench import step_indicators, weighted_f1

FIX = Path(__file__).resolve().parents[1] / "fixtures"
VRB = FIX / "videorewardbench" / "videorewardbench.jsonl"
VLRM = FIX / "vlrmbench" / "benchmark_data"
FAST = EvalPolicy(n_boot=50)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- VideoRewardBench -----------------------------------------------------------------------------
def _mock_on_frames():
    import mmreward

    # the registry's mock reward on 3 sampled frames: -mean((pixel - colour named in the prompt)^2)
    return mmreward.load("video-frames", image_reward="mock", num_frames=3)


def test_videorewardbench_overall_is_micro_and_dimensions_match_hand_counts(tmp_path):
    res = run_benchmark("videorewardbench", VRB, tmp_path / "o", reward=_mock_on_frames(), policy=FAST, progress=False)
    # right: lp1 lp2 | sp1 | kn1 | - | sa2 ; wrong: sp2 (purple vs red clip), re1, sa1; kn2 is a zero margin (both "blue")
    assert res.metrics["accuracy"].value == pytest.approx(5 / 9)
    per_dim = {"perception/long-form": 1.0, "perception/short-form": 0.5, "knowledge": 0.5, "reasoning": 0.0, "safety": 0.5}
    for dim, want in per_dim.items():
        assert res.categories[dim]["accuracy"].value == pytest.approx(want), dim
    assert res.categories["perception"]["accuracy"].value == pytest.approx(3 / 4)  # micro over lp1 lp2 sp1 sp2
    assert res.metrics["macro_accuracy"].value == pytest.approx(np.mean(list(per_dim.values())))
    assert res.counts["dimensions"] == {"perception/long-form": 2, "perception/short-form": 2, "knowledge": 2,
                                        "reasoning": 1, "safety": 2}
    half = run_benchmark("videorewardbench", VRB, tmp_path / "o", reward=_mock_on_frames(),
                         policy=EvalPolicy(zero_margin="half", n_boot=20), progress=False)
    assert half.metrics["accuracy"].value == pytest.approx(5.5 / 9)


def test_videorewardbench_published_table_is_micro():
    # Table 4, Gemini-2.5-Pro: per-dimension accuracies on 283/413/238/278/351 samples -> 63.6 overall
    acc, n = np.array([70.7, 55.9, 65.5, 67.3, 62.7]), np.array([283, 413, 238, 278, 351])
    assert round(float((acc * n).sum() / n.sum()), 1) == 63.6 and round(float(acc.mean()), 1) != 63.6


def _chosen_texts() -> set[str]:
    return {r["chosen"] for r in _rows(VRB)}


def always_a(prompts, media):
    assert all(len(m) == 1 and m[0].endswith(".gif") for m in media)  # the video reaches the judge
    return ["A is better. [[A]]"] * len(prompts)


def oracle_judge(prompts, media):
    chosen = _chosen_texts()
    out = []
    for p in prompts:
        a = re.search(r"\[Answer A\]\n(.*?)\n\[End of Answer A\]", p, re.S).group(1)
        out.append("[[A]]" if a in chosen else "[[B]]")
    return out


def test_videorewardbench_judges_both_orders_and_shuffled_positions(tmp_path):
    first = run_benchmark("videorewardbench", VRB, tmp_path / "a", judge=always_a, policy=FAST,
                          options={"order": "chosen-first"}, progress=False)
    assert first.metrics["accuracy"].value == 1.0 and first.metrics["accuracy_BA"].value == 0.0
    assert first.metrics["position_consistency"].value == 0.0
    assert first.metrics["accuracy_mean_of_orders"].value == pytest.approx(0.5)
    shuffled = run_benchmark("videorewardbench", VRB, tmp_path / "s", judge=always_a, policy=FAST, progress=False)
    # the documented coin: chosen first when the first byte of sha256(id) is even
    ids = [r["id"] for r in _rows(VRB)]
    share_first = np.mean([hashlib.sha256(i.encode()).digest()[0] % 2 == 0 for i in ids])
    assert 0 < share_first < 1
    assert shuffled.metrics["accuracy"].value == pytest.approx(share_first)
    assert shuffled.metrics["accuracy_BA"].value == pytest.approx(1 - share_first)
    oracle = run_benchmark("videorewardbench", VRB, tmp_path / "x", judge=oracle_judge, policy=FAST, progress=False)
    assert oracle.metrics["accuracy"].value == 1.0 and oracle.metrics["position_consistency"].value == 1.0


@pytest.mark.parametrize(("edit", "match"), [
    (lambda r: r.pop("chosen"), r"record 2 \(id 'sp1'\) has no 'chosen' field"),
    (lambda r: r.update(dimension="humour"), r"record 2 \(id 'sp1'\) field 'dimension' is 'humour'"),
    (lambda r: r.update(rejected=3), r"record 2 \(id 'sp1'\) field 'rejected' must be text"),
])
def test_videorewardbench_bad_records_name_record_and_field(tmp_path, edit, match):
    rows = _rows(VRB)
    edit(rows[2])
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ConfigError, match=match):
        run_benchmark("videorewardbench", bad, tmp_path / "o", judge=always_a, progress=False)


def test_cli_videorewardbench_with_a_registered_reward_and_frame_count(tmp_path):
    from vlm_rm.cli import main

    out = tmp_path / "out"
    code = main(["bench", "--reward", "video-frames", "--load-option", "image_reward=mock", "--benchmark",
                 "videorewardbench", "--data", str(VRB), "--out", str(out), "--num-frames", "2", "--n-boot", "20",
                 "--quiet"])
    assert code == 0
    card = json.loads((out / "results.json").read_text())
    assert card["metrics"]["accuracy"]["value"] == pytest.approx(5 / 9)
    assert card["run"]["num_frames"] == 2 and card["run"]["reward_frames"] == 2
    assert main(["bench", "--reward", "mock", "--benchmark", "videorewardbench", "--data", str(VRB),
                 "--out", str(tmp_path / "o2"), "--num-frames", "0"]) == 2


# -- VLRMBench ------------------------------------------------------------------------------------
STEP_ANSWERS = {"sc1": "[0, 1, 0, 0]", "sc2": "STEP1: 0, STEP2: 1, STEP3: 1", "sc3": "[0, 5]"}
FORESIGHT_ANSWERS = {"f1": "Yes.", "f2": "Yes, it will.", "f3": "No", "f4": "I think it is not true"}
MS_ANSWERS = {"m1": ("[8, 3]", "[2, 9]"), "m2": ("[5, 5]", "[5, 5]"),
              "m3": ("Scores: 7 and 6", "Response 1 gets 9, Response 2 gets 4")}
CRITIC = {"e1": ("[6, 8]", "[9, 5]"), "e2": ("[7, 7]", "[7, 7]"), "e3": ("[9, 2]", "[3, 8]")}


def _qid(prompt: str) -> str:
    return re.search(r"## Question\n\((\w+)\)", prompt).group(1)


@judge_factory
def scripted_judge():
    def judge(prompts, media):
        out = []
        for p, m in zip(prompts, media):
            assert m and all(x.endswith("plot.png") and Path(x).is_file() for x in m)
            q = _qid(p)
            if q in STEP_ANSWERS:
                assert "[Indicator for STEP 1, Indicator for STEP 2, ..., Indicator for STEP N]" in p
                out.append(STEP_ANSWERS[q])
            elif q in FORESIGHT_ANSWERS:
                out.append(FORESIGHT_ANSWERS[q])
            elif q in MS_ANSWERS:
                good_first = p.index("GOOD") < p.index("BAD")
                out.append(MS_ANSWERS[q][0 if good_first else 1])
            else:
                out.append(f"fixed {q}")  # error_correction: the corrected reasoning
        return out

    return judge


@judge_factory
def scripted_critic():
    def judge(prompts, media):
        out = []
        for p in prompts:
            q = _qid(p)
            ref_first = p.index(f"REF {q}") < p.index(f"fixed {q}")
            out.append(CRITIC[q][0 if ref_first else 1])
        return out

    return judge


def _f1_by_hand(pred, truth):
    # sklearn-style per-class precision/recall, then VLRMBench's weights: F1(1) * share(0) + F1(0) * share(1)
    def f1(label):
        tp = sum(p == label and t == label for p, t in zip(pred, truth))
        prec = tp / max(1, sum(p == label for p in pred))
        rec = tp / max(1, sum(t == label for t in truth))
        return 0.0 if prec + rec == 0 else 2 * prec * rec / (prec + rec)

    share1 = sum(truth) / len(truth)
    return f1(1) * (1 - share1) + f1(0) * share1


def test_vlrmbench_parsers_follow_the_official_scripts():
    # every integer counts, "STEP1" included; anything above 1 becomes 1; cut/padded to the step count
    assert step_indicators("STEP1: 0, STEP2: 1, STEP3: 1", 3) == [1, 0, 1]
    assert step_indicators("[0, 5]", 5) == [0, 1, 0, 0, 0]
    pred, truth = [0, 1, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1]
    # tp 2, tn 6, fp 2, fn 2: F1(1) = 4/8, F1(0) = 12/16; weights 8/12 and 4/12
    assert weighted_f1(pred, truth) == pytest.approx((0.5, 0.75, 0.5 * 8 / 12 + 0.75 * 4 / 12))
    assert weighted_f1(pred, truth)[2] == pytest.approx(_f1_by_hand(pred, truth))
    assert weighted_f1(pred, truth)[2] != pytest.approx(0.5 * 4 / 12 + 0.75 * 8 / 12)  # not support-weighted
    rng = np.random.default_rng(0)
    for _ in range(20):
        t, p = rng.integers(0, 2, 30).tolist(), rng.integers(0, 2, 30).tolist()
        assert weighted_f1(p, t)[2] == pytest.approx(_f1_by_hand(p, t), rel=1e-12)


def test_vlrmbench_all_tasks_from_the_folder(tmp_path):
    res = run_benchmark("vlrmbench", VLRM, tmp_path / "o", judge=scripted_judge(), policy=FAST,
                        options={"critique_judge": scripted_critic()}, progress=False)
    sc = 0.5 * 8 / 12 + 0.75 * 4 / 12  # pooled steps above: sc1 exact, sc2 -> [1,0,1], sc3 -> [0,1,0,0,0]
    assert res.metrics["step_correctness/f1_weighted"].value == pytest.approx(sc)
    assert res.metrics["step_correctness/f1_pos"].value == pytest.approx(0.5)
    # f1 yes/true right, f2 "Yes" on false wrong, f3 right, f4 "not true" contains "true": right; f5 skipped
    assert res.metrics["foresight/accuracy"].value == pytest.approx(3 / 4)
    assert res.counts["skipped_error_info"] == {"foresight": 1}
    # m1 17 vs 5 right; m2 10 vs 10 tie -> wrong; m3 7+4=11 vs 6+2=8 right (last two integers of each answer)
    assert res.metrics["multi_solution/accuracy"].value == pytest.approx(2 / 3)
    # e1 reference 6+5=11 vs model 8+9=17 win; e2 tie; e3 17 vs 5 lose
    for k, v in {"win_rate": 1 / 3, "tie_rate": 1 / 3, "lose_rate": 1 / 3}.items():
        assert res.metrics[f"error_correction/{k}"].value == pytest.approx(v)
    assert res.metrics["score"].value == pytest.approx(np.mean([sc, 3 / 4, 2 / 3, 1 / 3]))
    assert res.metrics["outcome_judgment/mean_score"].value == pytest.approx((3 / 4 + 2 / 3) / 2)
    lines = [json.loads(x) for x in (tmp_path / "o" / "run.jsonl").read_text().splitlines()]
    orders = {r["id"]: sorted(r["outputs"]) for r in lines}
    assert orders["multi_solution/m1"] == ["AB", "BA"] and orders["step_correctness/sc1"] == ["AB"]
    no_critic = run_benchmark("vlrmbench", VLRM / "error_correction.jsonl", tmp_path / "n", judge=scripted_judge(),
                              policy=FAST, progress=False)
    assert np.isnan(no_critic.metrics["error_correction/win_rate"].value)
    assert any("critique_judge" in n for n in no_critic.notes)


def test_vlrmbench_scalar_rewards_on_multi_solution_only(tmp_path):
    def scorer(prompts, media):
        return [1.0 if "GOOD" in p else (1.0 if "m2" in p else 0.0) for p in prompts], {}

    res = run_benchmark("vlrmbench", VLRM / "multi_solution.jsonl", tmp_path / "o", scorer=scorer, policy=FAST,
                        progress=False)
    assert res.metrics["multi_solution/accuracy"].value == pytest.approx(2 / 3)  # m2 is a tie: wrong
    with pytest.raises(ConfigError, match=r"tasks \['error_correction', 'foresight', 'step_correctness'\] need a judge"):
        run_benchmark("vlrmbench", VLRM, tmp_path / "p", scorer=scorer, progress=False)


@pytest.mark.parametrize(("edit", "match"), [
    (lambda r: r.update(task_gt=[0, 2, 0, 0]), r"step_correctness.jsonl line 2 \(id 'sc2'\) field 'task_gt'"),
    (lambda r: r.pop("question"), r"step_correctness.jsonl line 2 \(id 'sc2'\) lacks the field 'question'"),
    (lambda r: r.update(image=[]), r"line 2 \(id 'sc2'\) field 'image' is an empty list"),
])
def test_vlrmbench_bad_records_name_line_and_field(tmp_path, edit, match):
    rows = _rows(VLRM / "step_correctness.jsonl")
    edit(rows[1])
    (tmp_path / "step_correctness.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ConfigError, match=match):
        run_benchmark("vlrmbench", tmp_path / "step_correctness.jsonl", tmp_path / "o", judge=scripted_judge(),
                      media_root=str(VLRM.parent / "meta_data" / "Image"), progress=False)


def test_cli_vlrmbench_with_a_declared_judge_factory(tmp_path, capsys):
    from vlm_rm.cli import main

    data = tmp_path / "VLRMBench"
    shutil.copytree(VLRM.parent, data)  # benchmark_data/ beside meta_data/Image, as published
    out = tmp_path / "out"
    mod = Path(__file__).stem
    code = main(["bench", "--judge", f"{mod}:scripted_judge", "--benchmark", "vlrmbench", "--data",
                 str(data / "benchmark_data"), "--out", str(out), "--option", f"critique_judge={mod}:scripted_critic",
                 "--n-boot", "20", "--quiet"])
    assert code == 0
    card = json.loads((out / "results.json").read_text())
    assert card["metrics"]["multi_solution/accuracy"]["value"] == pytest.approx(2 / 3)
    assert card["metrics"]["error_correction/win_rate"]["value"] == pytest.approx(1 / 3)
    assert main(["bench", "--judge", f"{mod}:scripted_judge", "--benchmark", "vlrmbench", "--data",
                 str(data / "benchmark_data"), "--out", str(tmp_path / "o2"), "--option", "task=foresight"]) == 2
    assert "option task=" in capsys.readouterr().err
