"""Score fusion and de-duplication: pure functions over score arrays and chunk texts."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np


def normalise(scores: np.ndarray) -> np.ndarray:
    """Scale to [0, 1] by the maximum (0 stays 0); an all-zero array stays zero."""
    top = float(scores.max()) if scores.size else 0.0
    return scores / top if top > 0 else np.zeros_like(scores)


def weighted_fusion(bm25: np.ndarray, dense: np.ndarray, w_bm25: float, w_dense: float) -> np.ndarray:
    """Convex mix of max-normalised BM25 and min-max-normalised cosine over the same candidates."""
    d = dense.astype(np.float64)
    lo, hi = float(d.min()), float(d.max())
    d = (d - lo) / (hi - lo) if hi > lo else np.zeros_like(d)
    return w_bm25 * normalise(bm25.astype(np.float64)) + w_dense * d


def rrf_fusion(rankings: Sequence[Sequence[int]], weights: Sequence[float], k: int = 60) -> dict[int, float]:
    """Weighted reciprocal rank fusion of several ranked id lists."""
    fused: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, doc in enumerate(ranking):
            fused[doc] = fused.get(doc, 0.0) + weight / (k + rank + 1)
    return fused


_WORD = re.compile(r"[a-z0-9]+")


def shingles(text: str, n: int = 5) -> np.ndarray:
    """The text's word 5-grams, each as its hash (sorted, distinct int64): 8 bytes a shingle where a
    set of word tuples took ~120, so a server keeps every chunk's at hand (~3 MB for the docs)."""
    words = _WORD.findall(text.lower())
    grams = (hash(tuple(words[i : i + n])) for i in range(max(1, len(words) - n + 1)))
    return np.unique(np.fromiter(grams, dtype=np.int64))


def near_duplicate(a: np.ndarray, b: np.ndarray, threshold: float = 0.8) -> bool:
    """Jaccard overlap of word 5-gram sets: the same passage twice, not one quoting the other."""
    if not len(a) or not len(b):
        return False
    shared = len(np.intersect1d(a, b, assume_unique=True))
    return shared / (len(a) + len(b) - shared) >= threshold
