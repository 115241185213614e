"""One DeepSpeed config option by its JSON path: type, default, meaning and doc link.

Read from the config catalogue of the installed deepspeed (its own models and parser), joined with
the config reference page of the docs when a docs checkout is at hand.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from app.errors import InvalidInput, NotFound
from app.settings import Settings
from indexer.config_catalogue import deepspeed_version
from indexer.config_check import doc_url, keys_by_path
from indexer.package_source import config_reference_prose, describe_key

_PATH = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")


@dataclass(frozen=True)
class OptionInfo:
    path: str
    type: str
    default: str
    description: str  # the catalogue's text: facts, docstring and the reference prose
    doc_url: str
    deepspeed_version: str
    deprecated: str = ""
    removed: str = ""
    children: list[str] = field(default_factory=list)  # for a section: the keys under it


def normalise_path(raw: str) -> str:
    """`zero_optimization.offload_param.device`, `/zero_optimization/offload_param/device` or
    `zero_optimization:offload_param:device` all name the same key."""
    text = raw.strip().strip("/").replace("/", ".").replace(":", ".").strip(".")
    if not text or len(text) > 200 or not _PATH.match(text):
        raise InvalidInput("give a config key as a dotted JSON path, e.g. zero_optimization.offload_param.device", field_name="path")
    return text


def docs_root(settings: Settings) -> Path | None:
    """The DeepSpeed checkout whose docs/_pages/config-json.md holds the reference prose, if any."""
    from indexer.docs_source import find_docs_root
    from indexer.fetch import current_docs_dir

    for candidate in (settings.docs_dir, current_docs_dir(settings.cache_dir)):
        if candidate is not None:
            try:
                return find_docs_root(candidate)
            except FileNotFoundError:
                continue
    return None


@lru_cache(maxsize=4)
def _prose(root: Path | None) -> dict[str, str]:
    return config_reference_prose(root)


def find_option(raw_path: str, root: Path | None = None) -> OptionInfo:
    path = normalise_path(raw_path)
    keys = keys_by_path()
    key = keys.get(path)
    if key is None:
        last = path.rsplit(".", 1)[-1]
        same_name = sorted(p for p in keys if p.rsplit(".", 1)[-1] == last)
        close = same_name or difflib.get_close_matches(path, sorted(keys), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close[:3])}?" if close else ""
        raise NotFound(f"'{path}' is not a config key deepspeed {deepspeed_version()} reads{hint}", field_name="path")
    prefix = key.path + "."
    children = sorted(p[len(prefix):] for p in keys if p.startswith(prefix) and "." not in p[len(prefix):])
    return OptionInfo(
        path=key.path,
        type=key.type,
        default=key.default,
        description=describe_key(key, _prose(root)),
        doc_url=doc_url(key.path.split(".")),
        deepspeed_version=deepspeed_version(),
        deprecated=key.deprecated,
        removed=key.removed,
        children=children,
    )
