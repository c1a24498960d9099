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

ROOT = Path(__file__).resolve().parents[2]


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
    # one interpreter runs the three `python -m <package> --version` (runpy, as -m does; torch is imported once,
    # not three times); each exit code and stdout is captured on its own
    code = ("import contextlib, io, json, runpy, sys\nres = {}\n"
            "for module in ('mmreward', 'diffusion_rl', 'vlm_rm'):\n"
            "    sys.argv = [module, '--version']\n    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out):\n"
            "        try:\n            runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
            "            rc = 0\n"
            "        except SystemExit as exc:\n            rc = 0 if exc.code is None else exc.code\n"
            "    res[module] = [rc, out.getvalue()]\nprint(json.dumps(res))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.splitlines()[-1])
    for module in ("mmreward", "diffusion_rl", "vlm_rm"):
        rc, out = res[module]
        assert rc == 0 and out.strip() == "0.1.0", (module, rc, out, proc.stderr[-2000:])


def test_two_process_sharding_merges_in_input_order(folder, tmp_path):
    """torchrun with 2 CPU processes (gloo): each scores half, rank 0 writes one output equal to 1 process."""
    single = tmp_path / "one.jsonl"
    main(["score", "--reward", "jpeg-incompressibility", str(folder), "--out", str(single), "--no-progress"])
    merged = tmp_path / "two.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # --standalone: a free rendezvous port, not a fixed one that another run on the machine may hold
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
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


# ----------------------------------------------------------------------------------------------
# usage errors: one line on stderr, exit 2, never a traceback, nothing scored
# ----------------------------------------------------------------------------------------------
def _one_line_usage_error(capsys, run, argv, fragment):
    code = run(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got: {err!r}"
    assert fragment.lower() in lines[0].lower(), lines[0]
    assert "Traceback" not in err


def _usage_cases(tmp_path, img):
    bad_rows = {
        "not_json": "{oops",
        "not_object": json.dumps([1, 2]),
        "no_media": json.dumps({"prompt": "x"}),
        "media_not_string": json.dumps({"media": 3}),
        "prompt_not_string": json.dumps({"media": str(img), "prompt": ["x"]}),
    }
    cases = {}
    for name, row in bad_rows.items():
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"media": str(img), "prompt": "ok"}) + "\n" + row + "\n")
        cases[f"manifest_{name}"] = (["score", "--reward", "mock", "--prompts", str(tmp_path / f"{name}.jsonl")], "line 2")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (tmp_path / "pairs_bad.jsonl").write_text(json.dumps({"prompt": "x", "a": str(img)}) + "\n")
    (tmp_path / "pairs_junk.jsonl").write_text("not json\n")
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"prompt": "x", "a": str(img), "b": str(img)}) + "\n")
    score = ["score", "--reward", "mock", "--prompt", "red", str(img)]
    cases.update({
        "out_missing_folder": ([*score, "--out", str(tmp_path / "no" / "such" / "s.jsonl")], "--out"),
        "out_is_folder": ([*score, "--out", str(tmp_path / "dir.jsonl")], "--out"),
        "prompts_missing": (["score", "--reward", "mock", "--prompts", str(tmp_path / "nope.txt"), str(img)], "--prompts"),
        "prompts_not_utf8": (["score", "--reward", "mock", "--prompts", str(tmp_path / "latin1.txt"), str(img)], "UTF-8"),
        "option_no_equals": ([*score, "--option", "micro_batch_size"], "KEY=VALUE"),
        "option_unknown": ([*score, "--option", "no_such_option=1"], "no_such_option"),
        "option_bad_value": ([*score, "--option", "micro_batch_size=\"x\""], "micro_batch_size"),
        "device_banana": ([*score, "--device", "banana"], "banana"),
        "device_missing_cuda": ([*score, "--device", f"cuda:{7 + _cuda_count()}"], "cuda"),
        "dtype_bad": ([*score, "--dtype", "fp7"], "dtype"),
        "batch_size_text": ([*score, "--batch-size", "many"], "--batch-size"),
        "max_image_pixels_zero": ([*score, "--max-image-pixels", "0"], "--max-image-pixels"),
        "unknown_flag": ([*score, "--frobnicate"], "--frobnicate"),
        "unknown_command": (["frobnicate"], "frobnicate"),
        "pairs_missing": (["compare", "--reward", "mock", "--pairs", str(tmp_path / "nope.jsonl")], "--pairs"),
        "pairs_missing_b": (["compare", "--reward", "mock", "--pairs", str(tmp_path / "pairs_bad.jsonl")], "line 1"),
        "pairs_not_json": (["compare", "--reward", "mock", "--pairs", str(tmp_path / "pairs_junk.jsonl")], "line 1"),
        "compare_out_missing_folder": (["compare", "--reward", "mock", "--pairs", str(tmp_path / "pairs.jsonl"),
                                        "--out", str(tmp_path / "no" / "c.jsonl")], "--out"),
        "compare_device_banana": (["compare", "--reward", "mock", "--pairs", str(tmp_path / "pairs.jsonl"),
                                   "--device", "banana"], "banana"),
        "list_bad_flag": (["list", "--yaml"], "--yaml"),
        "train_pref_missing_data": (["train-pref", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")],
                                    "data"),
        "train_pref_bad_lr": (["train-pref", "--data", "x", "--out", "y", "--lr", "fast"], "--lr"),
        "train_pref_bad_option": (["train-pref", "--data", "x", "--out", "y", "--backbone-option", "k"], "KEY=VALUE"),
        "serve_bad_port": (["serve", "--reward", "mock", "--port", "99999"], "port"),
        "serve_bad_option": (["serve", "--reward", "mock", "--option", "oops"], "KEY=VALUE"),
        "serve_no_reward": (["serve"], "--reward"),
        "serve_bad_device": (["serve", "--reward", "mock", "--device", "banana"], "banana"),
        "no_command": ([], "no command"),
        "bad_prompt_text": (["score", "--reward", "mock", "--prompt", "\udcff", str(img)], "surrogate"),
    })
    return cases


def _cuda_count():
    import torch

    return torch.cuda.device_count()


_USAGE_CASE_NAMES = [
    "manifest_not_json", "manifest_not_object", "manifest_no_media", "manifest_media_not_string",
    "manifest_prompt_not_string", "out_missing_folder", "out_is_folder", "prompts_missing", "prompts_not_utf8",
    "option_no_equals", "option_unknown", "option_bad_value", "device_banana", "device_missing_cuda", "dtype_bad",
    "batch_size_text", "max_image_pixels_zero", "unknown_flag", "unknown_command", "pairs_missing", "pairs_missing_b", "pairs_not_json",
    "compare_out_missing_folder", "compare_device_banana", "list_bad_flag", "train_pref_missing_data",
    "train_pref_bad_lr", "train_pref_bad_option", "serve_bad_port", "serve_bad_option", "serve_no_reward",
    "serve_bad_device", "no_command", "bad_prompt_text",
]


@pytest.mark.parametrize("case", _USAGE_CASE_NAMES)
def test_usage_errors_are_one_line_and_exit_2(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    img = tmp_path / "img.png"
    Image.new("RGB", (8, 8), (255, 0, 0)).save(img)
    (tmp_path / "dir.jsonl").mkdir()
    cases = _usage_cases(tmp_path, img)
    assert set(cases) == set(_USAGE_CASE_NAMES)
    argv, fragment = cases[case]
    _one_line_usage_error(capsys, main, argv, fragment)
    assert not list(tmp_path.glob("**/*.part")) and not (tmp_path / "no").exists()


@pytest.mark.parametrize("extra", [0, 1], ids=["one_too_few_prompts", "one_too_many_prompts"])
def test_prompt_count_mismatch_is_a_usage_error_before_scoring(folder, tmp_path, capsys, extra):
    files = sorted(p for p in folder.rglob("*.png") if "broken" not in p.name)
    n_prompts = len(files) - 1 + 2 * extra
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(["red"] * n_prompts) + "\n")
    out = tmp_path / "s.jsonl"
    argv = ["score", "--reward", "mock", "--prompts", str(prompts), *map(str, files), "--out", str(out), "--no-progress"]
    _one_line_usage_error(capsys, main, argv, f"{n_prompts} lines")
    assert not out.exists()  # nothing half-written
    folder_argv = ["score", "--reward", "mock", "--prompts", str(prompts), str(folder), "--no-progress"]
    prompts.write_text("\n".join(["red"] * 5))  # the folder holds 6 media files
    _one_line_usage_error(capsys, main, folder_argv, "6 media items")
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("argv,fragment", [
    (["bench", "--benchmark", "genai-bench-image", "--data", "DATA", "--reward", "mock", "--judge", "x"], "exactly one"),
    (["bench", "--benchmark", "genai-bench-image", "--data", "DATA", "--reward", "mock", "--load-option", "k"], "KEY=VALUE"),
    (["bench", "--benchmark", "genai-bench-image", "--data", "DATA", "--reward", "mock", "--device", "banana"], "banana"),
    (["bench", "--benchmark", "genai-bench-image", "--data", "MISSING", "--reward", "mock"], "MISSING"),
    (["bench", "--benchmark", "genai-bench-image", "--data", "JUNK", "--reward", "mock"], "junk.json"),
    ([], "no command"),
    (["bench", "--benchmark", "genai-bench-image", "--data", "DATA", "--reward", "mock", "--orders", "XY"], "orders"),
    (["bench", "--benchmark", "no-such-bench", "--data", "DATA", "--reward", "mock"], "--benchmark"),
    (["bench", "--data", "DATA", "--reward", "mock"], "--benchmark"),
    (["bench", "--benchmark", "genai-bench-image", "--data", "DATA", "--reward", "mock", "--n-boot", "lots"], "--n-boot"),
], ids=["reward_and_judge", "load_option", "device", "data_missing", "data_malformed", "no_command", "orders", "benchmark_unknown",
        "benchmark_missing", "n_boot_text"])
@pytest.mark.parametrize("entry", ["vlm-rm", "vlm-rm-bench"])
def test_vlm_rm_usage_errors_are_one_line_and_exit_2(argv, fragment, entry, tmp_path, capsys):
    from vlm_rm.bench.cli import main as bench_main
    from vlm_rm.cli import main as vlm_main

    data = tmp_path / "data.json"
    data.write_text("[]")
    (tmp_path / "junk.json").write_text("{oops")
    argv = [a.replace("DATA", str(data)).replace("MISSING", str(tmp_path / "missing.json"))
            .replace("JUNK", str(tmp_path / "junk.json")) for a in argv]
    if argv:
        argv += ["--out", str(tmp_path / "bench_out"), "--quiet"]
    elif entry != "vlm-rm":
        fragment = "required: --benchmark"  # vlm_rm.bench.cli.main always runs 'bench'

    fragment = fragment.replace("MISSING", "missing.json")
    if entry == "vlm-rm":
        _one_line_usage_error(capsys, vlm_main, argv, fragment)
    else:
        _one_line_usage_error(capsys, bench_main, argv[1:], fragment)


# ----------------------------------------------------------------------------------------------
# what a run writes: failed items recorded, CSV header over all rows, JSON without NaN
# ----------------------------------------------------------------------------------------------
def test_decompression_bomb_is_a_failed_item_and_the_batch_goes_on(tmp_path):
    from tests.mmreward.test_media import png_header_only

    d = tmp_path / "d"
    d.mkdir()
    for i in range(5):
        Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(d / f"img{i}.png")
    png_header_only(d / "img2_bomb.png", 20000, 20000)
    png_header_only(d / "img3_huge.png", 9000, 9000)
    out = tmp_path / "s.jsonl"
    code = main(["score", "--reward", "jpeg-incompressibility", str(d), "--out", str(out), "--batch-size", "7",
                 "--no-progress"])
    assert code == 1
    rows = _rows(out)
    assert len(rows) == 7
    failed = {Path(r["media"]).name: r["error"] for r in rows if r["error"]}
    assert set(failed) == {"img2_bomb.png", "img3_huge.png"}
    assert "400000000 pixels" in failed["img2_bomb.png"] and "max_image_pixels" in failed["img3_huge.png"]
    assert all(isinstance(r["score"], float) for r in rows if not r["error"])
    capped = tmp_path / "capped.jsonl"
    assert main(["score", "--reward", "jpeg-incompressibility", str(d / "img0.png"), str(d / "img1.png"),
                 "--max-image-pixels", "63", "--out", str(capped), "--no-progress"]) == 1  # 8x8 = 64 > 63
    assert all("max_image_pixels=63" in r["error"] for r in _rows(capped))


def test_broken_and_looping_symlinks_are_failed_items(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(d / "a_ok.png")
    (d / "b_dangling.png").symlink_to(d / "gone.png")
    (d / "c_loop1.png").symlink_to(d / "c_loop2.png")
    (d / "c_loop2.png").symlink_to(d / "c_loop1.png")
    out = tmp_path / "s.jsonl"
    assert main(["score", "--reward", "jpeg-incompressibility", str(d), "--out", str(out), "--no-progress"]) == 1
    rows = _rows(out)
    assert [Path(r["media"]).name for r in rows] == ["a_ok.png", "b_dangling.png", "c_loop1.png", "c_loop2.png"]
    assert rows[0]["error"] is None
    assert all("symbolic link" in r["error"] and r["score"] is None for r in rows[1:])


class _DetailReward:
    """Stands in for a loaded reward: details per item, a NaN for item 'nan', may_return_nan like VQA judges."""

    name = "detail"
    modalities = ("image",)
    requires_prompt = False
    media_alpha = "drop"

    def score(self, prompts, media):
        import torch

        from mmreward.types import RewardOutput

        scores = torch.tensor([float("nan") if p == "nan" else float("inf") if p == "inf" else 0.5 for p in prompts])
        return RewardOutput(scores, {"sharpness": torch.full((len(prompts),), 0.25),
                                     "colour": torch.tensor([float("nan")] * len(prompts))})


def _detail_folder(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a_broken.png").write_bytes(b"\x89PNG\r\nbroken")  # first row fails: it has no detail columns
    for name in ("b.png", "c.png", "d.png"):
        Image.new("RGB", (8, 8), (255, 0, 0)).save(d / name)
    prompts = tmp_path / "p.txt"
    prompts.write_text("x\nnan\ninf\nok\n")
    return d, prompts


def test_csv_header_is_the_union_of_columns_even_when_the_first_row_failed(tmp_path, monkeypatch):
    import mmreward

    monkeypatch.setattr(mmreward, "load", lambda *a, **k: _DetailReward())
    d, prompts = _detail_folder(tmp_path)
    out = tmp_path / "s.csv"
    assert main(["score", "--prompts", str(prompts), str(d), "--out", str(out), "--batch-size", "2",
                 "--no-progress"]) == 1
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["index", "media", "prompt", "score", "error", "sharpness", "colour"]
    assert [r["score"] for r in rows] == ["", "", "", "0.5"]  # failed, NaN, inf -> empty cells
    assert rows[0]["error"] and rows[0]["sharpness"] == "" and rows[3]["sharpness"] == "0.25"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["p.txt", "s.csv"]  # no temp files left


def test_jsonl_has_null_instead_of_nan(tmp_path, monkeypatch, capsys):
    import mmreward

    monkeypatch.setattr(mmreward, "load", lambda *a, **k: _DetailReward())
    d, prompts = _detail_folder(tmp_path)

    def no_constants(name):
        raise AssertionError(f"bare {name} is not JSON")

    for out in (tmp_path / "s.jsonl", None):
        argv = ["score", "--prompts", str(prompts), str(d), "--no-progress", *(["--out", str(out)] if out else [])]
        assert main(argv) == 1
        text = out.read_text() if out else capsys.readouterr().out
        rows = [json.loads(line, parse_constant=no_constants) for line in text.splitlines()]
        assert [r["score"] for r in rows] == [None, None, None, 0.5]
        assert all(r.get("colour", None) is None for r in rows)


def test_prompt_files_with_a_utf8_bom_read_like_without(folder, tmp_path):
    """Windows editors prepend a BOM: it must neither break the manifest's first JSON row nor join the prompt."""
    files = sorted(p for p in folder.rglob("*.png") if "broken" not in p.name)[:2]
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps({"prompt": "red", "media": str(f)}) for f in files).encode())
    out = tmp_path / "m.jsonl.out.jsonl"
    assert main(["score", "--reward", "mock", "--prompts", str(manifest), "--out", str(out), "--no-progress"]) == 0
    assert [r["prompt"] for r in _rows(out)] == ["red", "red"]
    txt = tmp_path / "p.txt"
    txt.write_bytes(b"\xef\xbb\xbfred\nblue\n")
    assert main(["score", "--reward", "mock", "--prompts", str(txt), *map(str, files), "--out", str(out),
                 "--no-progress"]) == 0
    assert [r["prompt"] for r in _rows(out)] == ["red", "blue"]
