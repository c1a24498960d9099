#!/usr/bin/env bash
# Run the original packages (hpsv3, image-reward, ...) in their own pinned venvs on our tiny checkpoints and
# compare with ours (scripts/parity_packages.py; venvs cached under ~/.cache/mmreward/parity-venvs).
# `MMREWARD_PARITY_PACKAGES=1 bash scripts/parity.sh` runs this too and puts its rows in docs/parity.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python scripts/parity_packages.py "$@"
