#!/usr/bin/env bash
# The main job on its defaults: set up, build the index on first run, serve on localhost:8000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/dsqa up "$@"
