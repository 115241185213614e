"""How a question's wording leans toward what the docs never answer: a probe over its ask's characters.

What the docs never hold is often plain in the words of the ask: when a release came out or is planned
("什么时候", "when", "release"), what you or others would do ("you", "你们"), a figure per GPU or per
second. Whether the question asks for a way or names an error leans the other way ("有没有办法", "error",
"can"). The encoder's vector hears the topic more than this; a linear model over the character 2-4-grams
of the ask (TF-IDF with sublinear counts, one model for English and Chinese alike) hears the words.

The probe reads only the ask (`app.query.split_question`), with config keys written out as `"name":`,
command-line flags, brackets and JSON literals taken out (`wording`): the context before an ask is
long in real questions and short in the ones we wrote, and a fake config key written out is what the
`unknown_setting` signal judges, from facts, not from how such questions happen to be written.

Trained by `dsqa eval train-abstention` on the same tune answerable and unanswerable questions as the
decision, cross-fitted into it (`eval/abstention_training.py`), and stored in the refusal memory's file
(`app/refusal_memory.npz`): the n-grams, their idf and weights. Pure Python at query time; `char_ngrams`
is the analyzer training uses too, so both see the same n-grams.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.query import split_question

NGRAM_SIZES = (2, 4)  # the shortest and longest n-gram, within a word padded with one space each side
_WRITTEN_OUT = re.compile(r'"[^"\n]{1,60}"\s*:|(?<![\w-])--?[A-Za-z][\w-]*|[{}\[\]]|\b(?:true|false|none|null)\b', re.I)


def wording(question: str) -> str:
    """The text the probe reads: the question's ask, without config keys, flags and JSON written out."""
    return _WRITTEN_OUT.sub(" ", split_question(question).ask)


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
class WordingProbe:
    ngrams: dict[str, int]  # n-gram -> its column
    idf: np.ndarray
    weights: np.ndarray
    bias: float

    def logit(self, question: str) -> float:
        """Above 0 the ask's wording leans toward unanswerable (sublinear TF-IDF, unit length, linear)."""
        counts = Counter(g for g in char_ngrams(wording(question)) if g in self.ngrams)
        if not counts:
            return self.bias
        cols = np.fromiter((self.ngrams[g] for g in counts), dtype=np.int64, count=len(counts))
        values = (1.0 + np.log(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))) * self.idf[cols]
        return float(values @ self.weights[cols] / np.linalg.norm(values) + self.bias)

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """Its arrays for an npz file, each name under `prefix`."""
        order = sorted(self.ngrams, key=self.ngrams.__getitem__)
        return {f"{prefix}ngrams": np.array(order), f"{prefix}idf": self.idf.astype(np.float32),
                f"{prefix}weights": self.weights.astype(np.float32), f"{prefix}bias": np.array(self.bias)}

    @classmethod
    def from_arrays(cls, data: Any, prefix: str) -> WordingProbe | None:
        """From an open npz file's arrays (None when it holds none under `prefix`)."""
        if f"{prefix}ngrams" not in data.files:
            return None
        get = data.__getitem__
        ngrams = {str(g): i for i, g in enumerate(get(f"{prefix}ngrams"))}
        idf, weights = get(f"{prefix}idf").astype(np.float64), get(f"{prefix}weights").astype(np.float64)
        if not (len(ngrams) == len(idf) == len(weights)) or not (np.isfinite(idf).all() and np.isfinite(weights).all()):
            raise ValueError("the wording probe's n-grams, idf and weights do not agree: retrain the coverage decision")
        return cls(ngrams, idf, weights, float(get(f"{prefix}bias")))
