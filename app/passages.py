"""A hit's passage: its chunk grown with the neighbouring chunks of its page, within its own section,
then that section's subsections, then its parent section, while the words fit a budget.

One passage per section span: the retriever skips a chunk already inside a passage it took. A part
from another section than the one before it opens with that section's heading (`PART_OPENER`), which
the MCP excerpt and the web page read back.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from indexer.documents import Chunk

# how a passage opens a part from another section than the one before it (`PassageSpans.passage`);
# the MCP excerpt reads it back with PART_HEADING, the web page's script with the same pattern
PART_OPENER = "### "
PART_HEADING = re.compile(rf"^{re.escape(PART_OPENER)}(.+)$", re.M)


def heading_of(chunk: Chunk) -> str:
    return chunk.trail[-1] if chunk.trail else chunk.title


def section_of(chunk: Chunk) -> tuple[str, tuple[str, ...]]:
    """A chunk's section: its page and heading trail."""
    return chunk.path, chunk.trail


def _same_section(a: Chunk, b: Chunk) -> bool:
    return section_of(a) == section_of(b)


def _under_headings(a: Chunk, b: Chunk, n: int) -> bool:
    """`b` is on `a`'s page, under the first `n` headings of `a`'s trail."""
    return (a.path, a.source) == (b.path, b.source) and b.trail[:n] == a.trail[:n]


def _in_subsection(a: Chunk, b: Chunk) -> bool:
    """`b` is in `a`'s section or one of its subsections (same page)."""
    return _under_headings(a, b, len(a.trail))


def _in_parent(a: Chunk, b: Chunk) -> bool:
    """`b` is in the section that holds `a`'s (its page for a top-level section)."""
    return _under_headings(a, b, max(len(a.trail) - 1, 1))


# how far a passage may grow from its chunk (`RetrievalOptions.passage_scopes`); chosen on tune's
# cross-validated ranker: section alone MRR@10 0.793, then subsections and parent 0.806
PASSAGE_SCOPES: dict[str, Callable[[Chunk, Chunk], bool]] = {
    "section": _same_section, "subsections": _in_subsection, "parent": _in_parent}


class PassageSpans:
    """Each chunk's span (the chunk and the neighbours it grows into) and its passage, remembered per
    chunk. `words[i]`: chunk i's word count (the headings a passage adds are not counted)."""

    def __init__(self, chunks: Sequence[Chunk], words: Sequence[int], section_words: int, scopes: tuple[str, ...]):
        self.chunks, self.words = chunks, words
        self.section_words, self.scopes = section_words, scopes
        self._spans: dict[int, tuple[int, ...]] = {}

    def span(self, idx: int) -> tuple[int, ...]:
        """The chunk and its neighbours on its page, grown outwards within each scope in turn while the
        words fit `section_words` (the chunk alone when off or when nothing fits)."""
        if idx not in self._spans:
            self._spans[idx] = self._grow_span(idx)
        return self._spans[idx]

    def _grow_span(self, idx: int) -> tuple[int, ...]:
        if self.section_words <= 0:
            return (idx,)
        lo, hi, words = idx, idx, self.words[idx]
        for scope in self.scopes:
            lo, hi, words = self._grow(idx, lo, hi, words, PASSAGE_SCOPES[scope])
        return tuple(range(lo, hi + 1))

    def _grow(self, idx: int, lo: int, hi: int, words: int, inside: Callable[[Chunk, Chunk], bool]) -> tuple[int, int, int]:
        """The span `lo..hi` grown by one chunk at each end in turn while the next is `inside` the scope
        of chunk `idx` and the words fit."""
        chunks = self.chunks
        while True:
            grown = False
            for j in (hi + 1, lo - 1):
                if 0 <= j < len(chunks) and inside(chunks[idx], chunks[j]) and words + self.words[j] <= self.section_words:
                    words += self.words[j]
                    lo, hi = min(lo, j), max(hi, j)
                    grown = True
            if not grown:
                return lo, hi, words

    def passage(self, idx: int) -> Chunk:
        """What a hit returns: the chunk, or its span joined (the chunk's id, anchor and headings)."""
        span = self.span(idx)
        chunk = self.chunks[idx]
        if len(span) == 1:
            return chunk
        parts = [self.chunks[j] for j in span]
        texts, trail = [], chunk.trail
        for p in parts:  # a part of another section than the one before it opens with its heading
            texts.append(p.text if p.trail == trail else f"{PART_OPENER}{heading_of(p)}\n\n{p.text}")
            trail = p.trail
        return replace(chunk, text="\n\n".join(texts), snippet_ids=tuple(s for p in parts for s in p.snippet_ids))
