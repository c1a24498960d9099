#!/usr/bin/env bash
# Run every parity test (pytest -m parity) and write the parity table, docs/parity.md, from what they measured.
# Each test also asserts its own tolerance, so a failing comparison fails this script.
# MMREWARD_PARITY_PACKAGES=1 also runs the original packages in pinned venvs (scripts/parity_packages.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh dev
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
MMREWARD_PARITY_LOG="$log" .venv/bin/python -m pytest -q -m parity -p no:cacheprovider "$@"
# opt-in (minutes, and pip installs the first time): the original packages themselves, scripts/parity_packages.py
pkg_status=0
if [[ "${MMREWARD_PARITY_PACKAGES:-0}" == 1 ]]; then
  .venv/bin/python scripts/parity_packages.py --log "$log" || pkg_status=$?
fi
.venv/bin/python scripts/parity_table.py "$log" --out docs/parity.md
exit "$pkg_status"
