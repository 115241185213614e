"""The config catalogue: every key the installed DeepSpeed reads, from its own code.

Two readers, both over the installed package, never a copy of its schema:
- the pydantic config models (types, defaults, aliases, deprecations, attribute docstrings);
- a probe that runs DeepSpeed's own `DeepSpeedConfig` over a recording dict, which lists the
  top-level and nested keys the parser reads, their defaults, and the blocks it rejects as removed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import textwrap
import typing
from collections.abc import KeysView
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from indexer.quiet import captured, logger_quiet

# top-level key -> pydantic model that parses it (class paths in the installed package)
PYDANTIC_SECTIONS: dict[str, str] = {
    "zero_optimization": "deepspeed.runtime.zero.config.DeepSpeedZeroConfig",
    "fp16": "deepspeed.runtime.precision_config.DeepSpeedFP16Config",
    "bf16": "deepspeed.runtime.precision_config.DeepSpeedBF16Config",
    "tensorboard": "deepspeed.monitor.config.TensorBoardConfig",
    "wandb": "deepspeed.monitor.config.WandbConfig",
    "csv_monitor": "deepspeed.monitor.config.CSVConfig",
    "comet": "deepspeed.monitor.config.CometConfig",
    "comms_logger": "deepspeed.comm.config.CommsLoggerConfig",
    "compile": "deepspeed.compile.config.CompileConfig",
    "hybrid_engine": "deepspeed.runtime.config.HybridEngineConfig",
    "tensor_parallel": "deepspeed.runtime.tensor_parallel.config.TPTrainingConfig",
}


@dataclass(frozen=True)
class ConfigKey:
    path: str  # dotted JSON path, e.g. zero_optimization.offload_param.device
    type: str
    default: str
    doc: str
    aliases: tuple[str, ...] = ()
    deprecated: str = ""  # the replacement or a note, when the key is deprecated
    removed: str = ""  # DeepSpeed's own message when the block is rejected as removed
    is_section: bool = False
    choices: tuple[Any, ...] = ()  # allowed values, for enum and Literal types

    @property
    def section(self) -> str:
        return self.path.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


def _type_name(annotation: Any) -> str:
    """A readable type: `bool | None`, `list[str]`, `ZeroStageEnum`."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is None:
        return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")
    if origin is typing.Union or getattr(origin, "__name__", "") == "UnionType":
        return " | ".join(_type_name(a) for a in args)
    if getattr(origin, "__name__", "") == "Literal" or str(origin) == "typing.Literal":
        return " | ".join(repr(a) for a in args)
    name = getattr(origin, "__name__", str(origin)).replace("typing.", "")
    return f"{name}[{', '.join(_type_name(a) for a in args)}]" if args else name


def _choices(annotation: Any) -> tuple[Any, ...]:
    """Allowed JSON values of an Enum or Literal annotation (None kept when Optional)."""
    import enum

    out: list[Any] = []
    for a in (annotation, *typing.get_args(annotation)):
        if inspect.isclass(a) and issubclass(a, enum.Enum):
            out += [m.value for m in a]
        elif getattr(typing.get_origin(a), "__name__", "") == "Literal" or str(typing.get_origin(a)) == "typing.Literal":
            out += list(typing.get_args(a))
    if str(typing.get_origin(annotation)) == "typing.Literal":
        out += list(typing.get_args(annotation))
    if out and type(None) in typing.get_args(annotation):
        out.append(None)
    return tuple(dict.fromkeys(out))


def _attribute_docs(cls: type) -> dict[str, str]:
    """Docstrings written under class attributes (DeepSpeed's style), read with ast."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("pydantic") or klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for prev, node in zip(body, body[1:], strict=False):
            if (
                isinstance(prev, ast.AnnAssign)
                and isinstance(prev.target, ast.Name)
                and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                docs[prev.target.id] = inspect.cleandoc(node.value.value)
    return docs


def _model_class(annotation: Any) -> type | None:
    from pydantic import BaseModel

    candidates = [annotation, *typing.get_args(annotation)]
    for c in candidates:
        if inspect.isclass(c) and issubclass(c, BaseModel):
            return c
    return None


def _walk_model(cls: type, prefix: str) -> list[ConfigKey]:
    keys: list[ConfigKey] = []
    docs = _attribute_docs(cls)
    for name, field in cls.model_fields.items():  # type: ignore[attr-defined]
        key = field.alias or name
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        deprecated = ""
        if extra.get("deprecated"):
            deprecated = str(extra.get("new_param") or "deprecated")
        default: Any = field.default
        if field.default_factory is not None:
            try:
                default = field.default_factory()  # type: ignore[call-arg]
            except TypeError:
                default = None
        sub = _model_class(field.annotation)
        default_text = "{...}" if sub is not None and hasattr(default, "model_dump") else repr(default)
        aliases = tuple(a for a in {name, key} if a != key)
        path = f"{prefix}.{key}"
        keys.append(
            ConfigKey(
                path=path,
                type=_type_name(field.annotation),
                default=default_text,
                doc=docs.get(name, field.description or ""),
                aliases=aliases,
                deprecated=deprecated,
                is_section=sub is not None,
                choices=_choices(field.annotation),
            )
        )
        if sub is not None and sub is not cls:
            keys.extend(_walk_model(sub, path))
    return keys


class _Recorder(dict):
    """A dict that notes which keys DeepSpeed's parser reads, and the defaults it passes."""

    def __init__(self, data: dict[str, Any], path: tuple[str, ...], seen: dict[tuple[str, ...], Any]):
        super().__init__(data)
        self._path = path
        self._seen = seen

    def _note(self, key: Any, default: Any = None) -> None:
        if isinstance(key, str):
            self._seen.setdefault(self._path + (key,), default)

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key, default)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self._note(key)
        return super().__contains__(key)

    def keys(self) -> Any:
        recorder = self

        class _Keys(KeysView):
            def __contains__(self, key: Any) -> bool:
                recorder._note(key)
                return dict.__contains__(recorder, key)

        return _Keys(self)


DEEPSPEED_LOGGER = "DeepSpeed"  # the name of `deepspeed.utils.logger`


@lru_cache(maxsize=1)
def logs_to_stderr() -> None:
    """DeepSpeed's logger writes to stdout; ours is for results (`--json`, MCP stdio): move it."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import logging
    import sys

    from deepspeed.utils import logger

    for handler in logger.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
            handler.setStream(sys.stderr)


def _run_parser(cfg: dict[str, Any]) -> Exception | None:
    logs_to_stderr()
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        with captured(), logger_quiet(DEEPSPEED_LOGGER):  # its warnings are about our probe's configs
            DeepSpeedConfig(cfg)
    except Exception as exc:  # noqa: BLE001 - we record what DeepSpeed says
        return exc
    return None


@dataclass(frozen=True)
class ProbeResult:
    read: dict[tuple[str, ...], Any]  # key path -> default DeepSpeed passed when reading it
    removed: dict[str, str]  # top-level key -> DeepSpeed's message when it rejects the block


def probe_parser() -> ProbeResult:
    """Run DeepSpeed's config parser over recording dicts to list what it reads."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    base = {"train_batch_size": 1}
    seen: dict[tuple[str, ...], Any] = {}
    _run_parser(_Recorder(base, (), seen))
    read = dict(seen)
    removed: dict[str, str] = {}
    for (top,) in [k for k in list(read) if len(k) == 1]:
        if top in base:
            continue
        nested: dict[tuple[str, ...], Any] = {}
        cfg = _Recorder({**base, top: _Recorder({}, (top,), nested)}, (), nested)
        exc = _run_parser(cfg)
        msg = str(exc)
        if exc is not None and "removed" in msg.lower():
            removed[top] = msg.splitlines()[0]
            continue
        for path, default in nested.items():
            if len(path) >= 2 and path[0] == top:
                read.setdefault(path, default)
    return ProbeResult(read=read, removed=removed)


def _import(path: str) -> type:
    module, _, name = path.rpartition(".")
    return typing.cast(type, getattr(importlib.import_module(module), name))


@lru_cache(maxsize=1)
def build_catalogue() -> tuple[ConfigKey, ...]:
    """Every config key of the installed deepspeed, sorted by path."""
    keys: dict[str, ConfigKey] = {}
    for section, cls_path in PYDANTIC_SECTIONS.items():
        try:
            cls = _import(cls_path)
        except (ImportError, AttributeError):
            continue
        keys[section] = ConfigKey(path=section, type="dict", default="{}", doc=inspect.cleandoc(cls.__doc__ or ""), is_section=True)
        for key in _walk_model(cls, section):
            keys.setdefault(key.path, key)
    probe = probe_parser()
    sections_with_children = {p[0] for p in probe.read if len(p) >= 2}
    for path, default in sorted(probe.read.items()):
        dotted = ".".join(path)
        if dotted in keys:
            continue
        is_section = len(path) == 1 and (path[0] in sections_with_children or path[0] in probe.removed)
        keys[dotted] = ConfigKey(
            path=dotted,
            type=type(default).__name__ if default is not None and not is_section else ("dict" if is_section else "any"),
            default=repr(default) if not is_section else "{}",
            doc="",
            removed=probe.removed.get(dotted, ""),
            is_section=is_section,
        )
    return tuple(sorted(keys.values(), key=lambda k: k.path))


def deepspeed_version() -> str:
    logs_to_stderr()
    import deepspeed

    return str(deepspeed.__version__)
