"""Library output silenced or captured, safely across threads.

`contextlib.redirect_stdout` swaps the process-wide `sys.stdout`; two threads doing it at once (the
runner prepares snippets two at a time, each validating its config with DeepSpeed's parser) can
restore each other's buffer and leave `sys.stdout` pointing at a StringIO for good: every later
print lost, `dsqa verify --json` included. Every redirect in dsqa goes through `captured()`,
which holds one process-wide lock while the streams are swapped.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator

_SWAP = threading.RLock()


@contextlib.contextmanager
def captured(stderr: bool = False) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """(stdout, stderr) buffers that take what the block prints; stderr only when asked."""
    out, err = io.StringIO(), io.StringIO()
    with _SWAP, contextlib.redirect_stdout(out), (contextlib.redirect_stderr(err) if stderr else contextlib.nullcontext()):
        yield out, err
