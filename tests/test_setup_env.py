"""scripts/setup_env.sh's torch choice (issue 28 item 6): MMREWARD_TORCH=cpu takes PyTorch's CPU wheel index."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _dry(**env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "MMREWARD_SETUP_DRY_RUN": "1", **env}
    full.pop("MMREWARD_TORCH", None) if "MMREWARD_TORCH" not in env else None
    return subprocess.run(["bash", str(REPO / "scripts" / "setup_env.sh"), "dev"], capture_output=True, text=True,
                          env=full, timeout=120)


def test_cpu_torch_uses_the_cpu_wheel_index_with_the_same_pins():
    proc = _dry(MMREWARD_TORCH="cpu")
    assert proc.returncode == 0, proc.stderr
    cmd = proc.stdout.strip().splitlines()[-1]
    assert "--index-url https://download.pytorch.org/whl/cpu" in cmd
    assert "-c constraints.txt" in cmd and cmd.endswith("torch torchvision")  # still torch==2.14.1 (+cpu)


def test_default_torch_comes_from_the_normal_index():
    proc = _dry()
    assert proc.returncode == 0, proc.stderr
    assert "--index-url" not in proc.stdout and proc.stdout.strip().endswith("torch torchvision")


def test_unknown_torch_choice_is_a_one_line_usage_error():
    proc = _dry(MMREWARD_TORCH="rocm")
    assert proc.returncode == 2 and "MMREWARD_TORCH must be 'cpu' or unset" in proc.stderr
    assert proc.stderr.count("\n") == 1
