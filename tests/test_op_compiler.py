"""The ops build's compiler front: a C++ file that includes torch's headers is compiled with a PCH of
them, everything else passes through unchanged, and a compile the PCH breaks is run again without it.
The real compiler runs here, on a stand-in `torch/extension.h` (the real one takes a minute to
precompile; the real ops build goes through the front in `dsqa runner build-ops`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from eval import op_compiler
from eval.op_compiler import compile_parts, includes_torch, pch_flags, pch_key

CXX = shutil.which("c++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler on this machine")


def _op(tmp_path: Path, header: str = "inline int torch_answer() { return 42; }\n") -> tuple[Path, Path]:
    include = tmp_path / "include"
    (include / "torch").mkdir(parents=True)
    (include / "torch" / "extension.h").write_text("#pragma once\n" + header)
    src = tmp_path / "op"
    src.mkdir()
    (src / "op.h").write_text("#include <torch/extension.h>\n")
    (src / "op.cpp").write_text('#include "op.h"\nint op_value() { return torch_answer(); }\n')
    (src / "plain.cpp").write_text("#include <cstdio>\nint plain_value() { return 7; }\n")
    return include, src


def test_compile_parts_takes_out_the_file_output_and_dependency_options() -> None:
    args = ["-MMD", "-MF", "op.o.d", "-DTORCH_EXTENSION_NAME=op", "-I/x/inc", "-isystem", "/t/include", "-O3", "-g",
            "-c", "/x/op.cpp", "-o", "op.o"]
    flags, source, includes = compile_parts(args)  # type: ignore[misc]
    assert source == Path("/x/op.cpp") and includes == [Path("/x/inc")]
    assert flags == ["-DTORCH_EXTENSION_NAME=op", "-I/x/inc", "-isystem", "/t/include", "-O3", "-g"]
    assert pch_flags(flags)[-1] == "-O3" and "-g" not in pch_flags(flags)
    # linking, version probes, a header compile and two files at once are not compiles of one C++ file
    assert compile_parts(["a.o", "b.o", "-shared", "-o", "op.so"]) is None
    assert compile_parts(["-dumpfullversion", "-dumpversion"]) is None
    assert compile_parts(["-x", "c++-header", "h.h", "-c", "-o", "h.gch"]) is None
    assert compile_parts(["-c", "a.cpp", "b.cpp"]) is None


def test_the_key_ignores_include_folders_and_the_extension_name_but_not_code_flags() -> None:
    base = ["-isystem", "/t/include", "-O3", "-march=native"]
    assert pch_key(["-I/a", "-DTORCH_EXTENSION_NAME=cpu_adam", *base]) == pch_key(["-I/b", "-DTORCH_EXTENSION_NAME=fused_adam", *base])
    assert pch_key(base) != pch_key(["-isystem", "/t/include", "-O0", "-march=native"])
    assert pch_key(base) != pch_key([*base, "-D__AVX512__"])


def test_torch_includes_are_found_through_the_ops_own_headers_only(tmp_path: Path) -> None:
    include, src = _op(tmp_path)
    assert includes_torch(src / "op.cpp", [])  # through op.h beside it
    assert not includes_torch(src / "plain.cpp", [include])
    (src / "deep.cpp").write_text('#include "sub/deeper.h"\n')
    (tmp_path / "inc2" / "sub").mkdir(parents=True)
    (tmp_path / "inc2" / "sub" / "deeper.h").write_text("#include <ATen/ATen.h>\n")
    assert includes_torch(src / "deep.cpp", [tmp_path / "inc2"]) and not includes_torch(src / "deep.cpp", [])


@needs_cxx
def test_a_torch_file_compiles_with_one_pch_and_a_plain_file_without(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    include, src = _op(tmp_path)
    pch = tmp_path / "pch"
    monkeypatch.setenv(op_compiler.REAL_CXX_ENV, str(CXX))
    monkeypatch.setenv(op_compiler.PCH_DIR_ENV, str(pch))
    monkeypatch.setenv(op_compiler.PCH_OPS_ENV, "a,b")
    # -I, not -isystem: the dependency file names the stand-in header only where it was parsed as text
    common = ["-MMD", "-MF", str(tmp_path / "x.d"), f"-I{include}", "-O1", "-g"]
    for name in ("a", "b"):  # two ops' files with the same code flags share the one PCH
        assert op_compiler.main([*common, f"-DTORCH_EXTENSION_NAME={name}", "-c", str(src / "op.cpp"), "-o", str(tmp_path / f"{name}.o")]) == 0
    gch = list(pch.rglob("*.gch"))
    assert len(gch) == 1 and gch[0].stat().st_size > 0
    deps = (tmp_path / "x.d").read_text()  # the second op's file: the PCH built for the first served it
    assert "op.h" in deps and "extension.h" not in deps
    assert op_compiler.main([*common, "-c", str(src / "plain.cpp"), "-o", str(tmp_path / "plain.o")]) == 0
    assert len(list(pch.rglob("*.gch"))) == 1  # a file without torch builds no PCH and uses none
    assert op_compiler.main([*common, "-O2", "-DTORCH_EXTENSION_NAME=c", "-c", str(src / "op.cpp"), "-o", str(tmp_path / "c.o")]) == 0
    assert len(list(pch.rglob("*.gch"))) == 1 and "extension.h" in (tmp_path / "x.d").read_text()  # an op not named: plain
    symbols = subprocess.run(["nm", str(tmp_path / "a.o")], capture_output=True, text=True).stdout if shutil.which("nm") else "op_value"
    assert "op_value" in symbols and (tmp_path / "plain.o").stat().st_size > 0


@needs_cxx
def test_a_pch_that_cannot_be_built_or_breaks_a_file_falls_back_to_the_plain_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the header only compiles with a macro the file defines before including it: as a PCH it fails
    include, src = _op(tmp_path, "#ifndef OP_READY\n#error not ready\n#endif\ninline int torch_answer() { return 1; }\n")
    (src / "op.cpp").write_text('#define OP_READY 1\n#include "op.h"\nint op_value() { return torch_answer(); }\n')
    pch = tmp_path / "pch"
    monkeypatch.setenv(op_compiler.REAL_CXX_ENV, str(CXX))
    monkeypatch.setenv(op_compiler.PCH_DIR_ENV, str(pch))
    monkeypatch.setenv(op_compiler.PCH_OPS_ENV, "op")
    assert op_compiler.main(["-DTORCH_EXTENSION_NAME=op", "-isystem", str(include), "-c", str(src / "op.cpp"), "-o", str(tmp_path / "op.o")]) == 0
    assert (tmp_path / "op.o").stat().st_size > 0 and list(pch.rglob("failed")) and not list(pch.rglob("*.gch"))
    # a real error is still the compiler's own error, from the plain compile
    (src / "bad.cpp").write_text('#include "op.h"\nint broken( { }\n')
    assert op_compiler.main(["-DTORCH_EXTENSION_NAME=op", "-isystem", str(include), "-c", str(src / "bad.cpp"), "-o", str(tmp_path / "bad.o")]) != 0


def test_install_writes_a_front_torch_calls_by_its_default_name(tmp_path: Path) -> None:
    front = op_compiler.install(tmp_path / "front", "/usr/bin/python3")
    assert front.name == "c++" and front.stat().st_mode & 0o111
    text = front.read_text()
    assert text.startswith("#!/usr/bin/python3\n") and "def main(" in text and "\nfrom eval" not in text and "\nimport eval" not in text


@needs_cxx
def test_the_build_step_leaves_the_ops_build_commands_as_a_run_writes_them(tmp_path: Path) -> None:
    """torch writes the compiler's name into each op's build.ninja and every run's load runs ninja again:
    the build step must not change that name (CXX), or each run would compile the op all over again."""
    from torch.utils.cpp_extension import get_cxx_compiler

    from eval.ops_cache import PCH_OPS, OpsCache

    cache = OpsCache(str(tmp_path / "ops"))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    extra = cache.compiler_env(tmp_path / "work", env)
    assert "CXX" not in extra and extra[op_compiler.PCH_OPS_ENV] == ",".join(PCH_OPS)
    front = Path(extra["PATH"].split(":")[0]) / "c++"
    assert shutil.which("c++", path=extra["PATH"]) == str(front) and extra[op_compiler.REAL_CXX_ENV] == shutil.which("c++", path=env["PATH"])
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CXX", raising=False)
        assert get_cxx_compiler() == "c++"
    # the front answers torch's compiler checks as the real compiler does
    probe = subprocess.run([str(front), "-v"], capture_output=True, text=True, env={**env, **extra})
    assert probe.returncode == 0 and "gcc version" in probe.stderr
    assert cache.compiler_env(tmp_path / "work2", {**env, "CXX": "clang++"}) == {}  # a chosen compiler is left alone
