"""The learned re-ranking of retrieval candidates: cheap features and a linear model over them.

Each candidate passage gets a row of features (BM25 and cosine of the whole question and of its
ask, their ranks, how much of the question the heading trail and the text cover, how much of the trail the
question does not name (idf-weighted), exact identifier
matches, the source kind, length, the best cosine over the chunk's sentences, how close it comes to remembered questions the chunk answers; and the best cosine, BM25 and term coverage over the passage
the chunk returns, its section span: what a reader gets and what relevance is judged on). A
logistic-regression model trained on the `tune` split of our question set (`dsqa eval train-ranker`) turns a row into a score; its weights ship in
`app/ranker.json`. Pure numpy at query time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.linear_model import LinearModel, load_linear_model
from indexer.documents import Chunk
from indexer.tokenize import chunk_term_sets

RANKER_FILE = Path(__file__).resolve().parent / "ranker.json"

FEATURES: tuple[str, ...] = (
    "bm25",  # BM25 of the whole question / the best candidate's
    "bm25_ask",  # BM25 of the ask alone / its best
    "cos",  # cosine of the whole question
    "cos_gap",  # cosine minus the best candidate's cosine
    "bm25_rank",  # 1 / (1 + rank by BM25)
    "dense_rank",  # 1 / (1 + rank by cosine)
    "trail_cover",  # share of the ask's terms found in the title/heading trail
    "text_cover",  # share of the ask's terms found in the passage
    "ident_match",  # share of the question's identifiers found whole in the passage
    "has_ident",  # the question names identifiers at all
    "src_api",
    "src_config",
    "src_news",  # release posts and blogs
    "log_words",
    "cjk_bm25",  # BM25 again, for Chinese questions only (their English is a bag of glossary terms)
    "cjk_cos",
    "span_cos",  # best cosine over the passage the chunk returns (its section span), minus the best candidate's
    "span_bm25",  # best BM25 over that passage / the best candidate's
    "span_cover",  # share of the ask's terms found anywhere in that passage
    "unit_cos",  # best cosine over the chunk's sentences and list items, minus the best candidate's
    "seen",  # best cosine with a remembered tune question this chunk answers (`app/question_memory.py`)
    "seen_lex",  # the same by the questions' character n-grams (`ChunkMemory.seen_lexical`)
    "trail_extra",  # share of the trail's idf mass the ask does not name (a page about a narrower thing: "Universal ...")
)


@dataclass(frozen=True)
class ChunkTerms:
    """What the features need of one chunk, computed once when the retriever loads."""

    text: frozenset[str]
    trail: frozenset[str]
    words: int
    source: str
    news: bool


def chunk_terms(chunk: Chunk, stored: tuple[frozenset[str], frozenset[str]] | None = None) -> ChunkTerms:
    """`stored`: the (text, trail) tokens the index carries for the chunk; tokenized here without."""
    text, trail = stored if stored is not None else chunk_term_sets(chunk.text, chunk.trail)
    return ChunkTerms(
        text=text,
        trail=trail,
        words=len(chunk.text.split()),
        source=chunk.source,
        news=chunk.path.startswith(("blogs/", "docs/_posts/")),
    )


@dataclass(frozen=True)
class QuerySignals:
    """Scores of one question over every chunk, and the question's own terms."""

    bm25: np.ndarray
    bm25_ask: np.ndarray
    cos: np.ndarray
    ask_terms: frozenset[str]
    identifiers: frozenset[str]
    cjk: bool
    query_vector: np.ndarray | None = None  # the searched vector of the question (adapted; the answer ranks units by it)
    query_terms: int = 1  # distinct BM25 terms of the searched text (raw BM25 grows with them)
    ask_identifiers: frozenset[str] = frozenset()  # the identifiers of the ask alone
    unknown_identifiers: frozenset[str] = frozenset()  # the question's identifiers no chunk or heading names
    unknowable: bool = False  # asks for a date, price, opinion or measured number (`app.query.asks_unknowable`)
    plan_or_figure: bool = False  # asks for a plan, an expected figure or others' experience (`app.query.asks_plan_or_figure`)
    first_release: bool = False  # asks which release first had a feature (`app.query.asks_first_release`)
    other_library: bool = False  # names another framework and nothing of DeepSpeed's (`app.query.asks_other_library`)
    unknown_settings: tuple[str, ...] = ()  # config keys, CLI flags or keyword arguments written out that no chunk or heading names (`app.query.settings_named`)
    unaccepted_arguments: tuple[tuple[str, str], ...] = ()  # (function, keyword): an argument passed that the installed function does not take (`indexer/api_signatures.py`)
    unseen_terms: int = 0  # how many of the ask's terms no chunk's text or heading holds
    unit_cos: np.ndarray | None = None  # per chunk of `pool`, the best cosine over its text units (None: the chunk's cosine)
    seen: np.ndarray | None = None  # per chunk, `ChunkMemory.seen` of the question (None: no memory)
    seen_lex: np.ndarray | None = None  # per chunk, `ChunkMemory.seen_lexical` of the question (None: no memory or no n-grams)
    seen_best: float | None = None  # `ChunkMemory.best` of the question (None: no memory)
    seen_units: dict[str, float] | None = None  # `ChunkMemory.seen_units` of the question (None: no memory)
    refused_best: float | None = None  # `RefusalMemory.resemblance` of the question (None: no refusal memory)
    refused_leaning: float | None = None  # `RefusalMemory.leaning` of the question (None: no memory or no probe)
    refused_wording: float | None = None  # `RefusalMemory.wording_leaning` of the question (None: no memory or no wording probe)
    pool: np.ndarray | None = None  # the chunks worth ranking (`HybridRetriever.pool`), before any filter


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(-values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(len(values))
    return ranks


class FeatureTable:
    """Per-chunk facts the features read, as arrays and posting lists built once per retriever: the
    source flags, lengths, each chunk's passage (its section span, a contiguous range), and which
    chunks, trails and passages hold each term. A question's coverage features are then a few array
    additions over its terms instead of set operations per candidate."""

    def __init__(self, terms: list[ChunkTerms], spans: list[tuple[int, ...]]):
        self.n = len(terms)
        self.api = np.array([t.source == "api" for t in terms], dtype=np.float64)
        self.config = np.array([t.source == "config" for t in terms], dtype=np.float64)
        self.news = np.array([t.news for t in terms], dtype=np.float64)
        self.log_words = np.log1p(np.array([t.words for t in terms], dtype=np.float64))
        self.lo = np.array([min(s) for s in spans], dtype=np.int64)
        self.hi = np.array([max(s) for s in spans], dtype=np.int64)
        self.text = _postings(t.text for t in terms)
        self.trail = _postings(t.trail for t in terms)
        # each trail term's idf over the chunks' texts, and each trail's total
        self.idf = {w: max(math.log(self.n / (1.0 + len(self.text.get(w, ())))), 0.0) for w in self.trail}
        self.trail_idf = np.array([sum(self.idf[w] for w in t.trail) for t in terms], dtype=np.float64)
        self.span_text = _postings(frozenset().union(*(terms[j].text for j in s)) if len(s) > 1 else terms[i].text
                                   for i, s in enumerate(spans))

    def knows(self, term: str) -> bool:
        """Whether any chunk's text or heading trail holds the term."""
        return term in self.text or term in self.trail

    def count(self, postings: dict[str, np.ndarray], words: frozenset[str], weight: dict[str, float] | None = None) -> np.ndarray:
        """How many of `words` each chunk holds (by the given posting lists); with `weight`, the sum of their weights."""
        counts = np.zeros(self.n, dtype=np.float64)
        for w in words:
            hit = postings.get(w)
            if hit is not None:
                counts[hit] += 1.0 if weight is None else weight.get(w, 0.0)
        return counts

    def span_max(self, values: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The best of `values` over each candidate's passage."""
        if len(ids) == 0:
            return np.zeros(0, dtype=np.float64)
        bounds = np.empty(2 * len(ids), dtype=np.int64)  # [lo, hi + 1] per candidate: one reduceat over them all
        bounds[0::2], bounds[1::2] = self.lo[ids], self.hi[ids] + 1
        padded = np.append(values.astype(np.float64), -np.inf)  # hi + 1 may be one past the last chunk
        return np.maximum.reduceat(padded, bounds)[0::2]


def _postings(sets: Iterable[frozenset[str]]) -> dict[str, np.ndarray]:
    lists: dict[str, list[int]] = {}
    for i, words in enumerate(sets):
        for w in words:
            lists.setdefault(w, []).append(i)
    return {w: np.array(v, dtype=np.int64) for w, v in lists.items()}


def candidate_features(ids: np.ndarray, q: QuerySignals, table: FeatureTable) -> np.ndarray:
    """One row of FEATURES per candidate chunk id."""
    bm = q.bm25[ids].astype(np.float64)
    bma = q.bm25_ask[ids].astype(np.float64)
    cos = q.cos[ids].astype(np.float64)
    bm_best = float(bm.max()) if bm.max() > 0 else 0.0
    bm_n = bm / bm_best if bm_best else np.zeros_like(bm)
    bma_n = bma / bma.max() if bma.max() > 0 else np.zeros_like(bma)
    n_terms = max(len(q.ask_terms), 1)
    rows = np.zeros((len(ids), len(FEATURES)), dtype=np.float64)
    rows[:, 0] = bm_n
    rows[:, 1] = bma_n
    rows[:, 2] = cos
    rows[:, 3] = cos - cos.max()
    rows[:, 4] = 1.0 / (1.0 + _ranks(bm))
    rows[:, 5] = 1.0 / (1.0 + _ranks(cos))
    rows[:, 6] = table.count(table.trail, q.ask_terms)[ids] / n_terms
    rows[:, 7] = table.count(table.text, q.ask_terms)[ids] / n_terms
    if q.identifiers:
        rows[:, 8] = table.count(table.text, q.identifiers)[ids] / len(q.identifiers)
        rows[:, 9] = 1.0
    rows[:, 10] = table.api[ids]
    rows[:, 11] = table.config[ids]
    rows[:, 12] = table.news[ids]
    rows[:, 13] = table.log_words[ids]
    rows[:, 14] = bm_n if q.cjk else 0.0
    rows[:, 15] = cos if q.cjk else 0.0
    rows[:, 16] = table.span_max(q.cos, ids) - cos.max()
    rows[:, 17] = table.span_max(q.bm25, ids) / bm_best if bm_best else 0.0
    rows[:, 18] = table.count(table.span_text, q.ask_terms)[ids] / n_terms
    unit = q.cos[ids] if q.unit_cos is None else q.unit_cos[ids]
    rows[:, 19] = unit - unit.max()
    if q.seen is not None:
        rows[:, 20] = q.seen[ids]
    if q.seen_lex is not None:
        rows[:, 21] = q.seen_lex[ids]
    total = table.trail_idf[ids]
    named = table.count(table.trail, q.ask_terms, table.idf)[ids]
    rows[:, 22] = np.where(total > 0, 1.0 - named / np.maximum(total, 1e-9), 0.0)
    return rows


def load_ranker(path: Path = RANKER_FILE) -> LinearModel | None:
    """The shipped ranker, or None when the file is absent (the retriever then fuses by hand)."""
    return load_linear_model(path, FEATURES)
