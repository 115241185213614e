"""A run's process tree bounded as a whole: its own cgroup (v1 `memory` and `pids` controllers, or
v2 where that is mounted writable) with a memory limit and a process-count limit, so eight children
of 512 MB each or a fork bomb hit one ceiling instead of the machine's.

Used by `eval/sandbox.py`: `RunCgroup.create()` before the child starts, `join()` from the child
between fork and exec (so everything it starts is inside), `close()` after it ended (leftover
processes killed, the cgroup removed). Where no controller can be made (no permission, no cgroup
fs), `create()` returns None and the sandbox reports that this bound did not hold.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


@dataclass
class RunCgroup:
    dirs: dict[str, Path] = field(default_factory=dict)  # controller -> this run's folder

    @classmethod
    def create(cls, memory_mb: int | None, pids_max: int | None, root: Path = ROOT) -> RunCgroup | None:
        name = f"dsqa-{uuid.uuid4().hex[:12]}"
        made: dict[str, Path] = {}
        try:
            if memory_mb and _writable(root / "memory"):
                d = root / "memory" / name
                d.mkdir()
                made["memory"] = d
                limit = str(int(memory_mb) * 1024 * 1024)
                (d / "memory.limit_in_bytes").write_text(limit)
                with contextlib.suppress(OSError):  # memory + swap, where swap accounting is on
                    (d / "memory.memsw.limit_in_bytes").write_text(limit)
            if pids_max and _writable(root / "pids"):
                d = root / "pids" / name
                d.mkdir()
                made["pids"] = d
                (d / "pids.max").write_text(str(int(pids_max)))
        except OSError:
            RunCgroup(made).close()
            return None
        return cls(made) if made else None

    @property
    def bounds(self) -> list[str]:
        return [f"cgroup_{c}" for c in sorted(self.dirs)]

    def join(self) -> None:
        """Move the calling process (the child, before exec) into every controller."""
        for d in self.dirs.values():
            (d / "cgroup.procs").write_text(str(os.getpid()))

    def hit(self) -> list[str]:
        """Which limits the run ran into (memory OOM kills, refused forks)."""
        hits = []
        with contextlib.suppress(OSError, ValueError):
            control = (self.dirs["memory"] / "memory.oom_control").read_text() if "memory" in self.dirs else ""
            kills = [int(line.split()[1]) for line in control.splitlines() if line.startswith("oom_kill ")]
            if kills and kills[0] > 0:  # the kernel killed a process of the run for memory
                hits.append("memory")
        with contextlib.suppress(OSError):
            events = (self.dirs["pids"] / "pids.events").read_text() if "pids" in self.dirs else ""
            if any(line.startswith("max ") and line.split()[1] != "0" for line in events.splitlines()):
                hits.append("pids")
        return hits

    def close(self) -> None:
        """Kill what is left inside and remove the cgroup folders."""
        for d in self.dirs.values():
            for _ in range(50):
                pids = _members(d)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.02)
            with contextlib.suppress(OSError):
                d.rmdir()


def _members(d: Path) -> list[int]:
    try:
        return [int(p) for p in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


@lru_cache(maxsize=4)
def _writable(controller: Path) -> bool:
    if not (controller / "cgroup.procs").is_file():
        return False
    probe = controller / f"dsqa-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False
