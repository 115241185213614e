"""TF-IDF over a text's character n-grams, as scikit-learn computes it, in numpy at query time.

Two learned parts read questions this way: the wording probe of the coverage decision
(`app/wording_probe.py`) and the question memory's lexical side (`app/question_memory.py`). Both are
fitted with scikit-learn's `TfidfVectorizer(analyzer=char_ngrams, sublinear_tf=True)` (`fit_char_tfidf`,
training only) and stored as their n-grams and idf; `CharTfidf.vector` gives the row `transform` would,
so the service needs no scikit-learn. Character n-grams read English and Chinese alike, and the
identifiers and error texts users write (`stage3_gather_16bit_weights_on_model_save`) without a tokenizer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

NGRAM_SIZES = (2, 4)  # the shortest and longest n-gram, within a word padded with one space each side
MIN_DF = 2  # an n-gram seen in fewer training texts is left out


def char_ngrams(text: str) -> list[str]:
    """The character n-grams of each lowercased word padded with a space (scikit-learn's `char_wb`: a word
    shorter than a size gives itself once)."""
    low, high = NGRAM_SIZES
    out: list[str] = []
    for word in text.lower().split():
        w = f" {word} "
        for n in range(low, high + 1):
            out += [w[i : i + n] for i in range(max(len(w) - n, 0) + 1)]
            if len(w) <= n:
                break
    return out


@dataclass(frozen=True)
class CharTfidf:
    ngrams: dict[str, int]  # n-gram -> its column
    idf: np.ndarray

    def vector(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """The text's row as (columns, values): sublinear counts times idf, unit length; empty when it
        holds no known n-gram."""
        counts = Counter(g for g in char_ngrams(text) if g in self.ngrams)
        if not counts:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        cols = np.fromiter((self.ngrams[g] for g in counts), dtype=np.int64, count=len(counts))
        values = (1.0 + np.log(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))) * self.idf[cols]
        return cols, values / np.linalg.norm(values)

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """Its arrays for an npz file, each name under `prefix`."""
        return {f"{prefix}ngrams": np.array(sorted(self.ngrams, key=self.ngrams.__getitem__)),
                f"{prefix}idf": self.idf.astype(np.float32)}

    @classmethod
    def from_arrays(cls, data: Any, prefix: str) -> CharTfidf | None:
        """From an open npz file's arrays (None when it holds none under `prefix`)."""
        if f"{prefix}ngrams" not in data.files:
            return None
        ngrams = {str(g): i for i, g in enumerate(data[f"{prefix}ngrams"])}
        idf = data[f"{prefix}idf"].astype(np.float64)
        if len(ngrams) != len(idf) or not np.isfinite(idf).all():
            raise ValueError("the stored n-grams and their idf do not agree")
        return cls(ngrams, idf)


def fit_char_tfidf(texts: list[str]) -> tuple[CharTfidf, Any]:
    """Fitted on `texts` (training only: imports scikit-learn): the vectorizer and the texts' matrix
    (sparse, one unit-length row per text)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    tfidf = TfidfVectorizer(analyzer=char_ngrams, min_df=min(MIN_DF, len(texts)), sublinear_tf=True)  # one text: its own n-grams
    matrix = tfidf.fit_transform(texts)
    return CharTfidf({str(g): int(i) for g, i in tfidf.vocabulary_.items()}, tfidf.idf_.astype(np.float64)), matrix
