"""Who a failed run is blamed on: the snippet, our harness, or the machine.

Only a failure the snippet causes may be shown as `fails`: an error deepspeed or torch raises on
the snippet's own call, a deepspeed module, name or config key that no longer exists, a config the
parser rejects. A name the fragment takes from its tutorial (`model`, `train_loader`), a stand-in
lacking the tutorial model's attributes, state an earlier step would have made (a checkpoint that
was never saved), or an engine of the wrong type is the harness's gap; a missing tool, library,
device or compiler, a time or memory limit, is the environment's. Those say nothing about the
snippet: they are `not checked`, with the reason, and feed the harness's to-do list.

Pure: reads the snippet's code, the run's stderr and its one-line reason.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from indexer.python_check import bound_names
from indexer.snippet_status import BLAME_ENVIRONMENT, BLAME_HARNESS, BLAME_SNIPPET

_NAME_ERROR = re.compile(r"NameError: name '(\w+)' is not defined")
_NO_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'")
_CANNOT_IMPORT = re.compile(r"ImportError: cannot import name '(\w+)' from '([\w.]+)'")
_NO_ATTR_ON_OBJECT = re.compile(r"AttributeError: '(\w+)' object has no attribute '(\w+)'")
_NO_ATTR_ON_MODULE = re.compile(r"AttributeError: module '([\w.]+)' has no attribute '(\w+)'")
_ENVIRONMENT = re.compile(
    r"command not found|: not found\b|No such file or directory: '(?:numactl|nvidia-smi|nvcc|pdsh|mpirun|ninja)'|"
    r"Torch not compiled with CUDA|No CUDA GPUs|CUDA_HOME|nvcc|libaio|aio\.h|async_io.*(?:not compatible|requires)|"
    r"Cannot access accelerator device|NCCL|cuda.*(?:not available|unavailable)|"
    r"error: command '[^']*(?:gcc|g\+\+|c\+\+)'|ninja: build stopped|Error building extension|"
    r"is not compatible with the current (?:machine|accelerator)|"
    r"requires (?:a )?(?:GPU|CUDA)|fp16 is not supported on cpu|FP16 is not supported|"
    r"Data type torch\.(?:float16|half) is not supported by cpu accelerator",
    re.I,
)
_MISSING_STATE = re.compile(r"FileNotFoundError|No such file or directory|does not exist|not a valid checkpoint|Unable to find|ckpt_list|/path/to/", re.I)
_SNIPPET_FRAME = re.compile(r'File "snippet\.py", line (\d+)')
# the harness's stand-ins: our tiny model and its containers, the engine a ds_config run builds
STAND_INS = {"TinyModel", "Sequential", "Linear", "MLP", "DeepSpeedEngine", "Namespace", "SimpleNamespace", "DataLoader", "TensorDataset"}
# engine methods that exist only on another engine type (a pipeline engine, the hybrid engine)
_OTHER_ENGINE_METHODS = {"train_batch", "eval_batch", "is_first_stage", "is_last_stage", "generate"}


@dataclass(frozen=True)
class Blame:
    party: str  # BLAME_SNIPPET | BLAME_HARNESS | BLAME_ENVIRONMENT
    why: str


def _bound_names(code: str) -> set[str] | None:
    try:
        return bound_names(ast.parse(code))
    except SyntaxError:
        return None


def _last_error(text: str) -> str:
    """The last `SomeError: message` line of a traceback (else the text's last line)."""
    found = re.findall(r"^(?:\[rank\d+\]:\s*)?((?:[\w.]+(?:Error|Exception|Exit)|AssertionError)\b.*)$", text, re.M)
    return found[-1] if found else text.strip().splitlines()[-1] if text.strip() else ""


def _failing_line(code: str, text: str) -> str:
    """The snippet's own line the traceback last passed through ('' when it names none)."""
    lines = [int(n) for n in _SNIPPET_FRAME.findall(text)]
    source = code.splitlines()
    if not lines or not 0 < lines[-1] <= len(source):
        return ""
    return source[lines[-1] - 1]


_SHAPE_ERROR = re.compile(r"(?:AttributeError: '(\w+)' object has no attribute|TypeError: '(\w+)' object is not (?:callable|subscriptable)"
                          r"|TypeError: (tuple|list) indices must be integers)")
_STAND_IN_SHAPES = {"tuple", "list", "TensorDataset", "TinyModel", "Namespace", "NoneType", "Sequential", "ArgumentParser"}


def blame_failure(kind: str, code: str, status: str, reason: str, stderr: str = "", adaptations: list[str] | None = None) -> Blame:
    """Who is at fault for a run that ended `failed`, `timeout` or `killed`; `adaptations`: what the
    harness did to run it (names the prelude supplied, placeholders it filled)."""
    text = f"{stderr[-4000:]}\n{reason}"
    adaptations = adaptations or []
    filled = [a.rsplit(" filled with ", 1)[1] for a in adaptations if " filled with " in a]
    if any(f"'{value}'" in text for value in filled):
        return Blame(BLAME_HARNESS, "a placeholder dsqa filled in does not fit what the command expects")
    if status == "timeout":
        return Blame(BLAME_ENVIRONMENT, "ran past the time limit of this runner")
    if status == "killed":
        return Blame(BLAME_ENVIRONMENT, "stopped by the runner's memory or signal limit")
    if reason.startswith("runs, but deepspeed silently ignores"):
        return Blame(BLAME_SNIPPET, "deepspeed ignores a key the snippet sets")
    m = _NO_MODULE.search(text)
    if m:
        module = m.group(1)
        if module.split(".")[0] == "deepspeed":
            return Blame(BLAME_SNIPPET, f"imports {module}, which the installed deepspeed does not have")
        return Blame(BLAME_ENVIRONMENT, f"needs the '{module.split('.')[0]}' package, not installed on this runner")
    m = _CANNOT_IMPORT.search(text)
    if m and m.group(2).split(".")[0] == "deepspeed":
        return Blame(BLAME_SNIPPET, f"{m.group(2)} has no '{m.group(1)}'")
    m = _NO_ATTR_ON_MODULE.search(text)
    if m and m.group(1).split(".")[0] == "deepspeed":
        return Blame(BLAME_SNIPPET, f"{m.group(1)} has no '{m.group(2)}'")
    if _ENVIRONMENT.search(text):
        return Blame(BLAME_ENVIRONMENT, "needs a tool, library or device this runner lacks")
    frames = re.findall(r'File "[^"]*/site-packages/(\w+)/', text)
    if frames and frames[-1] not in ("deepspeed", "torch") and re.search(r"\bremoved\b|no longer|deprecated", _last_error(stderr[-4000:] or reason), re.I):
        return Blame(BLAME_ENVIRONMENT, f"the installed {frames[-1]} removed what the snippet uses (its page predates that release)")
    m = _NAME_ERROR.search(text)
    if m and kind == "python":  # a fragment's name from earlier on its page (even one it rebinds later)
        return Blame(BLAME_HARNESS, f"the fragment uses '{m.group(1)}' from its page; the harness does not supply it")
    failing = _failing_line(code, text)
    m = _NO_ATTR_ON_OBJECT.search(text)
    if m and m.group(1) == "NoneType" and failing:
        head = re.match(r"\s*([A-Za-z_]\w*)\.", failing)
        bound = _bound_names(code) or set()
        if head and head.group(1) not in bound:
            return Blame(BLAME_HARNESS, f"the harness stands in None for '{head.group(1)}', which the snippet's page sets up")
    if any(name in text for name in ("TinyModel(", "TinyModel'")) and "TypeError" in text:
        return Blame(BLAME_HARNESS, "the harness's stand-in model or batch is not shaped like the tutorial's")
    shape = _SHAPE_ERROR.search(text)
    if shape and any(a.startswith("prelude supplied") for a in adaptations) and (shape.group(1) or shape.group(2) or shape.group(3)) in _STAND_IN_SHAPES:
        return Blame(BLAME_HARNESS, f"the harness's stand-ins are not shaped like the tutorial's objects (a {shape.group(1) or shape.group(2) or shape.group(3)})")
    error = _last_error(stderr[-4000:] or reason)  # the exception itself, not the traceback's lines (which may name an optimizer)
    if any(a.startswith("no optimizer block") for a in adaptations) and re.search(r"optimizer|adam", error, re.I):
        return Blame(BLAME_HARNESS, "the harness's stand-in optimizer (torch AdamW) is not the one the snippet's page configures")
    if "no MoE layers detected" in text:
        return Blame(BLAME_HARNESS, "the harness's tiny model is not the MoE model the config is written for")
    if failing and re.search(r"\bis_pinned\b|\bpin_memory\b", failing) and "AssertionError" in text:
        return Blame(BLAME_ENVIRONMENT, "the CPU accelerator does not pin memory")
    if "ZeRO stage 0" in text and "zero_optimization" not in code:
        return Blame(BLAME_HARNESS, "the harness's engine runs ZeRO stage 0; the snippet's page configures another stage")
    if m:
        owner, attr = m.groups()
        if owner == "DeepSpeedEngine" and attr in _OTHER_ENGINE_METHODS:
            return Blame(BLAME_HARNESS, f"'{attr}' belongs to another engine type than the one the harness built")
        if owner == "AdamW" and "AdamW" not in code:  # the stand-in engine's optimizer (ZeRO stage 0, torch AdamW)
            return Blame(BLAME_HARNESS, f"the harness's engine runs ZeRO stage 0 with torch AdamW, which lacks '{attr}'; the snippet's page configures another stage")
        if owner in ("TinyModel", "Namespace"):  # only the harness makes these
            return Blame(BLAME_HARNESS, f"the harness's stand-in {owner} lacks '{attr}', which the tutorial's own object has")
        if owner in STAND_INS and not re.search(rf"\b{re.escape(attr)}\b\s*=", code):
            return Blame(BLAME_HARNESS, f"the harness's stand-in {owner} lacks '{attr}', which the tutorial's own object has")
    if kind == "python" and _MISSING_STATE.search(text) and re.search(r"load_checkpoint|_checkpoint\(|from_pretrained|open\(|torch\.load|load_state_dict", code):
        return Blame(BLAME_HARNESS, "loads state (a checkpoint, a file) that an earlier step of its page would have written")
    return Blame(BLAME_SNIPPET, "raised by the snippet's own code or deepspeed on its call")
