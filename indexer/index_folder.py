"""An index's folder on disk: the manifest's name, whether an index is there, and the two renames that
put a new build in place of the old one (and put the old one back after a build killed between them).

Light on purpose (no numpy, faiss or BM25): a server's supervisor and `dsqa` commands that only ask
whether an index is there import this, not `indexer/store.py`.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

MANIFEST = "manifest.json"


def recover_swap(out: Path) -> None:
    """A build killed between its two renames leaves no index at `out` and the previous one at
    `.NAME.old-PID`: put that one back (the new one, never swapped in, is dropped by the next build)."""
    out = Path(out)
    if out.exists() or not out.parent.is_dir():
        return
    olds = sorted(out.parent.glob(f".{out.name}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in olds:
        if (old / MANIFEST).is_file():
            os.replace(old, out)
            return


def remove_stale_builds(out: Path) -> list[Path]:
    """Remove `.NAME.building-PID-*` and `.NAME.old-PID` folders whose build process is gone."""
    removed = []
    for leftover in [*out.parent.glob(f".{out.name}.building-*"), *out.parent.glob(f".{out.name}.old-*")]:
        m = re.search(r"\.(?:building|old)-(\d+)", leftover.name)
        pid = int(m.group(1)) if m else None
        if pid is not None and pid != os.getpid() and _alive(pid):
            continue
        shutil.rmtree(leftover, ignore_errors=True)
        removed.append(leftover)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def swap_into_place(tmp: Path, out: Path) -> None:
    old: Path | None = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except OSError:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def index_present(path: Path) -> bool:
    """Whether an index (whole or damaged) is at `path`, after putting back one a killed build left
    aside; False means not built yet."""
    recover_swap(Path(path))
    return (Path(path) / MANIFEST).is_file()
