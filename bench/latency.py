"""Latency and throughput benchmark: the rows of `dsqa bench` (eval/perf_bench.py), kept here beside
the other benchmarks. Arguments are `dsqa bench`'s:

    .venv/bin/python bench/latency.py [--quick] [--index var/index] [--docs DIR] [--seconds 15] [--json]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from app.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
