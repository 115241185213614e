#!/usr/bin/env bash
# Set up, then run lint, types and the whole test suite (the real model and index included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DSQA_TEST_DOCS=${DSQA_TEST_DOCS:-$(cd .. && pwd)/shared/deepspeed-docs}
.venv/bin/ruff check app indexer eval tests bench
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
