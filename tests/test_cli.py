"""The mmreward CLI: list, score (streaming, per-item errors, CSV/JSONL, manifests, sharding), compare."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmreward.cli import main
from mmreward.models.compressibility import jpeg_size_kb

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def folder(tmp_path):
    rng = np.random.default_rng(0)
    d = tmp_path / "imgs"
    (d / "sub").mkdir(parents=True)
    for i in range(5):
        arr = (rng.random((16, 16, 3)) * (i + 1) * 50).clip(0, 255).astype(np.uint8)
        Image.fromarray(arr).save(d / ("sub" if i == 4 else ".") / f"img{i}.png")
    (d / "img2_broken.png").write_bytes(b"\x89PNG\r\nbroken")
    return d


def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_list_shows_registered_rewards(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "jpeg-compressibility" in out and "DIFFERENTIABLE" in out
    assert main(["list", "--json"]) == 0
    names = {r["name"] for r in json.loads(capsys.readouterr().out)}
    assert {"mock", "jpeg-compressibility"} <= names


def test_score_folder_records_broken_items_and_goes_on(folder, tmp_path):
    out = tmp_path / "s.jsonl"
    code = main(["score", "--reward", "jpeg-incompressibility", str(folder), "--out", str(out),
                 "--batch-size", "2", "--no-progress"])
    assert code == 1  # one item failed
    rows = _rows(out)
    assert [r["index"] for r in rows] == list(range(6))
    broken = [r for r in rows if r["error"]]
    assert len(broken) == 1 and broken[0]["media"].endswith("img2_broken.png") and broken[0]["score"] is None
    good = [r for r in rows if not r["error"]]
    from mmreward.media import read_image

    for r in good:  # scores equal an independent encode of each file
        assert r["score"] == pytest.approx(float(jpeg_size_kb(read_image(r["media"])[None])[0]))


def test_csv_output_and_prompt_files(folder, tmp_path):
    files = sorted(p for p in folder.rglob("*.png") if "broken" not in p.name)
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(["red", "blue", "green", "red", "yellow"]))
    out = tmp_path / "s.csv"
    code = main(["score", "--reward", "mock", "--prompts", str(prompts), *map(str, files), "--out", str(out), "--no-progress"])
    assert code == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["prompt"] for r in rows] == ["red", "blue", "green", "red", "yellow"]
    assert all(float(r["score"]) <= 0 for r in rows)
    prompts.write_text("red\nblue")
    assert main(["score", "--reward", "mock", "--prompts", str(prompts), *map(str, files), "--no-progress"]) == 2

    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps({"prompt": "red", "media": str(f)}) for f in files[:2]))
    out2 = tmp_path / "m_out.jsonl"
    assert main(["score", "--reward", "mock", "--prompts", str(manifest), "--out", str(out2), "--no-progress"]) == 0
    assert [r["media"] for r in _rows(out2)] == [str(f) for f in files[:2]]


def test_usage_errors_are_reported(capsys, folder):
    assert main(["score", "--reward", "no-such-reward", str(folder), "--no-progress"]) == 2
    assert "unknown reward 'no-such-reward'" in capsys.readouterr().err
    assert main(["score", "--reward", "mock", str(folder), "--out", "x.txt"]) == 2
    assert main(["score", "--reward", "mock", "--no-progress"]) == 2
    assert main(["score", "--reward", "mock", str(folder), "--batch-size", "0"]) == 2


def test_compare(folder, tmp_path, capsys):
    red = tmp_path / "red.png"
    blue = tmp_path / "blue.png"
    Image.new("RGB", (8, 8), (255, 0, 0)).save(red)
    Image.new("RGB", (8, 8), (0, 0, 255)).save(blue)
    assert main(["compare", "--reward", "mock", "--prompt", "a red square", str(red), str(blue)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["prob_a"] > 0.5  # exact value: sigmoid(0 - (-2/3)) for the mock reward
    assert row["prob_a"] == pytest.approx(1 / (1 + np.exp(-2 / 3)), abs=1e-6)


def test_module_entry_points():
    for module in ("mmreward", "diffusion_rl", "vlm_rm"):
        res = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, cwd=ROOT)
        assert res.returncode == 0 and res.stdout.strip() == "0.1.0", (module, res.stderr)


def test_two_process_sharding_merges_in_input_order(folder, tmp_path):
    """torchrun with 2 CPU processes (gloo): each scores half, rank 0 writes one output equal to 1 process."""
    single = tmp_path / "one.jsonl"
    main(["score", "--reward", "jpeg-incompressibility", str(folder), "--out", str(single), "--no-progress"])
    merged = tmp_path / "two.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
         "-m", "mmreward", "score", "--reward", "jpeg-incompressibility", str(folder), "--out", str(merged),
         "--no-progress"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
    )
    assert res.returncode == 1, res.stderr[-2000:]  # the broken item is reported across ranks
    assert _rows(merged) == _rows(single)
    assert not list(tmp_path.glob("*.part"))


def test_score_keeps_alpha_for_families_that_resize_rgba_first(tmp_path):
    """imagereward's original resizes RGBA before dropping alpha: the CLI must hand it the alpha too."""
    rng = np.random.default_rng(1)
    rgba = np.concatenate([(rng.random((60, 90, 3)) * 255).astype(np.uint8), np.zeros((60, 90, 1), np.uint8)], -1)
    rgba[..., 3] = np.linspace(0, 255, 90).round().astype(np.uint8)[None, :]
    Image.fromarray(rgba).save(tmp_path / "a_transparent.png")
    Image.fromarray(rgba[..., :3]).save(tmp_path / "b_rgb.png")
    opaque = rgba.copy()
    opaque[..., 3] = 255
    Image.fromarray(opaque).save(tmp_path / "c_opaque.png")
    out = tmp_path / "s.jsonl"
    code = main(["score", "--reward", "imagereward", "--weights", "random", "--option", "tiny=true", "--prompt", "a cat",
                 *(str(tmp_path / n) for n in ("a_transparent.png", "b_rgb.png", "c_opaque.png")),
                 "--out", str(out), "--no-progress"])
    assert code == 0
    transparent, rgb, opaque_score = (r["score"] for r in _rows(out))
    assert opaque_score == rgb
    assert abs(transparent - rgb) > 1e-4
