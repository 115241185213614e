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
(`app/refusal_memory.npz`): the n-grams, their idf and weights (`app/char_tfidf.py`). Pure numpy at query time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.char_tfidf import CharTfidf
from app.query import split_question

_WRITTEN_OUT = re.compile(r'"[^"\n]{1,60}"\s*:|(?<![\w-])--?[A-Za-z][\w-]*|[{}\[\]]|\b(?:true|false|none|null)\b', re.I)


def wording(question: str) -> str:
    """The text the probe reads: the question's ask, without config keys, flags and JSON written out."""
    return _WRITTEN_OUT.sub(" ", split_question(question).ask)


@dataclass(frozen=True)
class WordingProbe:
    tfidf: CharTfidf
    weights: np.ndarray
    bias: float

    def logit(self, question: str) -> float:
        """Above 0 the ask's wording leans toward unanswerable (sublinear TF-IDF, unit length, linear)."""
        cols, values = self.tfidf.vector(wording(question))
        return float(values @ self.weights[cols] + self.bias)

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """Its arrays for an npz file, each name under `prefix`."""
        return {**self.tfidf.arrays(prefix), f"{prefix}weights": self.weights.astype(np.float32), f"{prefix}bias": np.array(self.bias)}

    @classmethod
    def from_arrays(cls, data: Any, prefix: str) -> WordingProbe | None:
        """From an open npz file's arrays (None when it holds none under `prefix`)."""
        try:
            tfidf = CharTfidf.from_arrays(data, prefix)
        except ValueError as exc:
            raise ValueError(f"the wording probe: {exc}: retrain the coverage decision") from exc
        if tfidf is None:
            return None
        weights = data[f"{prefix}weights"].astype(np.float64)
        if len(weights) != len(tfidf.idf) or not np.isfinite(weights).all():
            raise ValueError("the wording probe's n-grams, idf and weights do not agree: retrain the coverage decision")
        return cls(tfidf, weights, float(data[f"{prefix}bias"]))
