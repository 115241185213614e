#!/usr/bin/env bash
# Create .venv at the repo root with dsqa and its dependencies (CPU torch pinned first).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# torch first: the CPU wheel; a plain `torch` requirement would pull a multi-GB CUDA build.
# constraints.txt: the versions the test suite passed with, so a fresh install gets the same.
.venv/bin/python -m pip install -q -c constraints.txt "torch==2.13.0"
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev,runner]"
