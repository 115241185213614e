"""The error doctor scored on real error logs (`tests/data/error_logs.jsonl`: users' tracebacks from
public GitHub threads, trimmed and anonymised, each with the cause and fix its thread settled on).

Split like the questions, by a hash of the id: every doctor choice is made on `tune`; `test` only
reports. A second file, `eval/training/error_logs/tune_only.jsonl` (the same fields, from threads the
first file does not use), is tuning data only: reported as `tune_only`, never split. Per log:
- cause right: the first cause names at least half of the log's `cause_terms` (title, explanation,
  fix and the titles of its passages);
- source right (logs whose message the installed deepspeed raises): one of the first three causes
  points at a line of `gold_file` inside `gold_function`.
`run_known_ablation` asks, on the tuning logs only, how the doctor does on a failure a note knows told in other
words, and on one no note knows (the choice of the fallbacks' order).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.doctor import Diagnosis
from eval.question_set import split_of
from indexer.error_catalogue import RaisedError

ERROR_LOGS = Path(__file__).resolve().parents[1] / "tests" / "data" / "error_logs.jsonl"
TUNE_ONLY_LOGS = Path(__file__).resolve().parent / "training" / "error_logs" / "tune_only.jsonl"
SPLITS = ("tune", "tune_only", "test")


@dataclass(frozen=True)
class ErrorLog:
    id: str
    log: str
    raised_in_deepspeed: bool
    gold_file: str
    gold_function: str
    cause_terms: tuple[str, ...]
    category: str
    split: str  # tune or test by a hash of the id; tune_only for the second file's


def load_error_logs(path: Path = ERROR_LOGS, *, tune_only: bool = False) -> list[ErrorLog]:
    """The labelled logs of a file; `tune_only`: all of them are tuning data (else split by id)."""
    logs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            logs.append(ErrorLog(d["id"], d["log"], bool(d["raised_in_deepspeed"]), d["gold_file"], d["gold_function"],
                                 tuple(t.lower() for t in d["cause_terms"]), d["category"],
                                 "tune_only" if tune_only else split_of(d["id"])))
    return logs


def all_error_logs() -> list[ErrorLog]:
    """The split set and the tune-only logs."""
    return load_error_logs() + (load_error_logs(TUNE_ONLY_LOGS, tune_only=True) if TUNE_ONLY_LOGS.is_file() else [])


def cause_right(log: ErrorLog, result: Diagnosis) -> bool:
    if not result.causes:
        return False
    top = result.causes[0]
    text = " ".join([top.title, top.explanation, top.fix, *top.doc_titles]).lower()
    found = sum(1 for t in log.cause_terms if t in text)
    return found >= math.ceil(len(log.cause_terms) / 2)


def source_right(log: ErrorLog, result: Diagnosis, by_url: dict[str, RaisedError]) -> bool:
    for cause in result.causes[:3]:
        entry = by_url.get(cause.source_url)
        if entry is not None and entry.path == f"deepspeed/{log.gold_file}" and entry.function == log.gold_function:
            return True
    return False


def score_doctor(logs: list[ErrorLog], diagnose: Callable[[str], Diagnosis], by_url: dict[str, RaisedError]) -> dict[str, Any]:
    """Per split: cause right at 1, source right in 3 (over the logs deepspeed raises), how matched."""
    rows: list[dict[str, Any]] = []
    for log in logs:
        started = time.perf_counter()
        result = diagnose(log.log)
        rows.append({"id": log.id, "split": log.split, "category": log.category, "raised": log.raised_in_deepspeed,
                     "cause": cause_right(log, result), "source": source_right(log, result, by_url) if log.raised_in_deepspeed else None,
                     "matched": result.matched, "ms": (time.perf_counter() - started) * 1000})
    report: dict[str, Any] = {}
    for split in (*SPLITS, "all"):
        part = [r for r in rows if split in ("all", r["split"])]
        raised = [r for r in part if r["raised"]]
        report[split] = {
            "logs": len(part),
            "cause_at_1": round(sum(r["cause"] for r in part) / max(len(part), 1), 3),
            "raised": len(raised),
            "source_in_3": round(sum(bool(r["source"]) for r in raised) / max(len(raised), 1), 3),
            "matched": {m: sum(1 for r in part if r["matched"] == m) for m in ("exact", "nearest", "retrieval", "none")},
            "median_ms": round(statistics.median(r["ms"] for r in part), 1) if part else 0.0,
        }
    report["misses"] = [{k: r[k] for k in ("id", "split", "category", "cause", "source", "matched")}
                        for r in rows if not r["cause"] or r["source"] is False]
    return report


def run_doctor_eval(index_dir: Path, retriever: Any, notes_dir: Path | None, logs: list[ErrorLog] | None = None) -> dict[str, Any]:
    """The doctor as every front end calls it (`diagnose_with`: the index's error catalogue, retrieval over
    its passages, the known causes) and the same without retrieval, on the same logs and split."""
    from app.doctor import diagnose_with
    from indexer.config_catalogue import deepspeed_version
    from indexer.error_catalogue import ERRORS_FILE, read_error_catalogue

    logs = all_error_logs() if logs is None else logs
    _, entries = read_error_catalogue(index_dir / ERRORS_FILE)
    by_url = {e.url(deepspeed_version()): e for e in entries}

    def with_retriever(r: Any) -> Callable[[str], Diagnosis]:
        return lambda log: diagnose_with(index_dir, r, log, notes_dir)

    return {how: score_doctor(logs, with_retriever(r), by_url) for how, r in (("shipped", retriever), ("without_retrieval", None))}


def run_known_ablation(index_dir: Path, retriever: Any, notes_dir: Path, logs: list[ErrorLog] | None = None) -> dict[str, Any]:
    """How the doctor does on failures the notes know in other words, and on failures they do not know
    (`dsqa eval doctor --known-ablation`; tuning data only: the tune split and the tune-only logs). Of the logs
    whose first cause is a known one found by its text, each is diagnosed again twice: `new_wording`, with that
    cause's texts taken away and its passages' vectors made without their `Matches:` line (the cause is still
    there to be found by meaning, as for a new wording of a failure a note describes); `unknown`, with the cause
    taken away (as for a failure no note describes: a right first cause can only come from another note, a
    raising line or retrieval). The order of the doctor's fallbacks was chosen on these figures."""
    import dataclasses
    from types import SimpleNamespace

    from app.doctor import diagnose, engine_search
    from app.error_log import clean_log
    from app.known_cause_search import closest_known_cause
    from indexer.known_causes import read_known_causes

    logs = [log for log in (all_error_logs() if logs is None else logs) if log.split != "test"]
    known = read_known_causes(notes_dir)
    search, embedder, chunks = engine_search(retriever), retriever.embedder, retriever.index.chunks

    def without_matches_line(url: str) -> Any:
        """The retriever's vectors as `closest_known_cause` reads them, a known cause's passages re-embedded
        without their `Matches:` line."""
        matrix = retriever.matrix.copy()
        for i, chunk in enumerate(chunks):
            if chunk.url == url:
                text = "\n".join(line for line in chunk.search_text.splitlines() if not line.strip().startswith("Matches:"))
                matrix[i] = embedder.embed([text])[0]
        return SimpleNamespace(index=retriever.index, matrix=matrix, embedder=embedder)

    found_by_text = new_wording = unknown = 0
    for log in logs:
        first = diagnose(log.log, index_dir, search, known, closest_known_cause(retriever, known))
        cause = next((k for k in known if first.causes[0].doc_urls == [k.url]), None)
        if cause is None or not cause_right(log, first) or not cause.found_in(clean_log(log.log).lower()):
            continue
        found_by_text += 1
        reworded = tuple(dataclasses.replace(k, matches=()) if k is cause else k for k in known)
        new_wording += cause_right(log, diagnose(log.log, index_dir, search, reworded,
                                                  closest_known_cause(without_matches_line(cause.url), reworded)))
        others = tuple(k for k in known if k is not cause)
        unknown += cause_right(log, diagnose(log.log, index_dir, search, others, closest_known_cause(retriever, others)))
    return {"logs": len(logs), "known_first": found_by_text, "new_wording": new_wording, "unknown": unknown,
            "new_wording_share": round(new_wording / max(found_by_text, 1), 3), "unknown_share": round(unknown / max(found_by_text, 1), 3)}
