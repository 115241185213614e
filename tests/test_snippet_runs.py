"""A static `checked` never lies: every docs snippet the static check calls `checked` that runs on
CPU is run for real, and none may fail because of the snippet (slow: deepspeed runs in the sandbox).
The outcome table is printed; the full static-vs-run table over every docs snippet is in the
closing notes (`dsqa verify --only docs` + `dsqa snippets report`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from eval.programs import RUNNABLE_KINDS, prepare
from eval.requirements import cpu_adaptable, detect_capabilities, detect_requirements, unmet
from eval.runner import LocalRunner, RunRequest
from eval.verify import page_imports
from indexer.snippet_status import CHECKED, run_outcome
from indexer.store import load_index

pytestmark = pytest.mark.slow


def test_no_checked_docs_snippet_fails_when_run(real_index: Path) -> None:
    index = load_index(real_index)
    snippets = list(index.snippets.values())
    contexts = page_imports(snippets)
    caps = detect_capabilities()
    chosen = []
    for s in snippets:
        if s.status != CHECKED or s.kind not in RUNNABLE_KINDS or s.path.startswith("corpus/notes/"):
            continue
        if [r for r in unmet(detect_requirements(s.kind, s.code, s.requires), caps) if not cpu_adaptable(s.kind, r)]:
            continue
        if prepare(s.kind, s.code, caps, context=contexts.get(s.id, "")).skip:
            continue
        chosen.append(s)
    assert len(chosen) >= 40
    runner = LocalRunner()  # the suite's ops cache, built once by the trusted step (a fresh one compiled them again: ~2 min)
    outcomes: Counter[str] = Counter()
    failing = []
    # two at a time (each run is one process, or a few for a tensor-parallel config or a launcher line)
    results = runner.run_many([RunRequest.from_snippet(s, timeout_s=150, context=contexts.get(s.id, "")) for s in chosen], concurrency=2)
    for s, result in zip(chosen, results, strict=True):
        row = {**result.to_json(), "time": ""}
        outcome = run_outcome(row)
        outcomes[outcome] += 1
        if outcome == "fails":
            failing.append((s.id, s.kind, s.source_url, result.reason[:200]))
    print(f"\nchecked docs snippets run on {caps.label}: {len(chosen)}; outcomes: {dict(outcomes)}")
    assert failing == [], failing
    assert outcomes["ran"] >= len(chosen) // 2  # most of them really pass, not just "not tested"
