#!/usr/bin/env bash
# Run every parity test (pytest -m parity) and write the parity table, docs/parity.md, from what they measured.
# Each test also asserts its own tolerance, so a failing comparison fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh dev
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
MMREWARD_PARITY_LOG="$log" .venv/bin/python -m pytest -q -m parity -p no:cacheprovider "$@"
.venv/bin/python scripts/parity_table.py "$log" --out docs/parity.md
