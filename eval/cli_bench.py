"""`dsqa bench [--quick] [--json]` (registered by app/cli.py): the performance rows of
`eval/perf_bench.py` on this machine, in one run, with ratios to the peers measured in it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _workers(value: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(x) for x in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers takes comma-separated counts like 1,2, not {value!r}") from None
    if not counts or any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError("--workers counts must be 1 or more")
    return counts


def cmd_bench(args: argparse.Namespace, settings: Any) -> int:
    from app.cli import resolve_docs_dir
    from eval.perf_bench import BenchOptions, format_report, run_bench  # not imported by every dsqa command
    from eval.question_set import load_split

    index = args.index or settings.index_dir
    if not (index / "manifest.json").is_file():
        print(f"dsqa: no index at {index}: build it with `dsqa index` first", file=sys.stderr)
        return 2
    docs, _ = resolve_docs_dir(settings, args.docs, try_fetch=False)
    if docs is None:
        print("dsqa: no docs for the build rows (give --docs or DSQA_DOCS_DIR); they are left out", file=sys.stderr)
    questions = [q.question for q in load_split("tune")][: 20 if args.quick else 60]
    seconds = args.seconds if args.seconds is not None else (2.0 if args.quick else 15.0)
    opts = BenchOptions(index=index, docs=docs, cache=settings.cache_dir, quick=args.quick, seconds=seconds,
                        port=args.port, workers=args.workers)
    report = run_bench(opts, questions, progress=lambda step: print(f"bench: {step} ...", file=sys.stderr, flush=True))
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


def add_bench_command(sub: Any) -> None:
    s = sub.add_parser("bench", help="measure builds, /ask latency and throughput, cold starts and RSS against peers, in one run")
    s.add_argument("--index", type=Path, help="the index to serve (default: DSQA_INDEX_DIR)")
    s.add_argument("--docs", type=Path, help="docs for the build rows (default: DSQA_DOCS_DIR or the fetched copy)")
    s.add_argument("--quick", action="store_true", help="no build from nothing or LlamaIndex, one worker, 2 s per level")
    s.add_argument("--seconds", type=float, help="seconds per concurrency level (default 15, quick 2)")
    s.add_argument("--workers", type=_workers, default=(1, 2), help="worker counts to serve with (default 1,2)")
    s.add_argument("--port", type=int, default=8765)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_bench)
