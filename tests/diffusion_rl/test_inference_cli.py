"""`diffusion-rl reno` and `diffusion-rl best-of-n` end to end on a tiny SD pipeline."""

from __future__ import annotations

import json

import pytest
import torch

from diffusion_rl.cli import main
from tests._helpers.inference_fixtures import one_thread  # noqa: F401 - shared fixtures


def _base(tiny_pipeline_dir, out):
    return ["--pipeline", str(tiny_pipeline_dir("sd")), "--height", "16", "--width", "16", "--device", "cpu",
            "--output", str(out), "--no-progress"]


def test_reno_cli_writes_images_history_and_summary(tiny_pipeline_dir, tmp_path, capsys):
    out = tmp_path / "reno"
    rc = main(["reno", *_base(tiny_pipeline_dir, out), "--prompt", "a red circle", "--prompt", "a blue square",
               "--reward", "mock=2", "--iters", "4"])
    assert rc == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["best_000.png", "best_001.png", "initial_000.png", "initial_001.png"]
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [h["iteration"] for h in history] == [0, 1, 2, 3]
    assert all(len(h["mock"]) == 2 for h in history)
    for h in history:  # the objective is the weighted reward
        assert h["total"] == pytest.approx([2 * m for m in h["mock"]], rel=1e-6)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best"]["total"] == pytest.approx([max(h["total"][i] for h in history) for i in range(2)])
    assert "objective" in capsys.readouterr().out


def test_reno_cli_with_exploration(tiny_pipeline_dir, tmp_path):
    out = tmp_path / "explore"
    rc = main(["reno", *_base(tiny_pipeline_dir, out), "--prompt", "a red circle", "--reward", "mock=1",
               "--iters", "2", "--explore", "3", "--top-k", "2"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_total"][0] >= summary["explored_best_total"][0]
    assert len(summary["reno"]["prompts"]) == 2  # the two optimised starts


def test_best_of_n_cli_takes_a_non_differentiable_reward(tiny_pipeline_dir, tmp_path, capsys):
    out = tmp_path / "bon"
    rc = main(["best-of-n", *_base(tiny_pipeline_dir, out), "--prompt", "a red circle",
               "--reward", "jpeg-compressibility=1", "--n", "4", "--batch-size", "3"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    totals = torch.tensor(summary["totals"][0])
    assert summary["best_index"] == [int(totals.argmax())]
    assert summary["curve"]["4"] == pytest.approx(float(totals.max()))
    assert summary["curve"]["1"] == pytest.approx(float(totals.mean()))
    assert (out / "best_000.png").is_file()
    assert "N=4" in capsys.readouterr().out


def test_cli_errors_are_clear(tiny_pipeline_dir, tmp_path, capsys):
    base = _base(tiny_pipeline_dir, tmp_path / "x")
    assert main(["reno", *base, "--prompt", "a", "--reward", "jpeg-compressibility=1", "--iters", "2"]) == 2
    assert "not differentiable" in capsys.readouterr().err
    assert main(["reno", *base, "--prompt", "a", "--reward", "mock=heavy"]) == 2
    assert "NAME=WEIGHT" in capsys.readouterr().err
    assert main(["best-of-n", *base, "--reward", "mock=1"]) == 2
    assert "at least one prompt" in capsys.readouterr().err


def test_reno_cli_random_views_change_the_objective_not_the_outputs(tiny_pipeline_dir, tmp_path):
    plain_out, views_out = tmp_path / "plain", tmp_path / "views"
    args = ["--prompt", "a red circle", "--reward", "mock=1", "--iters", "1"]
    assert main(["reno", *_base(tiny_pipeline_dir, plain_out), *args]) == 0
    assert main(["reno", *_base(tiny_pipeline_dir, views_out), *args, "--views", "4", "--view-noise", "0.2"]) == 0
    plain = json.loads((plain_out / "history.jsonl").read_text().splitlines()[0])
    viewed = json.loads((views_out / "history.jsonl").read_text().splitlines()[0])
    # same initial noise and image; the objective is an average over noisy views, so its value moves
    assert (plain_out / "initial_000.png").read_bytes() == (views_out / "initial_000.png").read_bytes()
    assert viewed["mock"][0] != pytest.approx(plain["mock"][0], rel=1e-4)

def test_reno_cli_rejects_zero_views(tiny_pipeline_dir, tmp_path, capsys):
    args = ["--prompt", "a red circle", "--reward", "mock=1", "--iters", "1", "--views", "0"]
    assert main(["reno", *_base(tiny_pipeline_dir, tmp_path / "bad"), *args]) == 2
    assert "views must be >= 1" in capsys.readouterr().err
