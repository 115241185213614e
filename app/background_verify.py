"""Verification in the background of a serving index: `dsqa up` starts `dsqa verify` as a niced
child process (the local runner, one snippet at a time, each bounded in time and memory) once the
service is up. The child writes each run to the ledger as it lands and its progress to a small
JSON file; the service reloads the ledger when it changes (`/ask` shows `ran` badges without a
restart) and reports the progress on `/readyz` and `/metrics`.

A child process, not a thread: snippet runs import deepspeed and torch, which the service itself
never needs, and a crash there cannot take the service down.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from indexer.snippet_status import PROGRESS_FILE, read_progress, write_progress

log = logging.getLogger(__name__)

def _lower_priority() -> None:  # runs in the child before exec
    os.nice(10)


class BackgroundVerify:
    """One `dsqa verify --skip-done` child for the life of the service."""

    def __init__(self, index_dir: Path, *, timeout_s: float, log_path: Path | None = None) -> None:
        self.index_dir = Path(index_dir)
        self.timeout_s = timeout_s
        self.progress_path = self.index_dir / PROGRESS_FILE
        self.log_path = log_path or self.index_dir.parent / "verify.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [
            sys.executable, "-m", "app.cli", "verify", "--index", str(self.index_dir), "--skip-done", "--quiet",
            "--timeout", f"{self.timeout_s:g}", "--progress-file", str(self.progress_path),
        ]
        write_progress(self.progress_path, "starting", 0, 0)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=_lower_priority, start_new_session=True)  # noqa: PLW1509
        log.info("verifying snippets in the background (pid %s, log %s)", self.proc.pid, self.log_path)

    def progress(self) -> dict[str, Any]:
        """{state: starting | running | done | failed | stopped, done, total}."""
        data = read_progress(self.progress_path)
        code = self.proc.poll() if self.proc is not None else None
        if code is not None and data.get("state") not in ("done",):
            data["state"] = "failed" if code not in (0, -15) else "stopped"
            data["exit_code"] = code
        return data

    def stop(self) -> None:
        """End the child and the snippet it is running (its own process group)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
