"""Benchmark loaders, runs and metrics on synthetic files written in each published schema.

Fake reward models: an oracle (image brightness + the quality written in the prompt), a quantised
oracle (repeated margins), a position-biased judge and a parse-failing judge. Every expected
number below is worked out by hand from the files the test writes.
"""

from __future__ import annotations

import csv
import json
import random
import re

import numpy as np
import pytest
import torch
from PIL import Image

from mmreward.errors import ConfigError
from mmreward.types import Reward, RewardOutput
from vlm_rm.bench import EvalPolicy, run_benchmark
from vlm_rm.bench.runner import read_run

FAST = EvalPolicy(n_boot=100)


class OracleReward(Reward):
    """Score = mean pixel value + the number after 'q=' in the prompt (0 when absent)."""

    name = "oracle"
    requires_prompt = False

    def _score(self, prompts, media):
        pix = torch.stack([m.float().mean() for m in media]) if isinstance(media, list) else media.flatten(1).mean(1)
        q = torch.tensor([float(re.search(r"q=([\d.]+)", p).group(1)) if "q=" in p else 0.0 for p in prompts])
        return RewardOutput(pix + q, {"VQ": pix})


class QuantisedOracle(OracleReward):
    name = "quantised-oracle"

    def _score(self, prompts, media):
        out = super()._score(prompts, media)
        return RewardOutput(torch.round(out.scores * 2) / 2)


def solid(path, level: int) -> str:
    Image.new("RGB", (8, 8), (level, level, level)).save(path)
    return path.name


def oracle_judge(prompts, media):
    out = []
    for p in prompts:
        qa, qb = (float(x) for x in re.findall(r"q=([\d.]+)", p)[:2])
        out.append("[[A]]" if qa > qb else "[[B]]")
    return out


def biased_judge(prompts, media):
    return ["A is better. [[A]]"] * len(prompts)


def flaky_judge(prompts, media):
    # refuses (no verdict) whenever the better answer has q >= 0.9
    return ["I cannot tell." if max(float(x) for x in re.findall(r"q=([\d.]+)", p)[:2]) >= 0.9 else v
            for p, v in zip(prompts, oracle_judge(prompts, media))]


# ---------------------------------------------------------------------------------------------
@pytest.fixture
def mmrb(tmp_path):
    solid(tmp_path / "img.png", 0)
    rows = [  # (ID, q1, q2, Better, Category)
        ("pairs_1", 0.2, 0.7, "Output2", "safety"),
        ("tox_1", 0.95, 0.1, "Output1", "safety"),
        ("math_1", 0.5, 0.5, "Output1", "reasoning"),  # equal quality: a model tie
        ("code_1", 0.3, 0.6, "Output1", "reasoning"),  # humans disagree with the oracle
        ("vqa_1", 0.4, 0.92, "Output2", "vqa"),
    ]
    data = [{"ID": i, "Text": "describe", "Output1": f"q={a} one", "Output2": f"q={b} two", "Better": w,
             "Image": "img.png", "Category": c} for i, a, b, w, c in rows]
    (tmp_path / "all_data.json").write_text(json.dumps(data))
    return tmp_path / "all_data.json"


def test_mmrb_scalar_oracle_categories_and_zero_margin(mmrb, tmp_path):
    res = run_benchmark("multimodal-rewardbench", mmrb, tmp_path / "o", reward=OracleReward(), policy=FAST, progress=False)
    # right: pairs_1, tox_1, vqa_1; model tie: math_1; wrong: code_1
    assert res.metrics["accuracy"].value == pytest.approx(3 / 5)
    assert set(res.categories) == {"safety/bias", "safety/toxicity", "reasoning/math", "reasoning/coding", "vqa"}
    assert res.categories["reasoning/math"]["accuracy"].value == 0.0
    half = run_benchmark("multimodal-rewardbench", mmrb, tmp_path / "o", reward=OracleReward(),
                         policy=EvalPolicy(zero_margin="half", n_boot=50), progress=False)
    assert half.metrics["accuracy"].value == pytest.approx(3.5 / 5)
    drop = run_benchmark("multimodal-rewardbench", mmrb, tmp_path / "o", reward=OracleReward(),
                         policy=EvalPolicy(zero_margin="drop", n_boot=50), progress=False)
    assert drop.metrics["accuracy"].value == pytest.approx(3 / 4)
    lo, hi = res.metrics["accuracy"].ci
    assert 0 <= lo <= 3 / 5 <= hi <= 1


def test_mmrb_judges_position_bias_and_parse_failures(mmrb, tmp_path):
    res = run_benchmark("multimodal-rewardbench", mmrb, tmp_path / "b", judge=biased_judge, policy=FAST, progress=False)
    # always "A": right in AB order where Output1 is better (tox_1, math_1, code_1), in BA where Output2 is
    assert res.metrics["accuracy"].value == pytest.approx(3 / 5)
    assert res.metrics["accuracy_BA"].value == pytest.approx(2 / 5)
    assert res.metrics["position_consistency"].value == 0.0
    assert res.metrics["parse_failure_rate"].value == 0.0

    flaky = run_benchmark("multimodal-rewardbench", mmrb, tmp_path / "f", judge=flaky_judge, policy=FAST, progress=False)
    # failures on tox_1 (0.95) and vqa_1 (0.92) in both orders: 4 of 10 answers
    assert flaky.metrics["parse_failure_rate"].value == pytest.approx(4 / 10)
    # parsed AB verdicts: pairs_1 right, math_1 ("B": 0.5 > 0.5 false) wrong, code_1 wrong
    assert flaky.metrics["accuracy"].value == pytest.approx(1 / 5)
    assert flaky.metrics["position_consistency"].value == pytest.approx(2 / 3)  # math_1 flips with the order
    dropped = run_benchmark("multimodal-rewardbench", mmrb, tmp_path / "f", judge=flaky_judge,
                            policy=EvalPolicy(parse_failure="drop", n_boot=50), progress=False)
    assert dropped.metrics["accuracy"].value == pytest.approx(1 / 3)
    coin = random.Random(123)  # the published scorer's coin, drawn per failure in file order
    coin_credit = [float(("A" if coin.random() < 0.5 else "B") == want) for want in ("A", "B")]  # tox_1, vqa_1
    rnd = run_benchmark("multimodal-rewardbench", mmrb, tmp_path / "f", judge=flaky_judge,
                        policy=EvalPolicy(parse_failure="random", n_boot=50), progress=False)
    assert rnd.metrics["accuracy"].value == pytest.approx((1 + sum(coin_credit)) / 5)


def test_vl_rewardbench_groups_overall_and_macro(tmp_path):
    solid(tmp_path / "x.png", 0)
    rows = [  # (folder, q0, q1, human_ranking)
        ("vlfeedback", 0.9, 0.1, [0, 1]), ("wildvision-battle", 0.2, 0.8, [0, 1]),  # general: 1 of 2
        ("povid", 0.3, 0.6, [1, 0]), ("rlhf-v", 0.7, 0.2, [0, 1]), ("rlaif-v", 0.1, 0.4, [0, 1]),  # 2 of 3
        ("reasoning_tasks", 0.6, 0.5, [0, 1]),  # 1 of 1
    ]
    with open(tmp_path / "data.jsonl", "w") as f:
        for i, (folder, a, b, rank) in enumerate(rows):
            (tmp_path / "images" / folder).mkdir(parents=True, exist_ok=True)
            solid(tmp_path / "images" / folder / f"{i}.png", 0)
            f.write(json.dumps({"id": f"q{i}", "image_path": f"images/{folder}/{i}.png", "query": "q?",
                                "response": [f"q={a}", f"q={b}"], "human_ranking": rank}) + "\n")
    res = run_benchmark("vl-rewardbench", tmp_path / "data.jsonl", tmp_path / "o", reward=OracleReward(), policy=FAST, progress=False)
    assert res.metrics["overall_accuracy"].value == pytest.approx(4 / 6)
    assert res.metrics["macro_accuracy"].value == pytest.approx((1 / 2 + 2 / 3 + 1) / 3)
    assert res.categories["hallucination"]["accuracy"].value == pytest.approx(2 / 3)


@pytest.fixture
def genai(tmp_path):
    rows = [(200, 100, "leftvote"), (50, 150, "rightvote"), (120, 110, "tievote"), (90, 90, "bothbad_vote"), (10, 60, "leftvote")]
    data = []
    for i, (a, b, vote) in enumerate(rows):
        data.append({"prompt": "a scene", "left_image": solid(tmp_path / f"l{i}.png", a),
                     "right_image": solid(tmp_path / f"r{i}.png", b), "vote_type": vote})
    (tmp_path / "genai.jsonl").write_text("\n".join(json.dumps(d) for d in data))
    return tmp_path / "genai.jsonl"


def test_genai_bench_scalar_with_and_without_ties(genai, tmp_path):
    res = run_benchmark("genai-bench-image", genai, tmp_path / "o", reward=OracleReward(), policy=FAST, progress=False)
    assert res.metrics["accuracy"].value == pytest.approx(2 / 3)  # rows 0, 1 right; row 4 wrong
    # |m| thresholds 0, 10, 50, 100 (/255) give 3/5, 4/5, 4/5, 2/5
    assert res.metrics["accuracy_with_ties"].value == pytest.approx(4 / 5)
    assert res.metrics["tie_threshold"].value == pytest.approx(10 / 255, abs=1e-6)
    q = run_benchmark("genai-bench-image", genai, tmp_path / "q", reward=QuantisedOracle(),
                      policy=EvalPolicy(zero_margin="half", n_boot=50), progress=False)
    # quantised margins .5, -.5, 0, 0, 0: row 4 becomes a model tie on a left vote
    assert q.metrics["accuracy"].value == pytest.approx(2.5 / 3)
    assert q.metrics["accuracy_with_ties"].value == pytest.approx(4 / 5)
    assert q.counts["zero_margins"] == 1 and q.counts["distinct_abs_margins"] == 2


def test_genai_bench_four_way_judge(genai, tmp_path):
    def always_left(prompts, media):
        assert len(media[0]) == 2  # both images reach the judge
        return ["[[A>B]]"] * len(prompts)

    res = run_benchmark("genai-bench-image", genai, tmp_path / "j", judge=always_left, policy=FAST, progress=False)
    assert res.metrics["accuracy"].value == pytest.approx(2 / 5)  # the two left votes
    assert res.metrics["accuracy_BA"].value == pytest.approx(1 / 5)  # in BA order "A" is the right image
    assert res.metrics["position_consistency"].value == 0.0


def test_videogen_rewardbench_dimensions_and_fallback(tmp_path):
    header = ["path_A", "path_B", "A_model", "B_model", "prompt", "fps_A", "num_frames_A", "fps_B", "num_frames_B",
              "VQ", "MQ", "TA", "Overall"]
    rows = [(200, 100, "A", "A", "B", "A"), (50, 150, "B", "same", "B", "B"), (80, 80, "A", "A", "A", "same")]
    with open(tmp_path / "videogen-rewardbench.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for i, (a, b, vq, mq, ta, ov) in enumerate(rows):
            w.writerow([solid(tmp_path / f"a{i}.png", a), solid(tmp_path / f"b{i}.png", b), "m1", "m2", "p",
                        8, 48, 16, 96, vq, mq, ta, ov])
    res = run_benchmark("videogen-rewardbench", tmp_path / "videogen-rewardbench.csv", tmp_path / "o",
                        reward=OracleReward(), policy=FAST, progress=False)
    # Overall: rows 0, 1 right; row 2 human tie with model tie -> with ties 3/3
    assert res.metrics["Overall/accuracy"].value == 1.0
    assert res.metrics["Overall/accuracy_with_ties"].value == 1.0
    assert res.metrics["VQ/accuracy"].value == pytest.approx(2 / 3)  # row 2: zero margin counted wrong
    assert res.metrics["TA/accuracy"].value == pytest.approx(1 / 3)  # row 0 says B, row 2 says A
    assert any("MQ" in n and "TA" in n for n in res.notes) and not any("VQ" in n for n in res.notes)
    assert res.counts["frames"]["num_frames"] == {"min": 48.0, "max": 96.0, "mean": 72.0}


def test_mj_bench_with_and_without_tie(tmp_path):
    rows = [(200, 100, 0), (60, 110, 1), (140, 120, 0), (130, 160, 0)]  # quantised: 1 vs .5, 0 vs .5, .5 vs .5, .5 vs .5
    data = [{"caption": "c", "image0": solid(tmp_path / f"a{i}.png", a), "image1": solid(tmp_path / f"b{i}.png", b),
             "label": lab} for i, (a, b, lab) in enumerate(rows)]
    (tmp_path / "alignment.json").write_text(json.dumps(data))
    res = run_benchmark("mj-bench", tmp_path / "alignment.json", tmp_path / "o", reward=QuantisedOracle(),
                        policy=FAST, options={"perspective": "alignment"}, progress=False)
    assert res.metrics["accuracy_w_tie"].value == pytest.approx(2 / 4)
    assert res.metrics["accuracy_wo_tie"].value == pytest.approx(2 / 2)
    assert list(res.categories) == ["alignment"]


def test_imagereward_and_hpdv2_rankings(tmp_path):
    levels, ranks = [200, 100, 100, 250], [1, 2, 2, 3]
    paths = [solid(tmp_path / f"g{k}.png", v) for k, v in enumerate(levels)]
    (tmp_path / "ir.json").write_text(json.dumps([{"id": "p0", "prompt": "x", "generations": paths, "ranking": ranks},
                                                  {"id": "p1", "prompt": "x", "generations": paths[:2], "ranking": [1, 2]}]))
    res = run_benchmark("imagereward-test", tmp_path / "ir.json", tmp_path / "o1", reward=OracleReward(), policy=FAST, progress=False)
    # p0: pairs with distinct ranks (0,1) ok (0,2) ok (0,3) wrong (1,3) wrong (2,3) wrong; p1: ok -> 3 / 6
    assert res.metrics["accuracy"].value == pytest.approx(3 / 6)
    (tmp_path / "hpd.json").write_text(json.dumps([{"prompt": "x", "image_path": paths, "rank": ranks},
                                                   {"prompt": "x", "image_path": paths[:2], "rank": [1, 2]}]))
    res = run_benchmark("hpdv2-test", tmp_path / "hpd.json", tmp_path / "o2", reward=OracleReward(), policy=FAST, progress=False)
    assert res.metrics["accuracy"].value == pytest.approx(((1 - 3 / 6) + 1) / 2)  # macro over prompts


def test_pickapic_threshold_tuned_on_validation(tmp_path):
    def split(name, rows):
        data = [{"caption": "c", "jpg_0": solid(tmp_path / f"{name}{i}a.png", a), "jpg_1": solid(tmp_path / f"{name}{i}b.png", b),
                 "label_0": lab, "image_0_uid": f"{name}{i}a", "image_1_uid": f"{name}{i}b"} for i, (a, b, lab) in enumerate(rows)]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(d) for d in data))
        return tmp_path / f"{name}.jsonl"

    # scores x/255: P(0) = sigmoid(diff); a 0 vs 255 pair gives |p1 - p0| = tanh(0.5) = 0.462
    val = split("val", [(0, 255, 0.5), (255, 0, 1), (0, 0, 0.5)])
    test = split("test", [(0, 255, 0.5), (255, 0, 0), (0, 0, 1)])
    res = run_benchmark("pickapic", test, tmp_path / "o", reward=OracleReward(), policy=FAST,
                        options={"validation": str(val)}, progress=False)
    # validation: threshold 0 -> 0.5, 1, 1 = 2.5/3; >= 0.5 -> 1, 0.5, 1 = 2.5/3 as well... first max wins
    assert res.metrics["tie_threshold"].value == 0.0
    assert res.metrics["validation_accuracy"].value == pytest.approx(2.5 / 3)
    # test at threshold 0: pair 1 half (label tie), pair 2 wrong, pair 3 half (model tie) -> 1/3
    assert res.metrics["accuracy"].value == pytest.approx(1 / 3)
    fixed = run_benchmark("pickapic", test, tmp_path / "o", reward=OracleReward(),
                          policy=EvalPolicy(n_boot=50, pickapic_threshold=0.5), options={"validation": str(val)}, progress=False)
    assert fixed.metrics["accuracy"].value == pytest.approx((1 + 0.5 + 0.5) / 3)


def test_run_resumes_from_a_torn_file_and_writes_the_card(genai, tmp_path):
    calls = []

    def scorer(prompts, media):
        calls.append(len(media))
        return [float(np.asarray(Image.open(m)).mean() / 255) for m in media], {}

    out = tmp_path / "run"
    first = run_benchmark("genai-bench-image", genai, out, scorer=scorer, policy=FAST, progress=False, batch_size=4)
    lines = (out / "run.jsonl").read_text().splitlines()
    assert len(lines) == 5 and sum(calls) == 10
    (out / "run.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:10])  # crash mid-line
    calls.clear()
    again = run_benchmark("genai-bench-image", genai, out, scorer=scorer, policy=FAST, progress=False, batch_size=4)
    assert sum(calls) == 4  # only the two missing items were scored
    assert len(read_run(out / "run.jsonl")) == 5
    assert again.metrics["accuracy_with_ties"].value == first.metrics["accuracy_with_ties"].value
    card = json.loads((out / "results.json").read_text())
    assert card["policy"]["zero_margin"] == "wrong" and card["run"]["mode"] == "score"
    assert "accuracy_with_ties_sequential" in (out / "results.md").read_text()
    assert Image.open(out / "results.png").size[0] > 100
    with pytest.raises(ConfigError, match="another mode"):
        run_benchmark("genai-bench-image", genai, out, judge=biased_judge, policy=FAST, progress=False)


def test_bad_inputs_name_the_problem(tmp_path, genai):
    (tmp_path / "bad.json").write_text(json.dumps([{"prompt": "x", "left_image": "a.png"}]))
    with pytest.raises(ConfigError, match=r"lacks the columns \['right_image', 'vote_type'\]"):
        run_benchmark("genai-bench-image", tmp_path / "bad.json", tmp_path / "o", reward=OracleReward(), progress=False)
    with pytest.raises(ConfigError, match="unknown benchmark 'nope'"):
        run_benchmark("nope", genai, tmp_path / "o", reward=OracleReward(), progress=False)
    with pytest.raises(ConfigError, match="scalar rewards only"):
        run_benchmark("imagereward-test", genai, tmp_path / "o", judge=biased_judge, progress=False)
    with pytest.raises(ConfigError, match="zero_margin"):
        EvalPolicy(zero_margin="skip")


def test_cli_bench_with_a_registered_reward(tmp_path, capsys):
    from vlm_rm.cli import main

    # the registry's 'mock' reward: -mean((pixel - colour named in the prompt)^2)
    def img(name, rgb):
        Image.new("RGB", (8, 8), rgb).save(tmp_path / name)
        return name

    rows = [{"prompt": "red", "left_image": img("r.png", (255, 0, 0)), "right_image": img("g.png", (0, 255, 0)), "vote_type": "leftvote"},
            {"prompt": "green", "left_image": "r.png", "right_image": "g.png", "vote_type": "leftvote"},
            {"prompt": "blue", "left_image": "r.png", "right_image": "g.png", "vote_type": "tievote"}]
    (tmp_path / "g.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    code = main(["bench", "--reward", "mock", "--benchmark", "genai-bench-image", "--data", str(tmp_path / "g.jsonl"),
                 "--out", str(tmp_path / "out"), "--n-boot", "20", "--quiet"])
    assert code == 0
    card = json.loads((tmp_path / "out" / "results.json").read_text())
    # red prompt: red image wins (right); green prompt: red image scores lower (wrong); blue: both -2/3, a tie
    assert card["metrics"]["accuracy"]["value"] == pytest.approx(0.5)
    assert card["metrics"]["accuracy_with_ties"]["value"] == pytest.approx(2 / 3)
    assert card["run"]["reward"] == "mock"
    assert main(["bench", "--reward", "mock", "--benchmark", "genai-bench-image", "--data", str(tmp_path / "missing.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
