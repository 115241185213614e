"""The ops cache (TORCH_EXTENSIONS_DIR): compiled DeepSpeed ops, written only by a trusted build step.

Snippet code sees the cache through a copy-on-write overlay (`eval/sandbox.py`): it can load what is
there, and an op it compiles lands in its own sandbox and is gone after the run, so no snippet can
plant a library that a later run would load. When a run had to compile an op the cache lacks, the
runner asks this module to build that op here, from the installed deepspeed's own sources (a fixed
program; the snippet's code plays no part), so later runs find it. The build compiles through
`eval/op_compiler.py`, which parses torch's headers once for async_io's many files.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from eval import op_compiler
from eval.sandbox import run_sandboxed

log = logging.getLogger(__name__)

CPU_ENGINE_OPS = ("deepspeed_shm_comm", "cpu_adam", "fused_adam")  # what deepspeed.initialize loads on a CPU
CUDA_ENGINE_OPS = ("fused_adam", "cpu_adam")  # on a GPU: Adam on the GPU, and Adam for CPU offload
PCH_OPS = ("async_io",)  # the ops whose many torch-including files gain from a PCH (`eval/op_compiler.py`)
BUILD_TIMEOUT_S = 900.0  # async_io alone takes ~175 s on two cores (~300 s without its PCH)
BUILD_MEMORY_MB = 8192

# the trusted build: every op builder of this accelerator whose name was asked for, loaded (JIT-compiled)
_BUILD = r"""
import sys
import deepspeed.ops.op_builder as builders
from deepspeed.accelerator import get_accelerator

wanted = set(sys.argv[1:])
for attr in sorted(dir(builders)):
    if not attr.endswith("Builder") or attr == "OpBuilder":
        continue
    try:
        cls = get_accelerator().get_op_builder(attr)
        builder = cls() if cls is not None else None
    except Exception:
        continue
    if builder is not None and builder.name in wanted and builder.is_compatible(verbose=False):
        wanted.discard(builder.name)
        try:
            builder.load(verbose=False)
            print("built", builder.name, flush=True)
        except Exception as exc:  # one op that cannot build here does not stop the others
            print("failed", builder.name, type(exc).__name__, flush=True)
"""


class OpsCache:
    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._tried: set[str] = set()
        self._lock = threading.Lock()

    def has(self, name: str) -> bool:
        """Whether a compiled library of this op is in the cache."""
        folder = self.directory / name
        return folder.is_dir() and any(folder.rglob("*.so"))

    def missing(self, names: Iterable[str]) -> list[str]:
        """Names a run wrote that the cache holds no library for and that no build has tried yet."""
        return sorted({n for n in names if not n.startswith(".") and not self.has(n) and n not in self._tried})

    def compiler_env(self, work: Path, env: Mapping[str, str]) -> dict[str, str]:
        """What makes torch's JIT build compile through the precompiled-header front (`eval/op_compiler.py`):
        the front first on PATH as `c++`, passing on to the `c++` the build would have used. Nothing
        when CXX names a compiler of its own or there is no `c++`."""
        path = env.get("PATH") or os.defpath
        real = shutil.which(op_compiler.FRONT_NAME, path=path)
        if env.get("CXX") or real is None:
            return {}
        front = op_compiler.install(work / "bin", sys.executable)
        return {"PATH": f"{front.parent}{os.pathsep}{path}", op_compiler.REAL_CXX_ENV: real,
                op_compiler.PCH_DIR_ENV: str(work / "pch"), op_compiler.PCH_OPS_ENV: ",".join(PCH_OPS)}

    def build(self, names: Iterable[str], env: Mapping[str, str], *, isolate: bool = True) -> list[str]:
        """Compile the named ops into the cache with the trusted program; the names built. A name no
        builder of this accelerator has (anything a snippet made up) builds nothing."""
        with self._lock:  # one build at a time: concurrent runs may ask for the same op
            todo = self.missing(names)
            if not todo:
                return []
            self._tried.update(todo)
            work = self.directory / f".build-{os.getpid()}-{threading.get_ident()}"
            try:
                # CUDA reserves far more address space than it uses (a builder reads the GPU's arch), so
                # the address-space cap applies to a CPU build only, as for the runs themselves
                memory_mb = None if env.get("DS_ACCELERATOR") == "cuda" else BUILD_MEMORY_MB
                result = run_sandboxed([sys.executable, "-c", _BUILD, *todo], timeout_s=BUILD_TIMEOUT_S, memory_mb=memory_mb,
                                       env={**env, **self.compiler_env(work, env)}, keep_rw=str(self.directory), isolate=isolate)
            finally:
                shutil.rmtree(work, ignore_errors=True)  # the PCHs (~0.8 GB each) serve one build only
            built = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("built ")]
            if result.returncode != 0:
                log.warning("ops build of %s failed: %s", ", ".join(todo), result.stderr[-300:])
            return built
