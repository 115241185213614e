"""Identifier-aware tokenisation for BM25: config keys, dotted API names and CLI flags.

`stage3_max_live_parameters` yields the whole key and its stemmed parts; `deepspeed.zero.Init`
yields the dotted name, `zero.init` style tails and the parts, and a segment that is a key of its own
(`overlap_comm` of `zero_optimization.overlap_comm`) yields that key too; `--num_gpus` yields `num_gpus`.
Abbreviated parts also yield their words (`indexer/identifiers.py`).
Pure and deterministic: the index and the queries use the same function.
"""

from __future__ import annotations

import re
from functools import lru_cache

import Stemmer

from indexer.identifiers import expansion

_TOKEN = re.compile(r"-{1,2}[A-Za-z][\w\-]*|[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*|\d+(?:\.\d+)?[A-Za-z]*")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+\d*|[A-Z]+\d*|\d+")
STOPWORDS = frozenset(
    """a an and are as at be by can do does for from has have how i if in into is it its my of on or
    so than that the their then there these this to was were what when where which while who why will
    with would you your me we our should could use using used want need get one also any all not no
    just more most other some such only own same very s t just don""".split()
)


@lru_cache(maxsize=1)
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


def _is_identifier(raw: str) -> bool:
    core = raw.lstrip("-")
    return raw.startswith("-") or "_" in core or "." in core or bool(re.search(r"[a-z][A-Z]", core))


@lru_cache(maxsize=65536)
def term_set(text: str) -> frozenset[str]:
    """The distinct tokens of a text, remembered: the answer scores the same passages' units often."""
    return frozenset(tokenize(text))


def chunk_term_sets(text: str, trail: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """The distinct tokens of a chunk's text and of its heading trail: what the ranker's coverage
    features read (stored in the index at build time, so loading it tokenizes nothing)."""
    return frozenset(tokenize(text)), frozenset(tokenize(" ".join(trail)))


def tokenize(text: str, *, expand: bool = True) -> list[str]:
    """BM25 tokens; `expand` adds the words an abbreviated part stands for (`ckpt` -> checkpoint).
    A question is tokenized by several parts of one search: short texts are remembered."""
    if len(text) <= 4000:
        return list(_tokens_cached(text, expand))
    return _tokens(text, expand)


@lru_cache(maxsize=8192)
def _tokens_cached(text: str, expand: bool) -> tuple[str, ...]:
    return tuple(_tokens(text, expand))


def _tokens(text: str, expand: bool) -> list[str]:
    tokens: list[str] = []
    for m in _TOKEN.finditer(text):
        tokens.extend(_word_tokens(m.group(0).rstrip(".-"), expand))
    return tokens


@lru_cache(maxsize=1 << 17)
def _word_tokens(raw: str, expand: bool) -> tuple[str, ...]:
    """The tokens of one matched word, remembered: the docs repeat a few thousand words some half a
    million times, and stemming each again was most of an index build's tokenizing."""
    core = raw.lstrip("-")
    if not core:
        return ()
    stem = _stemmer().stemWord
    tokens: list[str] = []
    if _is_identifier(raw):
        low = core.lower()
        tokens.append(low)
        if "." in low:  # deepspeed.zero.init -> zero.init; zero_optimization.overlap_comm -> overlap_comm
            segments = low.split(".")
            tokens.extend(".".join(segments[i:]) for i in range(1, len(segments) - 1))
            # a segment that is a key of its own is a token too: a question that names `overlap_comm` matches the
            # catalogue's `zero_optimization.overlap_comm`, as it matches the docs' `overlap_comm`
            tokens.extend(s for s in segments if "_" in s.strip("_"))
    for part in re.split(r"[._\-]+", core):
        pieces = _CAMEL.findall(part)
        if not pieces or any(len(p) < 3 for p in pieces):  # ZeRO, GPT2: keep whole
            pieces = [part]
        for piece in pieces:
            low = piece.lower()
            if len(low) > 1 and low not in STOPWORDS:
                tokens.append(stem(low))
            if expand:
                tokens.extend(stem(w) for w in expansion(low))
    return tuple(tokens)
