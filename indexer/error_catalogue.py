"""The error catalogue: every `raise X("...")`, `assert cond, "..."` and error/warning log call
(`logger.error(...)`, `warnings.warn(...)`; exception `logged error` / `logged warning`) in the
installed deepspeed, with its message turned into a matching pattern (f-string, %-format and .format fields become
holes), the exception type, the file and line (a GitHub URL at the installed version's tag), the
enclosing function, the condition that raises it, and the config keys or names it mentions.

Built once per deepspeed version (it reads the package source with `ast`; a few seconds) and
stored in the index as `errors.jsonl`. `app/doctor.py` matches a pasted log against it.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from indexer.config_catalogue import deepspeed_version

ERRORS_FILE = "errors.jsonl"
CATALOGUE_VERSION = 5  # what a build caches under: bumped when the catalogue holds more (2: log calls; 3: messages
# raised through a local name; 4: each message of a conditional expression, and no full stop needed; 5: the
# classes a message's own-class field can name)
GITHUB_BLOB = "https://github.com/deepspeedai/DeepSpeed/blob/v{version}/{path}#L{line}"
MIN_LITERAL = 12  # characters of fixed text a pattern needs to be usable
_HOLE = "\x00"
_OWN_CLASS = "\x01"  # a hole filled with the raising object's class name (`type(self).__name__`)
_OWN_CLASS_FIELDS = frozenset({"type(self).__name__", "self.__class__.__name__"})


@dataclass(frozen=True)
class RaisedError:
    exception: str
    template: str  # the message with {} where a value goes
    pattern: str  # a regex over the message ('' when too little fixed text to match on)
    path: str  # relative to the deepspeed package's parent: deepspeed/runtime/...
    line: int
    function: str
    condition: str  # the assert's test, or the `if` the raise sits in
    names: tuple[str, ...]  # config keys and identifiers the message and condition mention
    # the names its class-name field can take (the raising class and deepspeed's subclasses of it): a
    # message naming another class is Python's own wording, not this line's (the engine's `__getattr__`
    # raises "'DeepSpeedEngine' object has no attribute ...", never "'DummyOptim' object ...")
    classes: tuple[str, ...] = ()

    def url(self, version: str) -> str:
        return GITHUB_BLOB.format(version=version, path=self.path, line=self.line)


def _message_template(node: ast.AST) -> str | None:
    """The message of a raise/assert argument with holes for its computed parts."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str)
                       else _OWN_CLASS if isinstance(v, ast.FormattedValue) and ast.unparse(v.value) in _OWN_CLASS_FIELDS
                       else _HOLE for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = _message_template(node.left)
        return re.sub(r"%[-+ #0]*\d*(?:\.\d+)?[sdrfgixXe]", _HOLE, left) if left is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _message_template(node.left), _message_template(node.right)
        return (left if left is not None else _HOLE) + (right if right is not None else _HOLE)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        base = _message_template(node.func.value)
        return re.sub(r"\{[^{}]*\}", _HOLE, base) if base is not None else None
    return None


def _pattern(template: str, classes: tuple[str, ...] = ()) -> str:
    """`classes`: the names an own-class hole may hold (any text without)."""
    literal = template.replace(_HOLE, "").replace(_OWN_CLASS, "")
    if len(literal.strip()) < MIN_LITERAL:
        return ""
    pieces = re.split(f"({_HOLE}|{_OWN_CLASS})", template)  # text, hole, text, ...
    texts = [" ".join(p.split()) for p in pieces[::2]]
    texts[-1] = texts[-1].rstrip(".")  # a message quoted without its full stop still matches
    holes = [r"\s*(" + "|".join(map(re.escape, classes)) + r")\s*" if h == _OWN_CLASS and classes else r"\s*(.+?)\s*"
             for h in pieces[1::2]]
    fixed = [re.escape(t).replace(r"\ ", r"\s+") for t in texts]
    return fixed[0] + "".join(hole + text for hole, text in zip(holes, fixed[1:], strict=True))


def _shown(template: str) -> str:
    """A template as the catalogue shows it: every hole as `{}`, whitespace single."""
    return " ".join(template.replace(_HOLE, "{}").replace(_OWN_CLASS, "{}").split())


# error and warning log calls: a failing run often ends with one (a launcher reporting a killed rank)
_LOG_LEVELS = {"error": "error", "critical": "error", "fatal": "error", "exception": "error", "warning": "warning", "warn": "warning"}
_LOGGERS = {"logger", "log", "logging", "warnings", "_logger", "LOGGER"}
_NAME = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|\b[a-z_]+(?:\.[a-z_0-9]+)+\b")


def _assigned_messages(function: ast.AST) -> dict[str, list[tuple[int, ast.expr]]]:
    """Per local name, the message expressions assigned to it in a function, in line order
    (`msg = f"..."` then `raise X(msg)`; `msg += "..."` reads on from the one before)."""
    out: dict[str, list[tuple[int, ast.expr]]] = {}
    assignments = [n for n in ast.walk(function) if isinstance(n, ast.Assign | ast.AugAssign)]
    for node in sorted(assignments, key=lambda n: n.lineno):  # in line order: `+=` reads on from the one above
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out.setdefault(node.targets[0].id, []).append((node.lineno, node.value))
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and isinstance(node.target, ast.Name):
            before = out.get(node.target.id)
            if before:
                joined = ast.BinOp(left=before[-1][1], op=ast.Add(), right=node.value)
                out[node.target.id].append((node.lineno, joined))
    return out


def _resolved(message: ast.AST, line: int, function: ast.AST | None, assigned: dict[int, dict[str, list[tuple[int, ast.expr]]]]) -> ast.AST:
    """A message passed as a local name: the last expression assigned to it in `function` before the
    raising line (`assigned`: each function's assignments by id, read once and only when needed)."""
    if isinstance(message, ast.Name) and function is not None:
        if id(function) not in assigned:
            assigned[id(function)] = _assigned_messages(function)
        before = [value for at, value in assigned[id(function)].get(message.id, []) if at < line]
        if before:
            return before[-1]
    return message


def _alternatives(node: ast.AST) -> list[ast.AST]:
    """The messages a conditional expression chooses between (`"a" if c else "b"`), else the node."""
    if isinstance(node, ast.IfExp):
        return _alternatives(node.body) + _alternatives(node.orelse)
    return [node]


def _add_subclass(node: ast.ClassDef, children: dict[str, set[str]]) -> None:
    """Record a class under the simple names of its bases."""
    for base in node.bases:
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
        if name:
            children.setdefault(name, set()).add(node.name)


def _family(name: str, children: dict[str, set[str]]) -> tuple[str, ...]:
    """A class name and the names of its subclasses in the package (by simple name)."""
    seen, todo = {name}, [name]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return (name, *sorted(seen - {name}))


def _entries(tree: ast.AST, rel: str, children: dict[str, set[str]]) -> tuple[list[RaisedError], list[tuple[int, str]]]:
    """The module's messages, and (index, template) of those with a class-name field: their `classes`
    hold only the raising class until the whole package's subclasses are known (each class the module
    defines is recorded in `children` under its bases)."""
    out: list[RaisedError] = []
    own_class: list[tuple[int, str]] = []
    assigned: dict[int, dict[str, list[tuple[int, ast.expr]]]] = {}

    def visit(node: ast.AST, function: str, condition: str, scope: ast.AST | None, owner: str = "") -> None:
        for child in ast.iter_child_nodes(node):
            fn, cond, names_in, cls = function, condition, scope, owner
            if isinstance(child, ast.ClassDef):
                cls = child.name
                _add_subclass(child, children)
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                fn, names_in = child.name, child
            if isinstance(child, ast.If):
                cond = ast.unparse(child.test)[:200]
            message: ast.AST | None = None
            exception = ""
            if isinstance(child, ast.Raise) and isinstance(child.exc, ast.Call) and child.exc.args:
                exception = ast.unparse(child.exc.func).rsplit(".", 1)[-1]
                message = child.exc.args[0]
            elif isinstance(child, ast.Assert) and child.msg is not None:
                exception, message, cond = "AssertionError", child.msg, ast.unparse(child.test)[:200]
            elif (isinstance(child, ast.Expr) and isinstance(child.value, ast.Call) and child.value.args
                  and isinstance(child.value.func, ast.Attribute) and child.value.func.attr in _LOG_LEVELS
                  and ast.unparse(child.value.func.value).split(".")[-1] in _LOGGERS):
                exception, message = f"logged {_LOG_LEVELS[child.value.func.attr]}", child.value.args[0]
            for choice in _alternatives(_resolved(message, getattr(child, "lineno", 0), names_in, assigned)) if message is not None else []:
                template = _message_template(choice)
                if template and template.strip(_HOLE + _OWN_CLASS + " "):
                    classes = (cls,) if cls and _OWN_CLASS in template else ()
                    if classes:
                        own_class.append((len(out), template))
                    shown = _shown(template)
                    names = tuple(dict.fromkeys(_NAME.findall(shown + " " + cond)))[:8]
                    out.append(RaisedError(exception, shown[:400], _pattern(template, classes), rel, getattr(child, "lineno", 0), fn, cond,
                                           names, classes))
            visit(child, fn, cond, names_in, cls)

    visit(tree, "<module>", "", None)
    # messages kept in module constants and raised through a variable ({key: message} tables)
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                isinstance(t, ast.Name) and t.id.lstrip("_").isupper() for t in node.targets):
            table = next(t.id for t in node.targets if isinstance(t, ast.Name))
            for key, value in zip(node.value.keys, node.value.values, strict=False):
                template = _message_template(value) if value is not None else None
                if template and len(template) >= 40 and " " in template:
                    shown = _shown(template)
                    label = ast.unparse(key) if key is not None else ""
                    names = tuple(dict.fromkeys(_NAME.findall(shown)))[:8]
                    out.append(RaisedError("", shown[:400], _pattern(template), rel, getattr(value, "lineno", node.lineno), table, f"key {label}", names))
    return out, own_class


def build_error_catalogue(package_dir: Path | None = None) -> list[RaisedError]:
    """Every raise/assert message of the installed deepspeed package."""
    if package_dir is None:
        import importlib.util

        spec = importlib.util.find_spec("deepspeed")
        if spec is None or not spec.submodule_search_locations:
            return []
        package_dir = Path(next(iter(spec.submodule_search_locations)))
    entries: list[RaisedError] = []
    own_class: list[tuple[int, str]] = []  # (index in entries, template) of messages with a class-name field
    children: dict[str, set[str]] = {}
    for file in sorted(package_dir.rglob("*.py")):  # one module's tree at a time: the package's trees together take ~150 MB
        try:
            tree = ast.parse(file.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        found, own = _entries(tree, file.relative_to(package_dir.parent).as_posix(), children)
        own_class += [(len(entries) + i, template) for i, template in own]
        entries += found
    for i, template in own_class:  # the raising class's subclasses raise the message too
        family = _family(entries[i].classes[0], children)
        entries[i] = replace(entries[i], classes=family, pattern=_pattern(template, family))
    return entries


def write_error_catalogue(path: Path, entries: list[RaisedError]) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"deepspeed": deepspeed_version(), "messages": len(entries), "with_pattern": sum(1 for e in entries if e.pattern)}) + "\n")
        for e in entries:
            f.write(json.dumps(asdict(e), ensure_ascii=False) + "\n")


def read_error_catalogue(path: Path) -> tuple[dict[str, object], list[RaisedError]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    head = json.loads(lines[0]) if lines else {}
    entries = []
    for line in lines[1:]:
        row = json.loads(line)
        row["names"] = tuple(row.get("names", ()))
        row["classes"] = tuple(row.get("classes", ()))
        entries.append(RaisedError(**row))
    return head, entries
