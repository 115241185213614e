#!/usr/bin/env bash
# Set up, then run lint, types and the whole test suite (the real model and index included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# system tools some tests drive: headless Chromium (the web page; Playwright uses it, never a browser
# download of its own) and docker-compose (the compose file). We run as root; installed once.
command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
command -v docker-compose >/dev/null || (apt-get update && apt-get install -y docker-compose)
# libaio's headers: DeepNVMe's async_io op builds on a CPU too, so NVMe-offload configs and aio snippets run
[ -e /usr/include/libaio.h ] || (apt-get update && apt-get install -y libaio-dev)
export DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DSQA_TEST_DOCS=${DSQA_TEST_DOCS:-$(cd .. && pwd)/shared/deepspeed-docs}
# the ops the runs load compile once into var/cache/torch_extensions (a filled cache makes both steps instant).
# The ops every CPU engine loads (shm, cpu_adam, fused_adam: ~5 CPU minutes) build now, beside lint and types,
# and are there before any test needs them; async_io (DeepNVMe, ~4.5 CPU minutes with the precompiled header of
# eval/op_compiler.py) builds beside the tests at the lowest priority: the two test workers keep the cores and a
# test that needs async_io before it is there waits on torch's build lock, handing it its core.
# (setsid makes a new scheduler autogroup: its niceness is set too, or nice would count only inside it;
# the sandbox gives its runs the niceness of their caller the same way)
mkdir -p var/log
.venv/bin/dsqa runner build-ops --ops deepspeed_shm_comm,cpu_adam,fused_adam > var/log/build-ops.log 2>&1 &
engine_ops=$!
trap 'kill $engine_ops 2>/dev/null || true' EXIT
.venv/bin/ruff check app indexer eval tests bench
.venv/bin/mypy
wait $engine_ops || { cat var/log/build-ops.log; exit 1; }
if [ -e /usr/include/libaio.h ]; then
  setsid sh -c 'echo 19 > /proc/self/autogroup 2>/dev/null || true; exec nice -n 19 .venv/bin/dsqa runner build-ops --ops async_io' >> var/log/build-ops.log 2>&1 &
  aio_pid=$!
  trap 'kill -- -$aio_pid 2>/dev/null || true' EXIT
fi
# two workers (pytest-xdist, a module at a time) on two cores; the first to need the real docs index builds it
# once for both (tests/conftest.py)
.venv/bin/python -m pytest -n "${DSQA_TEST_WORKERS:-2}" --dist loadfile "$@"
tail -n 1 var/log/build-ops.log
