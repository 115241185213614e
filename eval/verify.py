"""`dsqa verify`: run every runnable snippet of an index through a runner and keep a ledger.

The ledger is `INDEX/verification.jsonl`, one row per snippet id (the latest run wins), rewritten
atomically (temp file + rename): status, reason, device, torch and deepspeed versions, time.
`indexer.store.load_index` reads it, and `app.ask.stamp` shows it next to each snippet.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tqdm import tqdm

from eval.python_program import import_lines
from eval.runner import RunRequest, RunResult, SnippetRunner, runnable
from indexer.config_catalogue import deepspeed_version
from indexer.documents import Snippet
from indexer.snippet_status import BLAME_SNIPPET, LEDGER, write_ledger_rows
from indexer.store import load_index

log = logging.getLogger(__name__)
GPU_REQUIREMENTS = ("gpu", "cuda", "fp16", "nccl", "gds", "multi-gpu")


def select(snippets: list[Snippet], only: str = "all", *, gpu_only: bool = False) -> list[Snippet]:
    from eval.requirements import detect_requirements

    chosen = runnable(snippets)
    if only == "notes":
        chosen = [s for s in chosen if s.path.startswith("corpus/notes/")]
    elif only == "docs":
        chosen = [s for s in chosen if not s.path.startswith("corpus/notes/")]
    if gpu_only:
        chosen = [s for s in chosen if any(r.name in GPU_REQUIREMENTS for r in detect_requirements(s.kind, s.code, s.requires))]
    return chosen


def page_imports(snippets: list[Snippet]) -> dict[str, str]:
    """Snippet id -> the import statements of the Python snippets before it on its page (a tutorial
    imports a name once and its later fragments use it)."""
    seen: dict[str, list[str]] = {}
    out: dict[str, str] = {}
    for s in snippets:  # in page order, as the index keeps them
        lines = seen.setdefault(s.path, [])
        out[s.id] = "\n".join(dict.fromkeys(lines))
        if s.kind == "python":
            lines += import_lines(s.code)
    return out


def ledger_row(result: RunResult) -> dict[str, Any]:
    return {
        "id": result.id, "kind": result.kind, "status": result.status, "reason": result.reason[:500],
        "device": result.device, "torch": result.torch, "deepspeed": result.deepspeed, "runner": result.runner,
        "duration_s": result.duration_s, "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "adaptations": result.adaptations, "blame": result.blame, "blame_why": result.blame_why,
    }


def write_ledger(index_dir: Path, results: list[RunResult]) -> Path:
    """Merge these results into the ledger (latest wins), swapped in atomically."""
    return write_ledger_rows(Path(index_dir), [ledger_row(r) for r in results])


def _verdict_of(r: RunResult) -> str:
    if r.status == "passed":
        return "ran"
    if r.status == "skipped":
        return "skipped"
    return "fails" if r.blame == BLAME_SNIPPET else f"not tested ({r.blame})"


def summarise_runs(results: list[RunResult]) -> dict[str, Any]:
    by_kind: dict[str, dict[str, int]] = {}
    for r in results:
        by_kind.setdefault(r.kind, {}).setdefault(r.status, 0)
        by_kind[r.kind][r.status] += 1
    failures = Counter(r.reason[:160] for r in results if r.status in ("failed", "timeout", "killed") and r.blame == BLAME_SNIPPET)
    not_tested = Counter(f"{r.blame}: {r.blame_why}"[:160] for r in results if r.status in ("failed", "timeout", "killed") and r.blame != BLAME_SNIPPET)
    skips = Counter(r.reason.split(";")[0][:120] for r in results if r.status == "skipped")
    return {
        "total": len(results),
        "by_status": dict(Counter(r.status for r in results)),
        "by_kind": by_kind,
        "verdicts": dict(Counter(_verdict_of(r) for r in results)),
        "top_failure_reasons": failures.most_common(10),
        "harness_and_environment": not_tested.most_common(10),
        "top_skip_reasons": skips.most_common(10),
    }


def verify_index(
    index_dir: Path,
    runner: SnippetRunner,
    *,
    only: str = "all",
    gpu_only: bool = False,
    timeout_s: float = 180.0,
    memory_mb: int = 6144,
    concurrency: int = 1,
    budget_s: float | None = None,
    limit: int | None = None,
    progress: bool = False,
    skip_done: bool = False,
    on_result: Callable[[RunResult, int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the chosen snippets, writing each batch's rows to the ledger as they land (so a serving
    index shows them at once). `skip_done`: leave out snippets the ledger already has a run of
    with the installed deepspeed. `on_result(result, done, total)` is told of every result."""
    index = load_index(Path(index_dir), verify=False)
    chosen = select(list(index.snippets.values()), only, gpu_only=gpu_only)
    if skip_done:
        version = deepspeed_version()
        chosen = [s for s in chosen if index.verification.get(s.id, {}).get("deepspeed") != version]
    chosen = chosen[: limit or None]
    contexts = page_imports(list(index.snippets.values()))
    requests = [RunRequest.from_snippet(s, timeout_s=timeout_s, memory_mb=memory_mb, context=contexts.get(s.id, "")) for s in chosen]
    t0 = time.monotonic()
    results: list[RunResult] = []
    batch = max(1, concurrency)
    bar = tqdm(total=len(requests), desc="verifying snippets", unit="snippet", file=sys.stderr, disable=not progress)
    for i in range(0, len(requests), batch):  # batches, so a time budget can stop between them
        if budget_s is not None and time.monotonic() - t0 > budget_s:
            results += [RunResult(status="skipped", reason=f"time budget of {budget_s:g} s spent before it ran", id=r.id, kind=r.kind, runner=runner.name)
                        for r in requests[i:]]
            break
        done = runner.run_many(requests[i:i + batch], concurrency=batch)
        for r in done:
            log.info("%d/%d %s %s %s %.1fs %s", len(results) + 1, len(requests), r.id, r.kind, r.status, r.duration_s, r.reason[:120])
            results.append(r)
            bar.update(1)
            bar.set_postfix_str(f"{r.kind} {r.status}")
            if on_result is not None:
                on_result(r, len(results), len(requests))
        write_ledger(Path(index_dir), [r for r in done if r.status != "skipped" or "time budget" not in r.reason])
    bar.close()
    out = summarise_runs(results)
    out["ledger"] = str(Path(index_dir) / LEDGER)
    out["results"] = [
        {**{k: v for k, v in r.to_json().items() if k not in ("stdout", "stderr")}, "path": index.snippets[r.id].path,
         "source_url": index.snippets[r.id].source_url, "stderr_tail": r.stderr[-600:] if r.status != "passed" else ""}
        for r in results
    ]
    return out
