#!/usr/bin/env bash
# Install the project with its test dependencies into .venv and run the whole offline test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh dev
# The Tesseract OCR engine is a Debian package; install it when we can (root on Debian), else its tests skip.
if ! command -v tesseract >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq tesseract-ocr) >/dev/null 2>&1 || echo "note: tesseract-ocr not installed"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/python -m ruff check .
.venv/bin/python -m mypy  # the public modules listed in pyproject.toml [tool.mypy]
# the docs site, warnings as errors: a broken link or a stale generated reference page fails here
DISABLE_MKDOCS_2_WARNING=true NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict --quiet \
  --site-dir "$(mktemp -d)"
# two workers (one per core), a test file per worker so session tiny pipelines are built once per file group;
# the slowest tests are listed so they stay visible
.venv/bin/python -m pytest -q -n "${MMREWARD_TEST_WORKERS:-2}" --dist loadfile --durations=15 "$@"
