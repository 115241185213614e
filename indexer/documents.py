"""The small dataclasses that flow through the indexer: blocks, sections, chunks, snippets.

Everything here is pure data; parsing, chunking and storage live in their own modules.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

BlockKind = Literal["text", "code"]


def content_hash(*parts: str, length: int = 16) -> str:
    """A stable short id for a piece of content (sha256 over the parts)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:length]


@dataclass(frozen=True)
class Block:
    """One block of a parsed document: prose (already cleaned) or a whole code block."""

    kind: BlockKind
    text: str
    language: str = ""  # for code blocks: the info string's first word ("" when none)
    attrs: tuple[tuple[str, str], ...] = ()  # extra key=value words of the info string


@dataclass
class Section:
    """The blocks under one heading, with the trail of headings above it."""

    heading: str  # the nearest heading ("" before the first one)
    trail: tuple[str, ...]  # headings from the top down, the page title first
    anchor: str  # the public anchor of the nearest heading ("" when none)
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Document:
    """One source document after parsing."""

    path: str  # repository-relative path, e.g. docs/_tutorials/zero.md
    title: str
    url: str  # public URL without anchor
    source: str  # docs | api | config | notes
    sections: list[Section]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Chunk:
    """The unit that is embedded, indexed and returned as a passage."""

    id: str
    text: str  # readable passage text (prose and code, noise removed)
    path: str
    url: str  # public URL with the heading anchor
    title: str
    heading: str
    trail: tuple[str, ...]
    source: str
    topic: str = ""
    snippet_ids: tuple[str, ...] = ()

    @property
    def search_text(self) -> str:
        """What the retrievers see: the heading trail followed by the passage."""
        return " > ".join(t for t in self.trail if t) + "\n" + self.text

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["trail"] = list(self.trail)
        d["snippet_ids"] = list(self.snippet_ids)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Chunk:
        d = dict(d)
        d["trail"] = tuple(d.get("trail", ()))
        d["snippet_ids"] = tuple(d.get("snippet_ids", ()))
        return cls(**d)


@dataclass
class Snippet:
    """A code block taken from a source, with what we know about it."""

    id: str
    language: str
    kind: str  # ds_config | python | launcher | hostfile | shell | yaml | output | other
    code: str
    chunk_id: str
    source_url: str
    path: str
    requires: tuple[str, ...] = ()
    status: str = "not_checked"  # indexer/snippet_status.py: checked | template | fails | not_checked
    reason: str = ""
    checked_with: str = ""  # deepspeed version the static check ran against

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["requires"] = list(self.requires)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Snippet:
        d = dict(d)
        d["requires"] = tuple(d.get("requires", ()))
        return cls(**d)
