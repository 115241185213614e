"""A C++ compiler front for the ops cache's trusted build: torch's headers parsed once per build.

Every DeepSpeed op's C++ file that includes `torch/extension.h` spends most of its compile parsing
torch's headers (~25 s of ~43 s per file on this machine class; async_io alone has a dozen such files).
The trusted build (`eval/ops_cache.py`) puts this program first on the build's PATH as `c++`;
for a C++ file of a named op that includes torch's headers it precompiles `torch/extension.h` once per
set of compile flags into a GCC precompiled header (PCH) and compiles the file with it, passing on to
the real compiler. Building a PCH costs about what parsing the headers costs two files (~60 s), and the
files still instantiate torch's templates themselves (~15 s each), so only an op with many such files
gains: async_io (9 of its 12) builds in 218 s instead of 300 s on two cores; ops with two files do not. Anything else (linking, version probes, a file that does not include torch, a compiler
that rejects the PCH) goes to the real compiler unchanged, and a compile that fails with the PCH is
run again without it, so the front can only make a build faster, never break it. A file compiled with
the PCH is compiled without `-g` (a PCH built with debug information is ~1 GB): the ops carry no debug
information, which nothing here reads.

This file runs as a program inside the build's sandbox, where the repository is not visible: it uses
the standard library only, and `install` copies its text next to the PCHs with the venv's interpreter
in its first line.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

REAL_CXX_ENV = "DSQA_REAL_CXX"  # the real compiler this front passes on to
PCH_DIR_ENV = "DSQA_PCH_DIR"  # where the PCHs of one build live (removed by the build step after it)
PCH_OPS_ENV = "DSQA_PCH_OPS"  # the ops (comma-separated extension names) whose files use a PCH
FRONT_NAME = "c++"  # the compiler torch uses when CXX is unset: the front comes first on the build's PATH
SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx")
TORCH_HEADER_ROOTS = ("torch/", "ATen/", "c10/")
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)
_DROPPED_WITH_VALUE = ("-o", "-MF", "-MT", "-MQ")
_NAME_FLAG = "-DTORCH_EXTENSION_NAME="  # the op's name, a macro torch's headers never read


def includes_torch(source: Path, include_dirs: list[Path], *, limit: int = 400) -> bool:
    """Whether a C++ file includes torch's headers, directly or through the op's own headers (found
    beside the including file or in the op's -I folders; system folders are not followed)."""
    seen: set[Path] = set()
    todo = [source]
    while todo and len(seen) < limit:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for name in _INCLUDE.findall(text):
            if name.startswith(TORCH_HEADER_ROOTS):
                return True
            for folder in (path.parent, *include_dirs):
                candidate = folder / name
                if candidate.is_file():
                    todo.append(candidate.resolve())
                    break
    return False


def compile_parts(args: list[str]) -> tuple[list[str], Path, list[Path]] | None:
    """For one C++ compile command (`-c FILE`): its flags with the file, the output and the dependency
    file options taken out (what the PCH is built with), the file, and its -I folders. None for
    anything else (linking, probes, C files, an explicit language)."""
    if "-c" not in args or "-x" in args or any(a.startswith("-x") and len(a) > 2 for a in args):
        return None
    flags: list[str] = []
    sources: list[str] = []
    includes: list[Path] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _DROPPED_WITH_VALUE:
            i += 2
            continue
        if arg in ("-c", "-MMD", "-MD"):
            i += 1
            continue
        if not arg.startswith("-") and arg.endswith(SOURCE_SUFFIXES):
            sources.append(arg)
        else:
            if arg.startswith("-I") and len(arg) > 2:
                includes.append(Path(arg[2:]))
            flags.append(arg)
        i += 1
    if len(sources) != 1:
        return None
    return flags, Path(sources[0]), includes


def pch_flags(flags: list[str]) -> list[str]:
    """The flags a PCH is built and used with: the compile's own, without debug information."""
    return [f for f in flags if not re.fullmatch(r"-g[0-3]?|-ggdb[0-3]?", f)]


def pch_key(flags: list[str]) -> str:
    """One PCH per set of flags that can change what torch's headers compile to: -I folders and the
    extension's name (a macro torch's headers never read) do not count."""
    relevant = [f for f in pch_build_flags(flags) if not f.startswith("-I")]
    return hashlib.sha256("\0".join(relevant).encode()).hexdigest()[:16]


def pch_build_flags(flags: list[str]) -> list[str]:
    """The flags the PCH itself is built with: the key's, without the extension's name. GCC uses a PCH
    only where every macro defined when it was built is defined the same way, and accepts macros
    defined after it: a PCH built without the name serves every op of the key."""
    return [f for f in flags if not f.startswith(_NAME_FLAG)]


def ensure_pch(real: str, flags: list[str], root: Path) -> Path | None:
    """The header to `-include` for these flags, its PCH built first if this build has none yet (one
    process builds it; the others wait on its lock). None when it cannot be built."""
    folder = root / pch_key(flags)
    folder.mkdir(parents=True, exist_ok=True)
    header = folder / "torch_extension.h"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "failed").exists():
            return None
        if not (folder / "torch_extension.h.gch").exists():
            header.write_text("#include <torch/extension.h>\n")
            tmp = folder / "building.gch"
            done = subprocess.run([real, *pch_build_flags(flags), "-x", "c++-header", str(header), "-o", str(tmp)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            if done.returncode != 0 or not tmp.exists():
                (folder / "failed").write_text(str(done.returncode))
                tmp.unlink(missing_ok=True)
                return None
            tmp.rename(folder / "torch_extension.h.gch")
    return header


def with_pch(args: list[str], header: Path) -> list[str]:
    """The compile command using the PCH: debug flags dropped, the header forced in first."""
    return ["-include", str(header), *pch_flags(args)]


def extension_name(flags: list[str]) -> str:
    return next((f.removeprefix(_NAME_FLAG) for f in flags if f.startswith(_NAME_FLAG)), "")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    real = os.environ.get(REAL_CXX_ENV) or "c++"
    root = os.environ.get(PCH_DIR_ENV)
    ops = set(os.environ.get(PCH_OPS_ENV, "").split(","))
    parts = compile_parts(args) if root else None
    if parts is not None and root is not None:
        flags, source, include_dirs = parts
        if extension_name(flags) in ops and includes_torch(source, include_dirs):
            header = ensure_pch(real, pch_flags(flags), Path(root))
            if header is not None:
                tried = subprocess.run([real, *with_pch(args, header)], capture_output=True, check=False)
                if tried.returncode == 0:
                    sys.stdout.buffer.write(tried.stdout)
                    sys.stderr.buffer.write(tried.stderr)
                    return 0
    return subprocess.run([real, *args], check=False).returncode


def install(folder: Path, python: str) -> Path:
    """Write this front into `folder` as an executable named like the compiler torch calls by default.
    It is found first on the build's PATH rather than named by CXX: torch writes the compiler's name
    into the op's build.ninja, and every later load of the op (each run's, without the front) writes it
    again and runs ninja, which rebuilds everything whose command line changed."""
    folder.mkdir(parents=True, exist_ok=True)
    front = folder / FRONT_NAME
    front.write_text(f"#!{python}\n" + Path(__file__).read_text())
    front.chmod(0o755)
    return front


if __name__ == "__main__":
    sys.exit(main())
