"""The one vocabulary of snippet statuses, and the verification ledger that records real runs.

Static statuses (set at index time by `indexer/snippet_check.py`):
- `checked`: parsed, and every deepspeed name resolves and every call binds to its signature
  (configs: validated by deepspeed's own parser);
- `template`: has placeholders (`<path>`, `[a|b]`, `...` as an argument) to fill in first;
- `fails`: the installed deepspeed rejects it (the reason names the call, key or line);
- `not_checked`: nothing was checked, with why (prose, shell, another tool, an excerpt).

A run (`dsqa verify`, ledger rows) adds `ran` when it passed. A failed run counts against the
snippet (`fails`) only when it is blamed on the snippet; a failure of our harness or of the machine
says nothing about the snippet, so the static verdict stays and the run is mentioned.

Every front end shows `verdict(...)`: the status and the words saying exactly what was done.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKED, TEMPLATE, FAILS, NOT_CHECKED, RAN = "checked", "template", "fails", "not_checked", "ran"
STATIC_STATUSES = (CHECKED, TEMPLATE, FAILS, NOT_CHECKED)
STATUSES = (RAN, CHECKED, TEMPLATE, FAILS, NOT_CHECKED)
LABELS = {RAN: "ran", CHECKED: "checked", TEMPLATE: "template", FAILS: "fails", NOT_CHECKED: "not checked"}
SHOW_ORDER = {RAN: 0, CHECKED: 1, TEMPLATE: 2, NOT_CHECKED: 3, FAILS: 4}  # most worth showing first

# the adaptation a run names when it repaired a config's JSON syntax first (`eval/programs.py`)
REPAIRED_SYNTAX = "JSON syntax repaired first"
_AS_WRITTEN = "the page's text does not parse as written"


def repaired_syntax_note(repairs: list[str]) -> str:
    """The adaptation naming the JSON repairs a run made (`verdict` reads it back)."""
    return f"{REPAIRED_SYNTAX} ({'; '.join(repairs)}): {_AS_WRITTEN}"

# who a failed run is blamed on (`eval/failure_blame.py` decides)
BLAME_SNIPPET, BLAME_HARNESS, BLAME_ENVIRONMENT = "snippet", "harness", "environment"

LEDGER = "verification.jsonl"  # beside an index: one row per snippet id, the latest run
PROGRESS_FILE = ".verify-progress.json"  # a running `dsqa verify --progress-file`: {state, done, total}


@dataclass(frozen=True)
class Verdict:
    status: str  # one of STATUSES
    words: str  # what was done, for a reader: "ran on cpu, deepspeed 0.19.8, 2026-11-30"


def _where(run: dict[str, Any]) -> str:
    device = str(run.get("device") or "?").split(" (")[0]
    return f"on {device}, deepspeed {run.get('deepspeed') or '?'}, {str(run.get('time') or '')[:10]}".rstrip(", ")


def run_failed_the_snippet(run: dict[str, Any]) -> bool:
    return run.get("status") in ("failed", "timeout", "killed") and run.get("blame", BLAME_SNIPPET) == BLAME_SNIPPET


def verdict(status: str, reason: str, checked_with: str, run: dict[str, Any] | None = None) -> Verdict:
    """The status a user sees and its words, from the static check and the latest run (if any)."""
    version = f" against deepspeed {checked_with}" if checked_with else ""
    repaired = [str(a) for a in (run or {}).get("adaptations") or [] if str(a).startswith(REPAIRED_SYNTAX)]
    if run and run.get("status") == "passed" and status == FAILS and repaired:
        # the page's text does not parse; the run shows the config itself works once that is mended
        what = repaired[0].removesuffix(f": {_AS_WRITTEN}").replace(REPAIRED_SYNTAX, "with its JSON syntax repaired")
        return Verdict(FAILS, f"fails as written{version}: {reason}; a run {_where(run)} passed {what}"[:400])
    if run and run.get("status") == "passed" and status == FAILS:
        # the static check names code deepspeed rejects; a run that passed did not reach it (a
        # function never called, fp16 run as bf16): the snippet still fails where it says
        return Verdict(FAILS, f"fails{version}: {reason}; a run {_where(run)} passed without reaching it"[:400])
    if run and run.get("status") == "passed":
        how = "; ".join(str(a) for a in run.get("adaptations") or [] if str(a).startswith(("ran ", "as ", "placeholder", "ZeRO stage", REPAIRED_SYNTAX)))
        return Verdict(RAN, f"ran {_where(run)}" + (f" ({how})" if how else ""))
    if run and run_failed_the_snippet(run):
        return Verdict(FAILS, f"a run {_where(run)} failed: {run.get('reason', '')}"[:300])
    words = {
        CHECKED: f"checked statically{version}: names resolve and calls bind; not run",
        TEMPLATE: f"template: fill in the placeholders first; checked{version} with them filled{(' (' + reason + ')') if reason else ''}",
        FAILS: f"fails{version}: {reason}",
        NOT_CHECKED: f"not checked: {reason or 'no check applies'}",
    }.get(status, f"not checked: {reason or 'no check applies'}")
    if run and run.get("status") in ("failed", "timeout", "killed", "skipped"):
        why = run.get("blame_why") or run.get("reason", "")
        words += f"; a run {_where(run)} could not test it ({run.get('blame') or 'skipped'}): {why}"
    return Verdict(status if status in STATIC_STATUSES else NOT_CHECKED, words[:400])


RUN_OUTCOMES = ("ran", "fails", "not tested (harness)", "not tested (environment)", "skipped", "no run")


def run_outcome(run: dict[str, Any] | None) -> str:
    """A ledger row as one of RUN_OUTCOMES."""
    if not run:
        return "no run"
    status = run.get("status")
    if status == "passed":
        return "ran"
    if status == "skipped":
        return "skipped"
    blame = run.get("blame") or BLAME_SNIPPET
    return "fails" if blame == BLAME_SNIPPET else f"not tested ({blame})"


def confusion(statuses: dict[str, str], ledger: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Static status -> run outcome -> count, over the snippets given (id -> static status)."""
    table: dict[str, dict[str, int]] = {s: dict.fromkeys(RUN_OUTCOMES, 0) for s in STATIC_STATUSES}
    for sid, status in statuses.items():
        row = table.setdefault(status, dict.fromkeys(RUN_OUTCOMES, 0))
        row[run_outcome(ledger.get(sid))] += 1
    return table


# --- the ledger -------------------------------------------------------------------------------


def read_ledger(index_dir: Path) -> dict[str, dict[str, Any]]:
    """Snippet id -> its latest run ({} when there is no ledger); unreadable lines are skipped."""
    file = Path(index_dir) / LEDGER
    rows: dict[str, dict[str, Any]] = {}
    if not file.is_file():
        return rows
    for line in file.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("id"):
            rows[str(row["id"])] = row
    return rows


def write_ledger_rows(index_dir: Path, new_rows: list[dict[str, Any]], keep: set[str] | None = None) -> Path:
    """Merge rows into the ledger (latest wins; with `keep`, only those ids survive) and swap the file
    in atomically (temp file + rename), so a reader never sees half a ledger."""
    rows = read_ledger(index_dir)
    for row in new_rows:
        rows[str(row["id"])] = row
    if keep is not None:
        rows = {sid: row for sid, row in rows.items() if sid in keep}
    path = Path(index_dir) / LEDGER
    fd, tmp = tempfile.mkstemp(prefix=".verification-", suffix=".jsonl", dir=index_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows.values():
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_progress(path: Path, state: str, done: int, total: int, **extra: Any) -> None:
    """Atomically replace a verify run's progress file: {state, done, total, ...}."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"state": state, "done": done, "total": total, **extra}), encoding="utf-8")
    os.replace(tmp, path)


def read_progress(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
