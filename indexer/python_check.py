"""The static check of a Python snippet against the installed deepspeed: names resolve, calls bind.

- REPL sessions (`>>> ` / `... ` prompts) are read as the code they typed; printed output is dropped.
- Every deepspeed name is found, imported (`from deepspeed.x import y as z`, `import deepspeed as ds`)
  or written in full (`deepspeed.checkpointing.foo` in a fragment that never imports deepspeed),
  and resolved in the installed package; a missing one fails, named with its line.
- Every call of a deepspeed callable is bound against its real signature (`inspect.signature(...)
  .bind`) with the call's positional count and keyword names: a failure names the call, the
  signature and the line. Classes bind their constructor, so a config class's keywords are checked.
- Placeholders (`<path>`, `YOUR_...`, `...` given as an argument) make it a `template`.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import io
import re
import textwrap
import tokenize
from collections import Counter, OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from indexer.api_signatures import written_type
from indexer.config_catalogue import deepspeed_version
from indexer.quiet import captured
from indexer.snippet_status import CHECKED, FAILS, NOT_CHECKED, TEMPLATE

_PROMPT = re.compile(r"^(>>>|\.\.\.)( |$)")
_PLACEHOLDER_TEXT = re.compile(r"<[A-Za-z_][\w \-/.]*>|\bYOUR_[A-Z_]+\b|\[[\w\-]+(?:\|[\w\-]+)+\]")
_MISSING = object()


def _inside_brackets(statement: str) -> bool:
    """Whether a typed statement stops inside an open bracket or string (more lines belong to it)."""
    try:
        for _ in tokenize.generate_tokens(io.StringIO(statement + "\n").readline):
            pass
    except (tokenize.TokenError, SyntaxError):
        return True
    return False


def strip_repl(code: str) -> str | None:
    """The code typed into a `>>>` session (prompts removed, output lines dropped), or None. A line
    without a prompt after a call left open (pages often drop the `...` prompts of a wrapped call) is
    part of that call, not output."""
    lines = code.strip("\n").splitlines()
    if not lines or not any(line.startswith(">>>") for line in lines):
        return None
    typed: list[str] = []
    statement: list[str] = []
    for line in lines:
        if line.startswith(">>>"):
            statement = [_PROMPT.sub("", line)]
        elif _PROMPT.match(line) or (statement and _inside_brackets("\n".join(statement))):
            statement.append(_PROMPT.sub("", line))
        else:
            statement = []
            continue
        typed.append(statement[-1])
    return "\n".join(typed)


def printed_output_cut(code: str) -> tuple[str, int] | None:
    """Code that prints, followed by what it printed pasted without prompts (`total params: 737.67M`):
    (the code alone, the first output line's number), or None when the text is not that shape. The
    code must parse and print; every output line must fail to parse as Python on its own."""
    lines = code.splitlines()
    try:
        ast.parse(code)
        return None
    except SyntaxError as exc:
        first = exc.lineno or 0
    head, tail = "\n".join(lines[:first - 1]), [line for line in lines[first - 1:] if line.strip()]
    if first < 2 or not tail or "print(" not in head:
        return None
    try:
        ast.parse(head)
    except SyntaxError:
        return None
    for line in tail:
        if _CODE_START.match(line):
            return None
        try:
            ast.parse(line.strip())
            return None
        except SyntaxError:
            continue
    return head, first


# a line that begins a statement (an assignment, a call, a keyword), cut off or not: never output
_CODE_START = re.compile(r"\s*(?:[\w.]+(?:\[[^\]]*\])?\s*[-+*/]?=(?!=)|[\w.]+\(|(?:def|class|for|while|if|elif|else|with|return|import|from|try|except)\b)")


@lru_cache(maxsize=4096)
def _resolve(dotted: str) -> Any:
    """The object `deepspeed.a.b` names in the installed package, _MISSING when it has none, None
    when a module on the way fails to import on this machine (not the snippet's fault)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            with captured(stderr=True):
                obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        except Exception:  # noqa: BLE001 - an import that fails here (a CUDA-only op) is not "missing"
            return None
        for attr in parts[cut:]:
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
                continue
            if not hasattr(obj, "__path__"):
                return _MISSING
            try:
                obj = importlib.import_module(f"{obj.__name__}.{attr}")
            except ModuleNotFoundError:
                return _MISSING
            except Exception:  # noqa: BLE001
                return None
        return obj
    return _MISSING


@dataclass(frozen=True)
class Problem:
    line: int
    message: str


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the deepspeed dotted name it stands for; `deepspeed` itself always does unless
    the snippet binds the name to something else."""
    aliases: dict[str, str] = {"deepspeed": "deepspeed"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "deepspeed":
                    aliases[a.asname or "deepspeed"] = a.name if a.asname else "deepspeed"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "deepspeed":
            for a in node.names:
                if a.name != "*":
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == "deepspeed":
            aliases.pop("deepspeed", None)
    return aliases


PUBLIC_NAMESPACES = ("deepspeed", "deepspeed.utils")  # where a name a fragment never imports is looked up


def bound_names(tree: ast.AST) -> set[str]:
    """Names the snippet binds itself (assignments, imports, defs, arguments, loop targets)."""
    bound: set[str] = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            bound.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return bound


def _unimported_deepspeed_names(tree: ast.AST, aliases: dict[str, str]) -> dict[str, str]:
    """Calls of names the fragment takes from its page without importing them, that deepspeed's
    public namespaces define (`safe_get_full_optimizer_state(...)` after an earlier import)."""
    bound = bound_names(tree)
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name in bound or name in aliases or name in found:
                continue
            for space in PUBLIC_NAMESPACES:
                obj = _resolve(f"{space}.{name}")
                if obj is not None and obj is not _MISSING and callable(obj):
                    found[name] = f"{space}.{name}"
                    break
    return found


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    chain: list[str] = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *reversed(chain)])
    return None


def _signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


@lru_cache(maxsize=2048)
def _always_raises(obj: Any) -> str:
    """The exception a deepspeed function raises before doing anything else (a removed API kept as
    a stub that only raises), '' otherwise."""
    func = getattr(obj, "__func__", obj)
    if not inspect.isfunction(func):
        return ""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return ""
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return ""
    body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str))]
    if body and isinstance(body[0], ast.Raise) and body[0].exc is not None:
        return ast.unparse(body[0].exc)[:160]
    return ""


_RETURNS = re.compile(r"^\s*Returns?:?\s*$(.*?)(?:^\s*$|\Z)", re.M | re.S)  # a docstring's Returns section, to its blank line
_DICT_WORDS = re.compile(r"``state_dict``|\bstate_dict\b|\bdict\b|\bOrderedDict\b")
_DICT_ATTRIBUTES = frozenset(dir(OrderedDict))  # a dict's, and OrderedDict's own (move_to_end)


@lru_cache(maxsize=2048)
def _returns_dict(obj: Any) -> bool:
    """Whether a deepspeed function says it returns a dict: its return annotation (dict, Dict[...], OrderedDict,
    Mapping), or its docstring's Returns section naming a `state_dict` or a dict."""
    sig = _signature(obj) if callable(obj) and not inspect.isclass(obj) else None
    if sig is None:
        return False
    if returned := written_type(sig.return_annotation):
        return bool(re.match(r"(?:dict|Dict|OrderedDict|Mapping)\b", returned))
    returns = _RETURNS.search(inspect.getdoc(obj) or "")
    return bool(returns and _DICT_WORDS.search(returns.group(1)))


def _dict_misuse(tree: ast.AST, aliases: dict[str, str]) -> list[Problem]:
    """`x.item()` on a name bound once to what a deepspeed function returns as a dict (zero_to_fp32's
    `get_fp32_state_dict_from_zero_checkpoint`): an attribute no dict has fails when run."""
    stores = Counter(n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    problems: list[Problem] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call)):
            continue
        name = node.targets[0].id
        if stores[name] != 1:  # bound again somewhere: which value an attribute is read on is not followed
            continue
        func = node.value.func
        called = _dotted(func, aliases) if isinstance(func, ast.Attribute | ast.Name) else None
        obj = _resolve(called) if called else None
        if obj is None or obj is _MISSING or not _returns_dict(obj):
            continue
        for use in ast.walk(tree):
            if isinstance(use, ast.Attribute) and isinstance(use.value, ast.Name) and use.value.id == name and use.attr not in _DICT_ATTRIBUTES:
                problems.append(Problem(use.lineno, f"`{name}.{use.attr}`: `{name}` is the dict `{called}` returns in deepspeed "
                                                    f"{deepspeed_version()}, and a dict has no `{use.attr}`"))
    return problems


def _bind_problem(name: str, obj: Any, call: ast.Call) -> str:
    if not callable(obj) or any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return ""
    sig = _signature(obj)
    if sig is None:
        return ""
    args = [object()] * len(call.args)
    kwargs = {k.arg: object() for k in call.keywords if k.arg}
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        written = ast.unparse(call)
        written = written if len(written) <= 70 else written[:67] + "..."
        shown = f"{name.rsplit('.', 1)[-1]}{sig}"
        shown = shown if len(shown) <= 100 else f"{name.rsplit('.', 1)[-1]}({', '.join(sig.parameters)[:80]}...)"
        return f"`{written}` does not match `{shown}` in deepspeed {deepspeed_version()}: {exc}"
    return ""


def python_problems(tree: ast.AST) -> tuple[list[Problem], int]:
    """Missing names and calls that do not bind, and how many deepspeed names were looked at."""
    aliases = _aliases(tree)
    aliases.update(_unimported_deepspeed_names(tree, aliases))
    problems: list[Problem] = []
    seen: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "deepspeed":
            for a in node.names:
                if a.name != "*" and _resolve(f"{node.module}.{a.name}") is _MISSING:
                    problems.append(Problem(node.lineno, f"`from {node.module} import {a.name}`: no such name in deepspeed {deepspeed_version()}"))
                seen.add(f"{node.module}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "deepspeed" and _resolve(a.name) is _MISSING:
                    problems.append(Problem(node.lineno, f"`import {a.name}`: no such module in deepspeed {deepspeed_version()}"))
                seen.add(a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_parent_attr", None), ast.Attribute):
            name = _dotted(node, aliases)
            if name is None or name in seen:
                continue
            seen.add(name)
            if _resolve(name) is _MISSING:
                problems.append(Problem(node.lineno, f"`{name}` does not exist in deepspeed {deepspeed_version()}"))
        elif isinstance(node, ast.Call):
            name = _dotted(node.func, aliases) if isinstance(node.func, ast.Attribute | ast.Name) else None
            if name is None or name == "deepspeed":
                continue
            obj = _resolve(name)
            if obj is None or obj is _MISSING:
                continue
            message = _bind_problem(name, obj, node)
            raised = _always_raises(obj) if not message else ""
            if raised:
                message = f"`{name}` only raises in deepspeed {deepspeed_version()}: {raised}"
            if message:
                problems.append(Problem(node.lineno, message))
    problems += _dict_misuse(tree, aliases)
    unique = {(p.line, p.message): p for p in problems}
    return sorted(unique.values(), key=lambda p: p.line), len(seen)


def _mark_parents(tree: ast.AST) -> None:
    """Only the longest attribute chain is resolved: `a.b.c` once, not also `a.b`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            node.value._parent_attr = node  # type: ignore[attr-defined]


def has_placeholders(code: str, tree: ast.AST | None) -> bool:
    if _PLACEHOLDER_TEXT.search(code):
        return True
    if tree is None:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            values = [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(v, ast.Constant) and v.value is Ellipsis for v in values):
                return True
    return False


def check_python(code: str) -> tuple[str, str]:
    typed = strip_repl(code)
    source = textwrap.dedent(typed if typed is not None else code)
    try:
        tree = ast.parse(source)
        compile(tree, "<snippet>", "exec")  # what only the compiler refuses: 'return' or 'yield' outside a function
    except SyntaxError as exc:  # a method body, a call with '...' in its text, a signature line
        if has_placeholders(source, None):
            return TEMPLATE, f"has placeholders and is not complete Python (line {exc.lineno}: {exc.msg})"
        return NOT_CHECKED, f"an excerpt, not complete Python (line {exc.lineno}: {exc.msg})"
    _mark_parents(tree)
    problems, names = python_problems(tree)
    if problems:
        first = "; ".join(f"line {p.line}: {p.message}" for p in problems[:3])
        return FAILS, first
    session = "a >>> session; " if typed is not None else ""
    if has_placeholders(source, tree):
        return TEMPLATE, f"{session}placeholders to fill in; {names} deepspeed names resolve and calls bind"
    if not names:
        return NOT_CHECKED, f"{session}parses, but uses no deepspeed names to check"
    return CHECKED, f"{session}{names} deepspeed names resolve and their calls bind"
