"""The runner's `dsqa` sub-commands (registered by app/cli.py): run-snippet, verify, runner serve,
eval answers. Kept here so app/cli.py only wires them in."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from app.cli_tools import print_json
from eval.runner import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S
from indexer.snippet_status import write_progress

KINDS = ("ds_config", "python", "launcher", "hostfile")


def cmd_run_snippet(args: argparse.Namespace, settings: Any) -> int:
    from eval.runner import LocalRunner, RunRequest

    try:
        code = sys.stdin.read() if str(args.file) == "-" else Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        print(f"dsqa: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    requires = tuple(r for r in (args.requires or "").split(",") if r)
    result = LocalRunner().run(RunRequest(kind=args.kind, code=code, requires=requires, timeout_s=args.timeout, memory_mb=args.memory_mb))
    out = result.to_json()
    if args.json:
        print_json(out)
    else:
        print(f"{result.status}: {result.reason}" if result.reason else result.status)
        print(f"device {result.device}, {result.duration_s:.1f}s" + (f"; adapted: {'; '.join(result.adaptations)}" if result.adaptations else ""))
        if result.stdout.strip():
            print("--- stdout\n" + result.stdout.rstrip())
        if result.status != "passed" and result.stderr.strip():
            print("--- stderr (tail)\n" + result.stderr.rstrip()[-3000:])
    return 0  # whatever the snippet did


def _progress_writer(path: Path | None) -> Any:
    if path is None:
        return None
    write_progress(path, "running", 0, 0)
    return lambda result, done, total: write_progress(path, "running", done, total, last=result.id)


def cmd_verify(args: argparse.Namespace, settings: Any) -> int:
    from eval.runner import make_runner
    from eval.verify import verify_index

    index_dir = args.index or settings.index_dir
    runner = make_runner(args.runner)
    report = verify_index(
        index_dir, runner, only=args.only, gpu_only=args.gpu_only, timeout_s=args.timeout, memory_mb=args.memory_mb,
        concurrency=args.concurrency, budget_s=args.budget, limit=args.limit, progress=not args.quiet,
        skip_done=args.skip_done, on_result=_progress_writer(args.progress_file),
    )
    if args.progress_file:
        write_progress(args.progress_file, "done", report["total"], report["total"], verdicts=report["verdicts"])
    if args.json:
        print_json(report)
    else:
        print(f"{report['total']} snippets: " + ", ".join(f"{k} {v}" for k, v in sorted(report["by_status"].items())))
        for kind, counts in sorted(report["by_kind"].items()):
            print(f"  {kind}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        print("verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(report["verdicts"].items())))
        for reason, n in report["top_failure_reasons"]:
            print(f"  fails {n}x {reason}")
        for reason, n in report["harness_and_environment"]:
            print(f"  not tested {n}x {reason}")
        print(f"ledger: {report['ledger']}")
    return 0


def cmd_build_ops(args: argparse.Namespace, settings: Any) -> int:
    """Compile the ops the runs of this machine load into the ops cache ahead of the first run (the
    trusted build step; a fresh cache otherwise makes the first snippets wait minutes for it)."""
    from eval.ops_cache import CPU_ENGINE_OPS
    from eval.runner import LocalRunner

    runner = LocalRunner()
    caps = runner.capabilities
    if caps.cuda:
        print("dsqa: build-ops compiles the CPU ops; on a GPU runner the ops build on first use", file=sys.stderr)
        return 2
    wanted = list(args.ops.split(",") if args.ops else CPU_ENGINE_OPS + (("async_io",) if caps.aio else ()))
    env = runner.build_env("cpu")
    have = [n for n in wanted if runner.ops.has(n)]
    built: list[str] = []
    for name in wanted:  # one at a time, so the ops the first runs need land first
        if name not in have:
            print(f"building {name} into {runner.extensions_dir} ...", file=sys.stderr, flush=True)
            built += runner.ops.build((name,), env)
    failed = [n for n in wanted if n not in have and n not in built]
    print(f"ops cache {runner.extensions_dir}: already there {have or 'none'}; built {built or 'none'}"
          + (f"; could not build {failed}" if failed else ""))
    return 1 if failed else 0


def cmd_runner_serve(args: argparse.Namespace, settings: Any) -> int:
    import uvicorn

    from app.http_protocol import server_config
    from eval.runner_service import allowed_hashes, create_runner_app

    token = os.environ.get("DSQA_RUNNER_TOKEN", "")
    if not token:
        print("dsqa: set DSQA_RUNNER_TOKEN (clients send it as a bearer token)", file=sys.stderr)
        return 2
    allowed = None if args.allow_any else allowed_hashes(args.index or settings.index_dir)
    app = create_runner_app(token=token, allowed=allowed, slots=args.slots, queue_limit=args.queue,
                            max_timeout_s=args.max_timeout, max_memory_mb=args.max_memory_mb)
    uvicorn.Server(server_config(app, host=args.host, port=args.port, header_timeout_s=settings.header_timeout_s)).run()
    return 0


def cmd_eval_answers(args: argparse.Namespace, settings: Any) -> int:
    from eval.answers_eval import run_answers_eval
    from eval.runner import make_runner

    summary = run_answers_eval(
        args.questions, args.url, make_runner(args.runner), args.out, concurrency=args.concurrency, k=args.k,
        snippet_timeout_s=args.timeout, memory_mb=args.memory_mb,
    )
    if args.json:
        print_json(summary)
    else:
        allb = summary["retrieval"]["all"]
        print(f"{summary['questions']} questions: hit@5 {allb.get('hit@5')} MRR@10 {allb.get('mrr@10')} nDCG@10 {allb.get('ndcg@10')} "
              f"mentions {allb.get('mention_share')}; snippets {summary['snippets']['by_status']} pass rate {summary['snippets']['pass_rate']}; "
              f"latency {summary['latency_ms']} -> {args.out}/report.html")
    return 0


def _limits(s: argparse.ArgumentParser) -> None:
    s.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="wall-clock seconds per snippet")
    s.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB, help="address-space cap per snippet (RLIMIT_AS)")


def add_runner_commands(sub: Any, ev: Any) -> None:
    """Register the commands on the `dsqa` sub-parsers and on `dsqa eval`'s."""
    s = sub.add_parser("run-snippet", help="run one snippet for real in the sandbox (exits 0 whatever it did)")
    s.add_argument("file", help="the snippet's code, or - for stdin")
    s.add_argument("--kind", required=True, choices=KINDS)
    s.add_argument("--requires", help="comma-separated tags, as in a note's ```python requires=gpu")
    _limits(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_run_snippet)

    s = sub.add_parser("verify", help="run every runnable snippet of an index; write INDEX/verification.jsonl")
    s.add_argument("--index", type=Path)
    s.add_argument("--runner", default="local", help="local | ray | http://HOST:PORT (a `dsqa runner serve`)")
    s.add_argument("--only", choices=("notes", "docs", "all"), default="all")
    s.add_argument("--gpu-only", action="store_true", help="only snippets that need a GPU (tags or detected)")
    s.add_argument("--concurrency", type=int, default=1)
    s.add_argument("--budget", type=float, help="stop starting snippets after this many seconds (the rest: skipped)")
    s.add_argument("--limit", type=int, help="at most this many snippets")
    s.add_argument("--skip-done", action="store_true", help="leave out snippets already run with the installed deepspeed")
    s.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    s.add_argument("--progress-file", type=Path, help="keep {state, done, total} in this JSON file (the service reads it)")
    _limits(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_verify)

    runner = sub.add_parser("runner", help="the snippet runner service").add_subparsers(dest="runner_command", required=True)
    s = runner.add_parser("serve", help="serve POST /run (bearer DSQA_RUNNER_TOKEN); one job per GPU")
    s.add_argument("--index", type=Path, help="only snippets of this index run (default DSQA_INDEX_DIR)")
    s.add_argument("--allow-any", action="store_true", help="run any code, not only the index's snippets")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8100)
    s.add_argument("--slots", type=int, help="jobs at once (default: the GPU count, 1 on CPU)")
    s.add_argument("--queue", type=int, default=8, help="jobs waiting beyond the slots before 429")
    s.add_argument("--max-timeout", type=float, default=600.0, help="cap on a request's timeout_s")
    s.add_argument("--max-memory-mb", type=int, default=16_384, help="cap on a request's memory_mb")
    s.set_defaults(fn=cmd_runner_serve)
    s = runner.add_parser("build-ops", help="compile the CPU ops (shm, cpu_adam, fused_adam, async_io with libaio) into the ops cache now")
    s.add_argument("--ops", help="comma-separated op names (default: what a CPU run loads, and async_io where libaio is installed)")
    s.set_defaults(fn=cmd_build_ops)

    s = ev.add_parser("answers", help="ask a running service, score retrieval, run the returned snippets, write a report")
    s.add_argument("--questions", type=Path, required=True)
    s.add_argument("--url", required=True, help="the service's /ask URL, e.g. http://127.0.0.1:8000/ask")
    s.add_argument("--runner", default="local", help="local | ray | http://HOST:PORT")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--concurrency", type=int, default=2)
    s.add_argument("--k", type=int, default=10)
    _limits(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_eval_answers)
