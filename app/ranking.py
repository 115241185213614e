"""The learned re-ranking of retrieval candidates: cheap features and a linear model over them.

Each candidate passage gets a row of features (BM25 and cosine of the whole question and of its
ask, their ranks, how much of the question the heading trail and the text cover, exact identifier
matches, the source kind, length). A logistic-regression model trained on the `tune` split of our
question set (`dsqa eval train-ranker`) turns a row into a score; its weights ship in
`app/ranker.json`. Pure numpy at query time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.documents import Chunk
from indexer.tokenize import tokenize

RANKER_FILE = Path(__file__).resolve().parent / "ranker.json"

FEATURES: tuple[str, ...] = (
    "bm25",  # BM25 of the whole question / the best candidate's
    "bm25_ask",  # BM25 of the ask alone / its best
    "cos",  # cosine of the whole question
    "cos_gap",  # cosine minus the best candidate's cosine
    "cos_ask",  # cosine of the ask alone
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
    cos_ask: np.ndarray
    ask_terms: frozenset[str]
    identifiers: frozenset[str]
    cjk: bool


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(-values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(len(values))
    return ranks


def candidate_features(ids: np.ndarray, q: QuerySignals, terms: list[ChunkTerms]) -> np.ndarray:
    """One row of FEATURES per candidate chunk id."""
    bm = q.bm25[ids].astype(np.float64)
    bma = q.bm25_ask[ids].astype(np.float64)
    cos = q.cos[ids].astype(np.float64)
    cosa = q.cos_ask[ids].astype(np.float64)
    bm_n = bm / bm.max() if bm.max() > 0 else np.zeros_like(bm)
    bma_n = bma / bma.max() if bma.max() > 0 else np.zeros_like(bma)
    rows = np.zeros((len(ids), len(FEATURES)), dtype=np.float64)
    rows[:, 0] = bm_n
    rows[:, 1] = bma_n
    rows[:, 2] = cos
    rows[:, 3] = cos - cos.max()
    rows[:, 4] = cosa
    rows[:, 5] = 1.0 / (1.0 + _ranks(bm))
    rows[:, 6] = 1.0 / (1.0 + _ranks(cos))
    n_terms = max(len(q.ask_terms), 1)
    n_ident = max(len(q.identifiers), 1)
    for r, i in enumerate(ids):
        t = terms[int(i)]
        rows[r, 7] = len(q.ask_terms & t.trail) / n_terms
        rows[r, 8] = len(q.ask_terms & t.text) / n_terms
        rows[r, 9] = len(q.identifiers & t.text) / n_ident if q.identifiers else 0.0
        rows[r, 10] = 1.0 if q.identifiers else 0.0
        rows[r, 11] = t.source == "api"
        rows[r, 12] = t.source == "config"
        rows[r, 13] = t.news
        rows[r, 14] = math.log1p(t.words)
    rows[:, 15] = bm_n if q.cjk else 0.0
    rows[:, 16] = cos if q.cjk else 0.0
    return rows


@dataclass(frozen=True)
class LinearRanker:
    """A logistic-regression scorer over standardised features."""

    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: float
    trained_on: str = ""

    def score(self, rows: np.ndarray) -> np.ndarray:
        return ((rows - self.mean) / self.scale) @ self.weights + self.bias

    def to_json(self) -> dict[str, object]:
        return {
            "features": list(self.features),
            "mean": self.mean.round(6).tolist(),
            "scale": self.scale.round(6).tolist(),
            "weights": self.weights.round(6).tolist(),
            "bias": round(self.bias, 6),
            "trained_on": self.trained_on,
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> LinearRanker:
        features = tuple(str(f) for f in d["features"])  # type: ignore[attr-defined]
        if features != FEATURES:
            raise ValueError(f"ranker features {features} do not match this version's {FEATURES}: retrain it")
        return cls(
            features=features,
            mean=np.asarray(d["mean"], dtype=np.float64),
            scale=np.asarray(d["scale"], dtype=np.float64),
            weights=np.asarray(d["weights"], dtype=np.float64),
            bias=float(d["bias"]),  # type: ignore[arg-type]
            trained_on=str(d.get("trained_on", "")),
        )

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)


def load_ranker(path: Path = RANKER_FILE) -> LinearRanker | None:
    """The shipped ranker, or None when the file is absent (the retriever then fuses by hand)."""
    if not path.is_file():
        return None
    return LinearRanker.from_json(json.loads(path.read_text(encoding="utf-8")))
