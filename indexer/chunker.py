"""Sections to chunks: a word budget, paragraph splits, code blocks whole and kept with their prose.

Pure: documents in, (chunks, snippets) out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from indexer.documents import Block, Chunk, Document, Section, Snippet, content_hash
from indexer.snippet_kinds import classify_snippet

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\"'])")


@dataclass(frozen=True)
class ChunkBudget:
    max_words: int = 200  # prose budget of one chunk; a code block is never split
    min_words: int = 25  # a shorter trailing piece joins the chunk before it
    min_section_words: int = 40  # a shorter section joins the passage before it


def words(text: str) -> int:
    return len(text.split())


def render_block(block: Block) -> str:
    if block.kind == "code":
        return f"```{block.language}\n{block.text}\n```"
    return block.text


def _split_prose(text: str, max_words: int) -> list[str]:
    """Split one long prose block at line, then sentence boundaries, into pieces under budget."""
    if words(text) <= max_words:
        return [text]
    units: list[str] = []
    for line in text.splitlines():
        if words(line) > max_words:
            units.extend(s for s in _SENTENCE_END.split(line) if s.strip())
        else:
            units.append(line)
    pieces: list[str] = []
    current: list[str] = []
    for unit in units:
        if current and words("\n".join(current)) + words(unit) > max_words:
            pieces.append("\n".join(current))
            current = []
        current.append(unit)
    if current:
        pieces.append("\n".join(current))
    return pieces


def _units(section: Section, budget: ChunkBudget) -> list[list[Block]]:
    """Group blocks so that each code block stays with the prose just before it."""
    units: list[list[Block]] = []
    for block in section.blocks:
        if block.kind == "code" and units and units[-1][-1].kind == "text":
            units[-1].append(block)
        elif block.kind == "code" and units and units[-1][-1].kind == "code":
            units[-1].append(block)
        elif block.kind == "text" and words(block.text) > budget.max_words:
            units.extend([[Block(kind="text", text=p)] for p in _split_prose(block.text, budget.max_words)])
        else:
            units.append([block])
    return units


def _pack(units: list[list[Block]], budget: ChunkBudget) -> list[list[Block]]:
    groups: list[list[Block]] = []
    size = 0
    for unit in units:
        n = sum(words(b.text) for b in unit)
        if groups and size + n <= budget.max_words:
            groups[-1].extend(unit)
            size += n
        elif groups and n < budget.min_words and not any(b.kind == "code" for b in unit):
            groups[-1].extend(unit)  # a short tail is better inside its neighbour than alone
            size += n
        else:
            groups.append(list(unit))
            size = n
    return groups


def chunk_document(doc: Document, budget: ChunkBudget | None = None) -> tuple[list[Chunk], list[Snippet]]:
    budget = budget or ChunkBudget()
    chunks: list[Chunk] = []
    snippets: list[Snippet] = []
    topic = str(doc.meta.get("topic", ""))
    for section in doc.sections:
        url = f"{doc.url}#{section.anchor}" if section.anchor else doc.url
        for group in _pack(_units(section, budget), budget):
            text = "\n\n".join(render_block(b) for b in group).strip()
            if not text:
                continue
            prev = chunks[-1] if chunks and chunks[-1].path == doc.path else None
            if prev is not None and words(text) < budget.min_section_words and words(prev.text) + words(text) <= budget.max_words:
                # a tiny section reads best inside the passage before it, under its own heading
                merged = f"{prev.text}\n\n{section.heading}:\n{text}" if section.heading else f"{prev.text}\n\n{text}"
                merged_id = content_hash(doc.path, prev.url, merged)
                moved = [sn for sn in snippets if sn.chunk_id == prev.id]
                for block in (b for b in group if b.kind == "code"):
                    moved.append(make_snippet(block, chunk_id=merged_id, source_url=url, path=doc.path))
                snippets[:] = [sn for sn in snippets if sn.chunk_id != prev.id]
                for sn in moved:
                    sn.chunk_id = merged_id
                snippets.extend(moved)
                chunks[-1] = Chunk(
                    id=merged_id, text=merged, path=prev.path, url=prev.url, title=prev.title, heading=prev.heading,
                    trail=prev.trail, source=prev.source, topic=prev.topic, snippet_ids=tuple(sn.id for sn in moved),
                )
                continue
            chunk_id = content_hash(doc.path, section.anchor, text)
            ids: list[str] = []
            for block in group:
                if block.kind != "code":
                    continue
                snippet = make_snippet(block, chunk_id=chunk_id, source_url=url, path=doc.path)
                ids.append(snippet.id)
                snippets.append(snippet)
            chunks.append(
                Chunk(
                    id=chunk_id,
                    text=text,
                    path=doc.path,
                    url=url,
                    title=doc.title,
                    heading=section.heading or doc.title,
                    trail=section.trail,
                    source=doc.source,
                    topic=topic,
                    snippet_ids=tuple(ids),
                )
            )
    return chunks, snippets


def make_snippet(block: Block, *, chunk_id: str, source_url: str, path: str) -> Snippet:
    attrs = dict(block.attrs)
    requires = tuple(r for r in attrs.get("requires", "").split(",") if r)
    kind, language = classify_snippet(block.text, block.language)
    return Snippet(
        id=content_hash(block.text, length=12),
        language=language,
        kind=kind,
        code=block.text,
        chunk_id=chunk_id,
        source_url=source_url,
        path=path,
        requires=requires,
    )
