"""Static checks of snippets against the installed deepspeed.

ds_config: parsed (JSON, JSON with comments or trailing commas, Python dict literals), fragments
merged into a minimal base, validated by `config_check`. python: parsed with ast and every
`deepspeed.` import and attribute chain resolved in the installed package. launcher: `deepspeed`
lines parsed by DeepSpeed's own launcher parser. hostfile: `host slots=N` lines.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import re
import shlex
import textwrap
from collections.abc import Iterable
from dataclasses import replace
from functools import lru_cache
from typing import Any

from indexer.config_catalogue import deepspeed_version
from indexer.config_check import validate_config
from indexer.documents import Snippet

_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu")
_PLACEHOLDER = re.compile(r"\.\.\.|…|<[A-Za-z_ ]+>|\bYOUR_\w+")
_LAUNCH_PLACEHOLDER = re.compile(r"<[^>]+>|\$\{?\w+\}?")  # <num_gpus>, $NNODES, ${N}
_HOSTFILE = re.compile(r"^[\w.\-]+\s+slots\s*=\s*\d+\s*$")


def parse_config_text(code: str) -> tuple[Any, bool]:
    """(parsed value, is_fragment); raises ValueError when it cannot be read at all."""
    body = code.strip()
    if "=" in body.split("{", 1)[0]:
        body = body.split("=", 1)[1].strip()
    fragment = bool(_PLACEHOLDER.search(body))
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", body, flags=re.S)
    text = re.sub(r"^\s*#[^\n]*", "", text, flags=re.M)
    text = _PLACEHOLDER.sub("", text)
    text = re.sub(r",(\s*[}\]])", r"\1", text)
    text = re.sub(r",\s*,", ",", text)
    if not text.lstrip().startswith("{"):  # a bare '"key": {...}' excerpt
        text, fragment = "{" + text.strip().rstrip(",") + "}", True
    for loader in (json.loads, ast.literal_eval):
        try:
            return loader(text), fragment
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    try:  # Python dicts with True/False/None spelled the JSON way
        fixed = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", re.sub(r"\bnull\b", "None", text)))
        return ast.literal_eval(fixed), fragment
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise ValueError(f"not a readable config: {exc}") from exc


def check_ds_config(code: str) -> tuple[str, str]:
    try:
        cfg, fragment = parse_config_text(code)
    except ValueError as exc:
        return ("fragment", str(exc)) if _PLACEHOLDER.search(code) else ("failed", str(exc))
    if not isinstance(cfg, dict):
        return "failed", "not a JSON object"
    if not any(k in cfg for k in _BATCH_KEYS):
        fragment = True
        cfg = {"train_micro_batch_size_per_gpu": 1, **cfg}
    result = validate_config(cfg)
    if result.errors:
        first = result.errors[0]
        return "failed", f"{first.pointer or '/'}: {first.message}" + (f" ({first.suggestion})" if first.suggestion else "")
    return ("fragment" if fragment else "ok"), "partial config, valid once merged into a minimal base" if fragment else ""


@lru_cache(maxsize=4096)
def resolve_symbol(dotted: str) -> str | None:
    """None when `deepspeed.a.b.c` exists in the installed package, else what is missing."""
    parts = dotted.split(".")
    obj: Any = None
    for cut in range(len(parts), 0, -1):
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        except Exception:  # noqa: BLE001 - a module that fails to import on this machine is not "missing"
            return None
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                try:
                    obj = importlib.import_module(f"{obj.__name__}.{attr}") if hasattr(obj, "__path__") else None
                except Exception:  # noqa: BLE001
                    obj = None
                if obj is None:
                    return f"{dotted} (no '{attr}' in the installed deepspeed {deepspeed_version()})"
            else:
                obj = getattr(obj, attr)
        return None
    return f"{dotted} (no module '{parts[0]}')"


def _deepspeed_names(tree: ast.AST) -> Iterable[str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "deepspeed":
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else "deepspeed"
                    yield a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "deepspeed" and node.level == 0:
            for a in node.names:
                if a.name != "*":
                    yield f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain: list[str] = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in aliases:
                yield ".".join([aliases[cur.id], *reversed(chain)])


def check_python(code: str) -> tuple[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(code))
    except SyntaxError as exc:  # doc excerpts: a method body, a call with '...', a console session
        return "fragment", f"an excerpt, not complete Python (line {exc.lineno}: {exc.msg})"
    names = sorted(set(_deepspeed_names(tree)))
    # an attribute chain's prefix that resolves is enough for the longest names (methods on classes)
    missing = [m for m in (resolve_symbol(n) for n in names) if m]
    if missing:
        return "failed", "missing in deepspeed: " + "; ".join(missing[:3])
    return "ok", f"{len(names)} deepspeed names resolved" if names else "parses; uses no deepspeed names"


@lru_cache(maxsize=1)
def _launcher_parser() -> Any:
    from deepspeed.launcher.runner import parse_args

    return parse_args


def check_launcher(code: str) -> tuple[str, str]:
    lines = [line.strip().rstrip("\\").strip() for line in code.replace("\\\n", " ").splitlines()]
    checked = 0
    fragment = False
    for line in lines:
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line.lstrip("$ "))
        except ValueError as exc:
            return "failed", f"cannot split the command line: {exc}"
        placeholders = [w for w in words if _LAUNCH_PLACEHOLDER.search(w)]
        words = [_LAUNCH_PLACEHOLDER.sub("1", w) for w in words]
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words.pop(0)
        if not words or words[0] != "deepspeed":
            continue
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                _launcher_parser()(words[1:])
        except SystemExit:
            message = err.getvalue().strip().splitlines()
            return "failed", (message[-1] if message else "rejected by deepspeed's launcher parser")[:300]
        checked += 1
        fragment = fragment or bool(placeholders)
    if not checked:
        return "not_checkable", "no `deepspeed` launcher line (torchrun, srun and mpirun are not DeepSpeed's parser)"
    if fragment:
        return "fragment", "placeholders filled in; accepted by deepspeed's launcher parser"
    return "ok", f"{checked} launcher line(s) accepted by deepspeed's parser"


def check_hostfile(code: str) -> tuple[str, str]:
    bad = [line for line in code.splitlines() if line.strip() and not line.strip().startswith("#") and not _HOSTFILE.match(line.strip())]
    return ("failed", f"not 'host slots=N': {bad[0]!r}") if bad else ("ok", "")


def check_snippet(snippet: Snippet) -> Snippet:
    checkers = {"ds_config": check_ds_config, "python": check_python, "launcher": check_launcher, "hostfile": check_hostfile}
    checker = checkers.get(snippet.kind)
    if checker is None:
        status, reason = "not_checkable", f"{snippet.kind} snippets have no static check"
    else:
        try:
            status, reason = checker(snippet.code)
        except Exception as exc:  # noqa: BLE001 - one odd snippet must not stop a build
            status, reason = "not_checkable", f"checker error: {type(exc).__name__}: {exc}"[:300]
    return replace(snippet, status=status, reason=reason, checked_with=deepspeed_version())
