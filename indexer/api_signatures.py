"""Which keyword arguments the installed deepspeed's public functions take, and their defaults.

A question that passes an argument the function never had (`deepspeed.initialize(..., seed=1234)`,
`engine.save_checkpoint(dir, tag, tokenizer=tok)`) asks about something the docs cannot cover, and the
one true answer is that the installed deepspeed has no such argument. The table is read with `inspect`
from the members the API pages document (`indexer/package_source.api_signatures`: the functions, the
classes' constructors and their listed methods) when the index is built, and is stored in the index as
SIGNATURES_FILE, so the search needs no deepspeed import. A question asking which arguments a function
takes is answered with them in call form, each type and default beside its name (`call_form`).
"""

from __future__ import annotations

import enum
import inspect
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIGNATURES_FILE = "signatures.json"


@dataclass(frozen=True)
class Signature:
    qualified: str  # deepspeed.runtime.engine.DeepSpeedEngine.save_checkpoint
    parameters: tuple[str, ...]  # the names a call may pass by keyword
    any_keyword: bool  # it takes **kwargs: every keyword is accepted
    # the defaults of the parameters that have one, as written in a call (`default_text`); a parameter
    # without an entry is required
    defaults: tuple[tuple[str, str], ...] = ()
    # the annotated types that say something short (`annotation_text`): "int", "Optional[str]"
    annotations: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return self.qualified.rsplit(".", 1)[-1]


def signature_of(obj: Any, qualified: str) -> Signature | None:
    """None when inspect cannot read it (a builtin, a C extension)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.POSITIONAL_ONLY]
    if params and params[0].name in ("self", "cls") and not inspect.isclass(obj):
        params = params[1:]  # a method read from its class
    named = [p for p in params if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    defaults = tuple((p.name, default_text(p.default)) for p in named if p.default is not inspect.Parameter.empty)
    annotations = tuple((p.name, text) for p in named if (text := annotation_text(p.annotation)))
    return Signature(qualified, tuple(p.name for p in named), any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
                     defaults, annotations)


DEFAULT_CHARS = 40  # a longer default's text is shown as "..."


def default_text(value: Any) -> str:
    """A default as a reader writes it in a call: a plain value (None, a bool, a number, a short string, an
    empty dict, list or tuple) as Python writes it, an enum's member by its class and name (`OffloadDeviceEnum.cpu`, never
    its repr "<OffloadDeviceEnum.cpu: 'cpu'>"); anything else ("<function checkpoint at 0x7f...>", an object, a long string)
    as "...", which says only that the argument may be left out."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if value is None or isinstance(value, bool | int | float | str) or (type(value) in (dict, list, tuple) and not value):
        text = repr(value)
        return text if len(text) <= DEFAULT_CHARS else "..."
    return "..."


ANNOTATION_CHARS = 30  # a longer type ("Union[Optimizer, Callable[[Union[Iterable[Parameter], ...") is left out
_MODULE_PATH = re.compile(r"\b(?:[A-Za-z_][A-Za-z0-9_]*\.)+(?=[A-Za-z_])")  # "torch.nn.modules.module." of a class's name
_SAYS_NOTHING = frozenset({"Any", "object"})


def written_type(annotation: Any) -> str:
    """An annotation as a reader writes it, classes by their own names: "Optional[Module]" for
    `typing.Optional[torch.nn.modules.module.Module]`, "None" for NoneType ("" for none)."""
    if annotation is inspect.Parameter.empty:
        return ""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return _MODULE_PATH.sub("", text.replace("NoneType", "None")).strip()


def annotation_text(annotation: Any) -> str:
    """A parameter's annotated type as `written_type` gives it ("Module", "Optional[str]", "int"); "" for none, for
    `Any`, and for a type longer than ANNOTATION_CHARS (its full form is on the API page)."""
    text = written_type(annotation)
    return "" if text in _SAYS_NOTHING or len(text) > ANNOTATION_CHARS else text


def call_form(sig: Signature) -> str:
    """The parameters as a call may pass them, the type and the default beside the ones that have one:
    "`save_dir`, `tag=None`, `distributed_port: int = 29500`" (PEP 8's spacing once a type is written)."""
    defaults, types = dict(sig.defaults), dict(sig.annotations)

    def one(p: str) -> str:
        if p in types:
            return f"`{p}: {types[p]} = {defaults[p]}`" if p in defaults else f"`{p}: {types[p]}`"
        return f"`{p}={defaults[p]}`" if p in defaults else f"`{p}`"

    return ", ".join(one(p) for p in sig.parameters)


def write_signatures(path: Path, signatures: Iterable[Signature]) -> None:
    rows = [{"qualified": s.qualified, "parameters": list(s.parameters), "any_keyword": s.any_keyword, "defaults": dict(s.defaults),
             "annotations": dict(s.annotations)}
            for s in signatures]
    path.write_text(json.dumps(rows, indent=0), encoding="utf-8")


@dataclass(frozen=True)
class ApiSignatures:
    """The table, by a function's own name (`save_checkpoint`); empty for an index built without one."""

    by_name: dict[str, tuple[Signature, ...]] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> ApiSignatures:
        if not path.is_file():
            return cls()
        by_name: dict[str, list[Signature]] = {}
        for row in json.loads(path.read_text(encoding="utf-8")):
            # an index built before stop 63 has no defaults, before stop 64 no annotations
            defaults = tuple((str(k), str(v)) for k, v in row.get("defaults", {}).items())
            annotations = tuple((str(k), str(v)) for k, v in row.get("annotations", {}).items())
            sig = Signature(str(row["qualified"]), tuple(str(p) for p in row["parameters"]), bool(row["any_keyword"]), defaults,
                            annotations)
            by_name.setdefault(sig.name, []).append(sig)
        return cls({k: tuple(v) for k, v in by_name.items()})

    def unaccepted(self, callee: str, keyword: str) -> Signature | None:
        """The signature `callee` names when none of the functions it can mean takes `keyword`, else
        None. `callee` is the call as written (`deepspeed.zero.Init`, `engine.save_checkpoint`). Only
        names a reader would not take for another library's are judged: one written under `deepspeed.`,
        or a compound name (`save_checkpoint`); `step(...)` or `train(...)` may be anybody's."""
        name = callee.rsplit(".", 1)[-1]
        candidates = self.by_name.get(name, ())
        if not candidates or not (callee.startswith("deepspeed.") or "_" in name):
            return None
        if callee.startswith("deepspeed."):
            exact = [s for s in candidates if s.qualified == callee]
            candidates = tuple(exact) or candidates
        if any(s.any_keyword or keyword in s.parameters for s in candidates):
            return None
        return candidates[0]
