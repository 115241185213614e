"""Library output silenced or captured, safely across threads.

`contextlib.redirect_stdout` swaps the process-wide `sys.stdout`; two threads doing it at once (the
runner prepares snippets two at a time, each validating its config with DeepSpeed's parser) can
restore each other's buffer and leave `sys.stdout` pointing at a StringIO for good: every later
print lost, `dsqa verify --json` included. Every redirect in dsqa goes through `captured()`,
which holds one process-wide lock while the streams are swapped. The build's own use of libraries
(DeepSpeed's parser over probe configs, the encoder's ONNX export) is kept off the user's terminal too.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import warnings
from collections.abc import Iterator

_SWAP = threading.RLock()


@contextlib.contextmanager
def captured(stderr: bool = False) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """(stdout, stderr) buffers that take what the block prints; stderr only when asked."""
    out, err = io.StringIO(), io.StringIO()
    with _SWAP, contextlib.redirect_stdout(out), (contextlib.redirect_stderr(err) if stderr else contextlib.nullcontext()):
        yield out, err


@contextlib.contextmanager
def logger_quiet(name: str, level: int = logging.ERROR) -> Iterator[None]:
    """A library's logger raised to `level` for the block (DeepSpeed's warnings about the configs our
    own probe feeds its parser are not the user's to read)."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(max(level, before))
    try:
        yield
    finally:
        logger.setLevel(before)


class _DropFrom(logging.Filter):
    def __init__(self, path_part: str) -> None:
        super().__init__()
        self.path_part = path_part

    def filter(self, record: logging.LogRecord) -> bool:
        return self.path_part not in record.pathname.replace("\\", "/")


@contextlib.contextmanager
def export_quiet() -> Iterator[None]:
    """The encoder's ONNX export and quantization without the tracer's warnings about code paths of
    the model it does not take, nor onnxruntime's advice to pre-process (logged on the root logger)."""
    drop = _DropFrom("onnxruntime/quantization")
    root = logging.getLogger()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root.addFilter(drop)
        try:
            yield
        finally:
            root.removeFilter(drop)
