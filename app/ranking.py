"""The learned re-ranking of retrieval candidates: cheap features and a linear model over them.

Each candidate passage gets a row of features (BM25 and cosine of the whole question and of its
ask, their ranks, how much of the question the heading trail and the text cover, exact identifier
matches, the source kind, length; and the best cosine, BM25 and term coverage over the passage
the chunk returns, its section span: what a reader gets and what relevance is judged on). A
logistic-regression model trained on the `tune` split of our question set (`dsqa eval train-ranker`) turns a row into a score; its weights ship in
`app/ranker.json`. Pure numpy at query time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.linear_model import LinearModel, load_linear_model
from indexer.documents import Chunk
from indexer.tokenize import tokenize

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
)


@dataclass(frozen=True)
class ChunkTerms:
    """What the features need of one chunk, computed once when the retriever loads."""

    text: frozenset[str]
    trail: frozenset[str]
    words: int
    source: str
    news: bool


def chunk_terms(chunk: Chunk) -> ChunkTerms:
    return ChunkTerms(
        text=frozenset(tokenize(chunk.text)),
        trail=frozenset(tokenize(" ".join(chunk.trail))),
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
    query_vector: np.ndarray | None = None  # the encoder's vector of the question (the answer ranks units by it)
    query_terms: int = 1  # distinct BM25 terms of the searched text (raw BM25 grows with them)


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(-values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(len(values))
    return ranks


def candidate_features(ids: np.ndarray, q: QuerySignals, terms: list[ChunkTerms],
                       spans: list[tuple[int, ...]] | None = None) -> np.ndarray:
    """One row of FEATURES per candidate chunk id; `spans` are the chunks each candidate's passage
    joins (the candidate alone when not given)."""
    bm = q.bm25[ids].astype(np.float64)
    bma = q.bm25_ask[ids].astype(np.float64)
    cos = q.cos[ids].astype(np.float64)
    bm_n = bm / bm.max() if bm.max() > 0 else np.zeros_like(bm)
    bma_n = bma / bma.max() if bma.max() > 0 else np.zeros_like(bma)
    rows = np.zeros((len(ids), len(FEATURES)), dtype=np.float64)
    rows[:, 0] = bm_n
    rows[:, 1] = bma_n
    rows[:, 2] = cos
    rows[:, 3] = cos - cos.max()
    rows[:, 4] = 1.0 / (1.0 + _ranks(bm))
    rows[:, 5] = 1.0 / (1.0 + _ranks(cos))
    n_terms = max(len(q.ask_terms), 1)
    n_ident = max(len(q.identifiers), 1)
    for r, i in enumerate(ids):
        t = terms[int(i)]
        rows[r, 6] = len(q.ask_terms & t.trail) / n_terms
        rows[r, 7] = len(q.ask_terms & t.text) / n_terms
        rows[r, 8] = len(q.identifiers & t.text) / n_ident if q.identifiers else 0.0
        rows[r, 9] = 1.0 if q.identifiers else 0.0
        rows[r, 10] = t.source == "api"
        rows[r, 11] = t.source == "config"
        rows[r, 12] = t.news
        rows[r, 13] = math.log1p(t.words)
    rows[:, 14] = bm_n if q.cjk else 0.0
    rows[:, 15] = cos if q.cjk else 0.0
    bm_best = float(bm.max()) if bm.max() > 0 else 1.0
    for r in range(len(ids)):
        if spans is None or len(spans[r]) == 1:  # the passage is the chunk itself
            rows[r, 16], rows[r, 17], rows[r, 18] = rows[r, 3], bm_n[r], rows[r, 7]
            continue
        span = list(spans[r])
        rows[r, 16] = float(q.cos[span].max()) - cos.max()
        rows[r, 17] = float(q.bm25[span].max()) / bm_best
        rows[r, 18] = len(set().union(*(q.ask_terms & terms[j].text for j in span))) / n_terms
    return rows


def load_ranker(path: Path = RANKER_FILE) -> LinearModel | None:
    """The shipped ranker, or None when the file is absent (the retriever then fuses by hand)."""
    return load_linear_model(path, FEATURES)
