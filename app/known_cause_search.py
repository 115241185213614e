"""The known cause nearest a log that shows none of the known texts (`closest_known_cause`): whether one is near
is told by meaning (the cosine of the log's end with the index's vectors of the known-errors note's passages);
which one, by meaning and words together (a BM25 over each cause's title, why, check and fix: the names of
options, tools and libraries a log shares with the cause that explains it).

Chosen on `dsqa eval doctor --known-ablation` (`eval.doctor_eval.run_known_ablation`: the tuning logs whose first
cause is a known one, diagnosed again with that cause's texts taken away, and with the cause taken away).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from indexer.known_causes import KnownCause

KNOWN_COSINE = 0.6  # a known cause closer than this in meaning leads when the log shows none; chosen on the tune logs
KNOWN_QUERY_CHARS = 1000  # of the text held against the known causes' passages: its end, where the message is
WORDS_WEIGHT = 0.5  # of the words' standard score beside the cosine's, in choosing which near cause leads
NEAR_MARGIN = 0.1  # a cause may lead by words when its cosine is within this of KNOWN_COSINE
# (the first known cause by cosine was the thread's cause for 17 of the 25 tune logs at 0.6 or more, 26 of 43 at 0.5)
# Tried and not kept (stop 55): the first cause of the most alike labelled log of another thread (character n-grams
# of the error line) for a log no known text explains: 0 of the 38 such tune and tune-only logs set right at any
# similarity floor from 0.3 to 0.7, up to 2 set wrong.
# Stop 71, `--known-ablation` (636 tuning logs: right with the cause's texts taken away / with the cause taken away):
# the nearest known cause after a close text and a release's bug (`app.doctor.diagnose`) 202 / 109, before them
# 303 / 125 (on the 697 logs as they are 664 -> 663); then the near cause chosen by cosine and words 407 / 155 (662).
# In a first harness of the ablation (662 logs; right with the cause's texts taken away / with the cause
# taken away / the 697 logs as they are):
# - the nearest known cause before a close text and a release's bug: 220 / 117 / 664 -> 322 / 133 / 663;
# - then the cause chosen by cosine and words (WORDS_WEIGHT 0, 0.5, 1): 322 / 133 / 663, 426 / 161 / 662,
#   423 / 165 / 660;
# - cosine floors 0.5 / 0.55 / 0.6 / 0.65 / 0.7 (by cosine alone): 336 / 333 / 322 / 292 / 253 and
#   133 / 133 / 133 / 126 / 129; the log's last 300 / 600 / 1000 characters in place of its message: 337 / 342 / 336,
#   131 / 133 / 130, one or two fewer right as they are; words only after the vectors found none: 334 / 135.

_WORD = re.compile(r"[a-z0-9_]+")
_STOP = frozenset("the a an of to in is and or for on with be it this that as by at from not are was".split())
_K1, _B = 1.2, 0.75


def _words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1]


class KnownCauseWords:
    """BM25 of a text against each known cause's title, why, check and fix (the `Matches:` texts left out: a log
    that showed one would not be asking)."""

    def __init__(self, known: tuple[KnownCause, ...]) -> None:
        docs = [_words(f"{k.title} {k.why} {k.check} {k.fix}") for k in known]
        self._tfs = [Counter(d) for d in docs]
        self._lengths = np.array([len(d) for d in docs], dtype=np.float64)
        self._mean_length = float(self._lengths.mean()) if docs else 1.0
        df = Counter(w for d in docs for w in set(d))
        n = len(docs)
        self._idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in df.items()}

    def scores(self, text: str) -> np.ndarray:
        asked = set(_words(text)) & self._idf.keys()
        out = np.zeros(len(self._tfs))
        for j, tf in enumerate(self._tfs):
            norm = _K1 * (1 - _B + _B * self._lengths[j] / self._mean_length)
            out[j] = sum(self._idf[w] * tf[w] * (_K1 + 1) / (tf[w] + norm) for w in asked if w in tf)
        return out


def _standard(values: np.ndarray) -> np.ndarray:
    return (values - values.mean()) / (values.std() + 1e-9)


_BUILT: dict[tuple[int, int], tuple[Any, tuple[KnownCause, ...], dict[str, Any]]] = {}


def _built(index: Any, known: tuple[KnownCause, ...]) -> dict[str, Any]:
    """The known causes' passages in the index (rows, and the cause of each) and their words' index: built once per
    index and notes (the doctor is asked again and again with the same two)."""
    key = (id(index), id(known))
    cached = _BUILT.get(key)
    if cached is None or cached[0] is not index or cached[1] is not known:
        at = {k.url: j for j, k in enumerate(known)}
        rows = [i for i, c in enumerate(index.chunks) if c.url in at]
        built = {"rows": rows, "owner": np.array([at[index.chunks[i].url] for i in rows], dtype=np.int64), "words": KnownCauseWords(known)}
        if len(_BUILT) >= 8:
            _BUILT.clear()
        cached = _BUILT[key] = (index, known, built)
    return cached[2]


def closest_known_cause(retriever: Any, known: tuple[KnownCause, ...]) -> Callable[[str], tuple[KnownCause, float] | None] | None:
    """`text -> (known cause, cosine) | None`: None when no known cause's passage reaches KNOWN_COSINE; else, of
    the causes within NEAR_MARGIN of it, the one whose cosine and words (standard scores, WORDS_WEIGHT) together
    score best. One query encode; the note's passages and the words' index built once (`_built`). None without a
    retriever that holds the passages' vectors."""
    index, matrix, embedder = (getattr(retriever, name, None) for name in ("index", "matrix", "embedder"))
    if index is None or matrix is None or embedder is None or not known:
        return None

    def closest(text: str) -> tuple[KnownCause, float] | None:
        built = _built(index, known)
        if not built["rows"]:
            return None
        cos = matrix[built["rows"]] @ embedder.embed([text[-KNOWN_QUERY_CHARS:]])[0]
        per_cause = np.full(len(known), -1.0)
        np.maximum.at(per_cause, built["owner"], cos.astype(np.float64))
        if per_cause.max() < KNOWN_COSINE:
            return None
        held = per_cause > -1.0  # causes with a passage in the index
        score = np.full(len(known), -np.inf)
        score[held] = _standard(per_cause[held]) + WORDS_WEIGHT * _standard(built["words"].scores(text)[held])
        near = [j for j in np.argsort(-score) if per_cause[j] >= KNOWN_COSINE - NEAR_MARGIN and not known[j].harmless]
        return (known[near[0]], float(per_cause[near[0]])) if near else None

    return closest
