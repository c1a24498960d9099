"""benchmarks/gpu_scale.py at reduced geometry on CPU: the report has every row, consistent numbers and
a three-point cost model per axis; the linear-fit helper matches a hand computation."""

from __future__ import annotations

import gc
import json
import math

import pytest
import torch

from benchmarks import gpu_scale
from benchmarks._timing import linear_fit_deviation


@pytest.fixture(scope="module")
def _heavy_imports_frozen():
    """Keep the benchmarks' full garbage collections (one before every memory measurement) off the libraries.

    peak_memory_mb collects garbage before it reads the baseline RSS; in a test process that holds torch,
    transformers and diffusers (~500k objects) each full collection walked them all (~0.5-1 s, 19 times in the
    gpu_scale report). The libraries the benchmarks import lazily are imported here, and gc.freeze() moves what
    is alive (none of it garbage after the collection) out of the collector's reach; everything a benchmark
    allocates is still collected as before."""
    import importlib

    import diffusers
    import transformers

    for module in ("benchmarks.rl_step", "benchmarks.rl_step_families", "benchmarks.rl_step_video",
                   "benchmarks.scoring_throughput", "diffusion_rl.pipelines", "diffusion_rl.rollout",
                   "diffusion_rl.trainer", "mmreward.testing.tiny_models"):
        importlib.import_module(module)
    for lib, names in ((diffusers, ("StableDiffusion3Pipeline", "WanPipeline", "SD3Transformer2DModel",
                                    "WanTransformer3DModel", "AutoencoderKL", "AutoencoderKLWan")),
                       (transformers, ("CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel",
                                       "UMT5EncoderModel", "CLIPModel"))):
        for name in names:
            getattr(lib, name)  # the lazy modules behind these names
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _frozen_heap(_heavy_imports_frozen):
    """What earlier tests imported lazily is frozen too (cheap: the libraries above are not walked again)."""
    gc.collect()
    gc.freeze()
    yield


def test_linear_fit_deviation_matches_hand_computation():
    # y = 2x + 1 is linear: no deviation anywhere
    assert linear_fit_deviation([1, 2, 4], [3, 5, 9]) == pytest.approx([0, 0, 0], abs=1e-12)
    # y = x^2 at 1, 2, 4: least-squares line y = 36/7 x - 5 (by hand), so |y - fit| / y is
    # (1 - 1/7) / 1, (37/7 - 4) / 4 and (16 - 109/7) / 16
    dev = linear_fit_deviation([1, 2, 4], [1, 4, 16])
    assert dev == pytest.approx([6 / 7, 9 / 28, 3 / 112], rel=1e-9)


def test_gpu_scale_reduced_cpu_report(tmp_path, capsys):
    out = tmp_path / "report.json"
    rc = gpu_scale.main(["--geometry", "reduced", "--device", "cpu", "--families", "sd3", "wan21", "hpsv2",
                         "--batch", "2", "--steps", "2", "--repeats", "1", "--cost-sizes", "16,24,32",
                         "--cost-steps", "1,2,4", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["dtype"] == "float32" and report["geometry"] == "reduced"
    rows = {(r["family"], r["measure"]): r for r in report["rows"]}
    assert set(rows) == {("sd3", "rollout_vs_sampling"), ("sd3", "xformers_vs_sdpa"), ("sd3", "train_vs_fwd_bwd"),
                         ("wan21", "rollout_vs_sampling"), ("wan21", "train_vs_fwd_bwd"), ("hpsv2", "scoring_vs_forward")}
    assert rows["sd3", "xformers_vs_sdpa"]["status"].startswith("skipped")  # CUDA only
    # Wan runs (tiny, 5 frames) through the same rows, plus its memory grid over frames
    assert [(r["frames"], r["height"]) for r in report["wan_memory"]] == [(5, 32), (9, 32)]
    assert all(math.isfinite(r["peak_mb"]) and r["peak_mb"] >= 0 for r in report["wan_memory"])
    measured = [r for r in report["rows"] if r["status"] == "ok"]
    assert len(measured) == 5
    for r in measured:
        for key in ("ours_s", "base_s", "ours_peak_mb", "base_peak_mb", "ours_items_per_s", "base_items_per_s"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["family"], r["measure"], key, r[key])
        # the ratio columns are the quotients of the absolute columns
        assert r["time_ratio"] == pytest.approx(r["ours_s"] / r["base_s"], rel=1e-12)
        assert r["speed_ratio"] == pytest.approx(r["base_s"] / r["ours_s"], rel=1e-12)
        assert r["peak_ratio"] == pytest.approx(r["ours_peak_mb"] / r["base_peak_mb"], rel=1e-12)
        assert r["ours_items_per_s"] == pytest.approx(2 / r["ours_s"], rel=1e-12)
        assert r["base_items_per_s"] == pytest.approx(2 / r["base_s"], rel=1e-12)
        assert r["meets_target"] == (r["ours_s"] / r["base_s"] <= r["target_max_time_ratio"])
    cm = report["cost_model"]
    assert cm["family"] == "sd3"
    expected_x = {"batch": [1, 2, 4], "resolution": [16 * 16, 24 * 24, 32 * 32], "steps": [1, 2, 4]}
    assert set(cm["axes"]) == set(expected_x)
    for axis, points in cm["axes"].items():
        assert [p["x"] for p in points] == expected_x[axis]
        assert all(math.isfinite(p["time_s"]) and p["time_s"] > 0 for p in points)
        dev = linear_fit_deviation([p["x"] for p in points], [p["time_s"] for p in points])
        assert [p["time_dev"] for p in points] == pytest.approx(dev, rel=1e-9)
        assert [("time" in p["nonlinear"]) for p in points] == [d > 0.15 for d in dev]
    table = capsys.readouterr().out
    assert "rollout_vs_sampling" in table and "cost model" in table


def test_gpu_scale_one_failing_family_is_a_row_and_the_json_is_written_after_each(tmp_path, monkeypatch, capsys):
    """At the real geometry one family can run out of memory: the others still run, the failure is a row
    (exit 1), and the JSON on disk holds each finished family even while later ones run."""
    out = tmp_path / "report.json"
    real_bench_reward = gpu_scale.bench_reward
    seen_on_disk = []

    def bench_reward(family, args, tmp):
        if out.exists():  # what a run killed now would leave behind
            seen_on_disk.append([r["family"] for r in json.loads(out.read_text())["rows"]])
        if family == "pickscore":
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_bench_reward(family, args, tmp)

    monkeypatch.setattr(gpu_scale, "bench_reward", bench_reward)
    rc = gpu_scale.main(["--geometry", "reduced", "--device", "cpu", "--families", "hpsv2", "pickscore", "imagereward",
                         "--batch", "2", "--repeats", "1", "--json", str(out)])
    assert rc == 1
    report = json.loads(out.read_text())
    status = {r["family"]: r["status"] for r in report["rows"]}
    assert status["hpsv2"] == "ok" and status["imagereward"] == "ok"
    assert status["pickscore"].startswith("failed: OutOfMemoryError") and "simulated" in status["pickscore"]
    assert seen_on_disk == [["hpsv2"], ["hpsv2", "pickscore"]]
    assert set(report["family_seconds"]) == {"hpsv2", "pickscore", "imagereward"}
    assert all(s >= 0 for s in report["family_seconds"].values())
    assert "failed: OutOfMemoryError" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--families", "sd3", "nope"], "unknown families ['nope']"),
    (["--geometry", "real", "--device", "cpu"], "needs a CUDA device"),
    (["--device", "cpu", "--cost-batches", "1,2"], "three positive integers"),
])
def test_gpu_scale_usage_errors_are_one_line_exit_2(argv, message, capsys):
    assert gpu_scale.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_rl_step_wan_reports_overheads_and_memory_growing_with_frames(tmp_path, capsys):
    from benchmarks import rl_step

    out = tmp_path / "wan.json"
    # through rl_step.py's --family switch, as the README runs it
    rc = rl_step.main(["--family", "wan", "--device", "cpu", "--batch", "2", "--steps", "2", "--repeats", "1",
                       "--frames", "5", "--size", "32", "--mem-frames", "5,33", "--mem-sizes", "64", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and "RSS" in report["memory_metric"]
    assert [r["measure"] for r in report["overheads"]] == ["rollout_vs_sampling", "train_vs_fwd_bwd"]
    for r in report["overheads"]:
        for key in ("ours_s", "base_s", "ours_peak_mb", "base_peak_mb"):
            assert math.isfinite(r[key]) and r[key] >= 0, (r["measure"], key)
        assert r["time_ratio"] == pytest.approx(r["ours_s"] / r["base_s"], rel=1e-12)
    grid = report["memory"]
    assert [(r["frames"], r["height"], r["width"]) for r in grid] == [(5, 64, 64), (33, 64, 64)]
    # Wan: latent frames (T - 1) / 4 + 1, tokens T' x (H / 8 / 2) x (W / 8 / 2) with patch (1, 2, 2)
    assert [(r["latent_frames"], r["tokens"]) for r in grid] == [(2, 2 * 4 * 4), (9, 9 * 4 * 4)]
    # 4.5x the tokens: the step's activations, and so its peak, grow (measured ~2 MiB -> ~8 MiB)
    assert grid[1]["peak_mb"] > grid[0]["peak_mb"], grid
    table = capsys.readouterr().out
    assert "rollout_vs_sampling" in table and "frames x resolution" in table


def test_rl_step_unknown_family_is_one_line_exit_2(capsys):
    from benchmarks import rl_step

    assert rl_step.main(["--family", "hunyuan"]) == 2
    err = capsys.readouterr().err
    assert "--family must be" in err and err.count("\n") == 1


def test_gpu_scale_bf16_rewards_feed_the_bare_forward_its_dtype(tmp_path):
    """On a GPU the benchmark runs in bf16: the bare forward's preprocessed pixels (fp32) must be cast to the
    network's dtype, as the H200 run showed (HPSv2 and ImageReward failed with a dtype mismatch)."""
    out = tmp_path / "report.json"
    rc = gpu_scale.main(["--geometry", "reduced", "--device", "cpu", "--dtype", "bf16", "--families", "hpsv2",
                         "imagereward", "--batch", "2", "--repeats", "1", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["dtype"] == "bfloat16"
    assert [(r["family"], r["status"]) for r in report["rows"]] == [("hpsv2", "ok"), ("imagereward", "ok")]


def test_rl_step_newer_families_report_both_ratios(tmp_path, capsys):
    """benchmarks/rl_step_families.py through rl_step.py's --family switch, on the cheapest image family and the
    two-expert Wan 2.2 (whose bare step routes a batch over both experts)."""
    from benchmarks import rl_step, rl_step_families

    out = tmp_path / "rows.json"
    assert rl_step.main(["--family", "z_image", "--batch", "2", "--steps", "2", "--repeats", "1",
                         "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert rl_step_families.main(["--families", "wan22", "--batch", "2", "--steps", "2", "--repeats", "1",
                                  "--json", str(out)]) == 0
    rows += json.loads(out.read_text())
    assert [(r["family"], r["pipeline"]) for r in rows] == [("z_image", "ZImagePipeline"), ("wan22", "WanPipeline")]
    for r in rows:
        for key in ("rollout_s", "sampling_s", "trainer_s", "bare_s"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["family"], key)
        assert r["rollout_ratio"] == pytest.approx(r["rollout_s"] / r["sampling_s"], rel=1e-12)
        assert r["trainer_ratio"] == pytest.approx(r["trainer_s"] / r["bare_s"], rel=1e-12)
        assert r["trained_steps"] == 1  # timestep_fraction 0.5 of 2 SDE steps
    assert "wan22" in capsys.readouterr().out
    assert set(rl_step_families.FAMILIES) == {"qwen_image", "qwen_image21", "z_image", "flux2", "flux2_klein", "wan22",
                                             "wan_i2v"}
