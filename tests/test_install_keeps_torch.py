"""What `pip install mmreward` does to an existing torch (issue 28 item 4), measured by pip itself.

A venv holding only another torch (2.13.0, CPU build) and no torchvision: pip's dry run of our install
without a constraint upgrades torch (torchvision's newest release needs the newest torch); with the README's
`-c keep-torch.txt` it keeps torch and picks the torchvision built for it. Slow (installs torch into a venv,
resolves from the package index), so it is out of the default suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OTHER_TORCH = "2.13.0"

pytestmark = pytest.mark.slow


def _pip(py: Path, *args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([str(py), "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=timeout)


def _planned(py: Path, tmp: Path, *extra: str) -> dict[str, str]:
    report = tmp / f"report{len(extra)}.json"
    proc = _pip(py, "install", "--dry-run", "--quiet", "--report", str(report), str(REPO), *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}


def test_install_keeps_the_users_torch_with_the_documented_constraint(tmp_path):
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = env / "bin" / "python"
    proc = _pip(py, "install", "--quiet", f"torch=={OTHER_TORCH}")
    if proc.returncode != 0:
        pytest.skip(f"torch {OTHER_TORCH} cannot be installed here: {proc.stderr[-300:]}")
    have = subprocess.run([str(py), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    assert have.stdout.startswith(OTHER_TORCH)
    # without a constraint: pip plans a new torch (what the README warns about)
    plain = _planned(py, tmp_path)
    assert "torch" in plain and not plain["torch"].startswith(OTHER_TORCH)
    # with the README's keep-torch.txt: torch is not touched, torchvision matches it
    keep = tmp_path / "keep-torch.txt"
    freeze = _pip(py, "freeze").stdout
    keep.write_text("".join(line + "\n" for line in freeze.splitlines() if line.startswith("torch==")))
    kept = _planned(py, tmp_path, "-c", str(keep))
    assert "torch" not in kept, kept.get("torch")
    assert kept["torchvision"].startswith("0.28"), kept["torchvision"]  # the release built for torch 2.13
    assert sys.version_info >= (3, 10)
