"""Registered generative judges on judge benchmarks: the adapter, and `vlm-rm bench --reward unifiedreward`."""

from __future__ import annotations

import json
import re

import pytest
import torch
from PIL import Image

from mmreward.errors import ConfigError
from mmreward.media import read_image
from mmreward.types import Reward, RewardOutput
from vlm_rm.bench import EvalPolicy, run_benchmark
from vlm_rm.bench.judges import PAIR_JUDGE_TEMPLATE
from vlm_rm.bench.registry_judge import is_text_judge, judge_from_reward
from vlm_rm.bench.runner import read_run

FAST = EvalPolicy(n_boot=50)


class EchoBackend:
    """Records every batch; answers "[[A]]" when answer A's q= is higher, else "[[B]]" (A/B read from the text)."""

    name = "echo"

    def __init__(self) -> None:
        self.batches: list[list] = []

    def generate(self, requests, *, n=1, temperature=0.0, seed=0):
        assert n == 1 and temperature == 0.0
        self.batches.append(list(requests))
        out = []
        for r in requests:
            qs = [float(x) for x in re.findall(r"q=([\d.]+)", r.text)[:2]]
            out.append(["[[A]]" if len(qs) == 2 and qs[0] > qs[1] else "[[B]]"])
        return out


class FakeJudge(Reward):
    name = "fake-judge"
    requires_prompt = False

    def __init__(self) -> None:
        super().__init__()
        self.backend = EchoBackend()

    def _score(self, prompts, media):
        return RewardOutput(torch.zeros(len(media)))


class Plain(Reward):
    name = "plain"
    requires_prompt = False

    def _score(self, prompts, media):
        return RewardOutput(media.flatten(1).mean(1))


@pytest.fixture
def mmrb(tmp_path):
    Image.new("RGB", (8, 8), (10, 200, 30)).save(tmp_path / "img.png")
    rows = [("a", 0.9, 0.1, "Output1"), ("b", 0.2, 0.8, "Output2"), ("c", 0.7, 0.3, "Output2")]
    data = [{"ID": i, "Text": "describe", "Output1": f"q={x} one", "Output2": f"q={y} two", "Better": w,
             "Image": "img.png", "Category": "vqa"} for i, x, y, w in rows]
    (tmp_path / "all_data.json").write_text(json.dumps(data))
    return tmp_path / "all_data.json"


def test_adapter_loads_media_groups_batches_and_feeds_the_harness(mmrb, tmp_path):
    fake = FakeJudge()
    judge = judge_from_reward(fake)
    a = str(tmp_path / "img.png")
    Image.new("RGB", (4, 6), (255, 0, 0)).save(tmp_path / "red.png")
    b = str(tmp_path / "red.png")
    answers = judge(["q=0.9 q=0.1", "q=0.1 q=0.9", "q=0.5 q=0.2"], [[a], [a, b], [b]])
    assert answers == ["[[A]]", "[[B]]", "[[A]]"]
    # one batch of one-image requests, one of two-image requests (backends need uniform batches)
    sizes = sorted(len(batch) for batch in fake.backend.batches)
    assert sizes == [1, 2]
    two = next(batch for batch in fake.backend.batches if len(batch) == 1)[0]
    torch.testing.assert_close(two.media[0], read_image(a))
    torch.testing.assert_close(two.media[1], read_image(b))

    # through the harness: right on a and b, wrong on c (human says Output2); both orders agree
    res = run_benchmark("multimodal-rewardbench", mmrb, tmp_path / "o", judge=judge_from_reward(FakeJudge()),
                        policy=FAST, progress=False)
    assert res.metrics["accuracy"].value == pytest.approx(2 / 3)
    assert res.metrics["position_consistency"].value == pytest.approx(1.0)
    assert res.metrics["parse_failure_rate"].value == 0.0


def test_adapter_rejects_rewards_without_text_verdicts():
    assert not is_text_judge(Plain()) and is_text_judge(FakeJudge())
    with pytest.raises(ConfigError, match="writes no text verdicts"):
        judge_from_reward(Plain())


def test_cli_bench_with_the_registered_tiny_unifiedreward(mmrb, tmp_path, capsys):
    """`vlm-rm bench --reward unifiedreward` on a judge benchmark asks the judge the benchmark's question."""
    pytest.importorskip("transformers")
    import mmreward
    from mmreward.judges.backends import JudgeRequest
    from vlm_rm.cli import main

    base = ["bench", "--benchmark", "multimodal-rewardbench", "--data", str(mmrb), "--weights", "random",
            "--n-boot", "20", "--quiet", "--batch-size", "2"]
    args = [*base, "--load-option", "tiny=true"]
    assert main([*args, "--reward", "unifiedreward", "--out", str(tmp_path / "j")]) == 0
    records = read_run(tmp_path / "j" / "run.jsonl")
    assert {r["mode"] for r in records.values()} == {"judge"} and set(records["b"]["outputs"]) == {"AB", "BA"}
    card = json.loads((tmp_path / "j" / "results.json").read_text())
    assert card["run"]["judge"] == "unifiedreward" and card["run"]["load_options"] == {"tiny": True}
    assert 0 <= card["metrics"]["parse_failure_rate"]["value"] <= 1

    # the stored answers are what the same seeded judge writes for the benchmark's prompt and image
    judge = mmreward.load("unifiedreward", weights="random", tiny=True)
    text = PAIR_JUDGE_TEMPLATE.format(query="describe", answer_a="q=0.2 one", answer_b="q=0.8 two")
    want = judge.backend.generate([JudgeRequest(text, [read_image(mmrb.parent / "img.png")])])[0][0]
    assert records["b"]["outputs"]["AB"] == want

    # --pointwise scores the same judge as a scalar reward instead
    assert main([*args, "--reward", "unifiedreward", "--load-option", "mode=\"soft\"", "--pointwise",
                 "--out", str(tmp_path / "s")]) == 0
    assert {r["mode"] for r in read_run(tmp_path / "s" / "run.jsonl").values()} == {"score"}

    # a reward that writes no text cannot be a judge; bad --load-option syntax is named
    assert main([*base, "--judge", "mock", "--out", str(tmp_path / "m")]) == 2  # a usage error
    assert "writes no text verdicts" in capsys.readouterr().err
    assert main([*base, "--reward", "unifiedreward", "--load-option", "tiny", "--out", str(tmp_path / "x")]) == 2
    assert "--load-option expects KEY=VALUE" in capsys.readouterr().err
