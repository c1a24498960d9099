"""Runs that were killed leave nothing behind for the next run, and inputs are listed once (issue 28 item 18)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from diffusion_rl.export import atomic_folder
from mmreward import cli
from mmreward.output_paths import remove_dead_temporaries

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "assets" / "samples"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_export_removes_the_temporary_folder_of_a_killed_export(tmp_path):
    dead, live = _dead_pid(), os.getppid()
    stale = tmp_path / f".final.tmp-{dead}"
    (stale / "transformer").mkdir(parents=True)
    busy = tmp_path / f".final.tmp-{live}"  # another live process exporting: not ours to remove
    busy.mkdir()
    other = tmp_path / f".finalx.tmp-{dead}"  # another name's temporary
    other.mkdir()
    with atomic_folder(tmp_path / "final") as tmp:
        (tmp / "weights.txt").write_text("w")
    assert (tmp_path / "final" / "weights.txt").read_text() == "w"
    assert not stale.exists() and busy.exists() and other.exists()


def test_scoring_run_removes_rows_files_of_a_killed_run(tmp_path, capsys):
    out = tmp_path / "scores.csv"
    dead = _dead_pid()
    stale = tmp_path / f".scores.csv.{dead}.abc123.rows.jsonl"
    stale.write_text('{"a": 1}\n')
    rc = cli.main(["score", "--reward", "jpeg-compressibility", "--no-progress", "--out", str(out),
                   str(SAMPLES / "red_circle.png")])
    assert rc == 0, capsys.readouterr().err
    assert out.is_file() and not stale.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["scores.csv"]  # no hidden file of this run either
    assert remove_dead_temporaries(tmp_path / "missing", "x") == []


def test_prompts_file_and_folder_are_paired_from_one_listing(tmp_path):
    """A folder that changes between the check and the scoring must not shift prompts onto other images."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for name in ("b.png", "c.png"):
        shutil.copy(SAMPLES / "red_circle.png", folder / name)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("prompt for b\nprompt for c\n")
    args = cli.build_parser().parse_args(["score", "--reward", "jpeg-compressibility", "--prompts", str(prompts),
                                          str(folder)])
    cli._check_jobs(args)
    shutil.copy(SAMPLES / "red_circle.png", folder / "a.png")  # sorts first: a second listing would shift all
    jobs = list(cli._iter_jobs(args))
    assert [(Path(p).name, q) for _, p, q in jobs] == [("b.png", "prompt for b"), ("c.png", "prompt for c")]
