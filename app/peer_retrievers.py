"""The peers the shipped hybrid (`app/retriever.py`) is measured beside, in the same run, over the
same chunks and tokens: `Bm25Retriever`, `DenseRetriever` (the base model's cosine) and
`RrfRetriever` (reciprocal rank fusion of those two, equal weights).
"""

from __future__ import annotations

import numpy as np

from app.fusion import rrf_fusion
from app.glossary import Glossary
from app.retriever import Hit, SearchResult, bm25_scores, dense_matrix, matches_filter
from indexer.embedder import Embedder
from indexer.store import LoadedIndex
from indexer.tokenize import tokenize


def _top_hits(index: LoadedIndex, scores: np.ndarray, k: int, topic: str | None, source: str | None,
              cosines: np.ndarray | None = None) -> list[Hit]:
    hits: list[Hit] = []
    for i in np.argsort(-scores, kind="stable"):
        chunk = index.chunks[int(i)]
        if matches_filter(chunk, topic, source):
            dense = float(cosines[int(i)]) if cosines is not None else 0.0
            hits.append(Hit(chunk=chunk, score=float(scores[int(i)]), bm25=0.0, dense=dense))
            if len(hits) >= k:
                break
    return hits


class Bm25Retriever:
    """Peer: BM25 alone over the same chunks and tokens (Chinese through the same glossary)."""

    def __init__(self, index: LoadedIndex, glossary: Glossary | None = None):
        self.index = index
        self.glossary = glossary or Glossary({})

    def scores(self, query: str) -> np.ndarray:
        return bm25_scores(self.index, tokenize(query))

    def search(self, question: str, k: int = 5, *, topic: str | None = None, source: str | None = None) -> SearchResult:
        query = self.glossary.expand(question)
        return SearchResult(hits=_top_hits(self.index, self.scores(query), k, topic, source), query=query, relevance=0.0)


class DenseRetriever:
    """Peer: the base dense model alone (cosine over the same chunks)."""

    def __init__(self, index: LoadedIndex, embedder: Embedder, glossary: Glossary | None = None):
        self.index = index
        self.embedder = embedder
        self.glossary = glossary or Glossary({})
        self.matrix = dense_matrix(index)

    def scores(self, query: str) -> np.ndarray:
        return self.matrix @ self.embedder.embed([query])[0]

    def search(self, question: str, k: int = 5, *, topic: str | None = None, source: str | None = None) -> SearchResult:
        query = self.glossary.expand(question)
        cos = self.scores(query)
        hits = _top_hits(self.index, cos, k, topic, source, cos)
        return SearchResult(hits=hits, query=query, relevance=max((h.dense for h in hits), default=0.0))


class RrfRetriever:
    """Peer: reciprocal rank fusion (k=60) of the BM25 and the dense rankings, equal weights."""

    def __init__(self, index: LoadedIndex, embedder: Embedder, glossary: Glossary | None = None, depth: int = 100):
        self.bm25 = Bm25Retriever(index, glossary)
        self.dense = DenseRetriever(index, embedder, glossary)
        self.index = index
        self.depth = depth

    def search(self, question: str, k: int = 5, *, topic: str | None = None, source: str | None = None) -> SearchResult:
        query = self.bm25.glossary.expand(question)
        rankings = [np.argsort(-s)[: self.depth].tolist() for s in (self.bm25.scores(query), self.dense.scores(query))]
        fused = rrf_fusion(rankings, [1.0, 1.0])
        scores = np.zeros(len(self.index.chunks))
        for i, v in fused.items():
            scores[i] = v
        return SearchResult(hits=_top_hits(self.index, scores, k, topic, source), query=query, relevance=0.0)
