"""dsqa: imported first by every driver in the run's folder: an uncaught error is printed, then the
process leaves without the interpreter's teardown, where a NCCL group the failure left behind can hang
in its destructor (the run would read as a timeout, not a failure). Written to the real stderr:
torch.distributed's own hook, which calls this one once a process group exists, buffers what it prints."""

import os
import sys
import traceback


def _exit_on_error(kind, value, tb):  # type: ignore[no-untyped-def]
    sys.stdout.flush()
    traceback.print_exception(kind, value, tb, file=sys.__stderr__)
    sys.__stderr__.flush()
    os._exit(1)


sys.excepthook = _exit_on_error
