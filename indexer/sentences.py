"""The sentences of a passage, embedded one by one so a question can meet the one sentence that
answers it (a long passage's single vector blurs it).

Prose only: code blocks, table rows of a single cell and fragments under four words are left out.
Pure functions; the build embeds the result (with the vector cache) and stores it beside the
chunk vectors, each sentence with the index of the chunk it belongs to.
"""

from __future__ import annotations

import re

from indexer.documents import Chunk, content_hash

_FENCE = re.compile(r"```.*?(?:```|$)", re.S)
_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE = re.compile(r"(?<=[.!?;:。！？；])\s+(?=[A-Z`\"'(\[*_\u4e00-\u9fff])")
MIN_WORDS = 4


def passage_sentences(text: str) -> list[str]:
    """The prose sentences of a passage: paragraphs unwrapped, split at sentence ends."""
    out: list[str] = []
    for para in _PARAGRAPH.split(_FENCE.sub(" ", text)):
        flat = " ".join(para.split())
        for sentence in _SENTENCE.split(flat):
            if len(sentence.split()) >= MIN_WORDS:
                out.append(sentence)
    return out


def sentence_table(chunks: list[Chunk]) -> tuple[list[str], list[int], list[str]]:
    """Every chunk's sentences in chunk order: (texts, owning chunk index, cache keys)."""
    texts: list[str] = []
    owner: list[int] = []
    for i, chunk in enumerate(chunks):
        for sentence in passage_sentences(chunk.text):
            texts.append(sentence)
            owner.append(i)
    return texts, owner, [content_hash("sentence", t) for t in texts]
