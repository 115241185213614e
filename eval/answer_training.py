"""`dsqa eval train-answer`: fit the choice of answer units on the `tune` split only.

For each tune question the shipped retriever's first passages give the candidate units
(`app/answer.py`); a unit is relevant when it holds a gold evidence phrase (the project's one
rule, `eval/metrics.py`). A balanced logistic regression over UNIT_FEATURES is fitted; its
regularisation is chosen by 5-fold cross-validation over tune questions, scored by what the reader
gets: the share of composed answers that hold a gold phrase. Written to `app/answer_units.json`.
The `test` split is never read here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.answer import (
    SEMANTIC_WEIGHT,
    UNIT_FEATURES,
    UNIT_MODEL_FILE,
    Candidate,
    candidates,
    compose,
    unit_features,
    unit_scores,
)
from app.ask import answer_sources
from app.engine import Engine
from app.linear_model import LinearModel
from app.query import split_question
from app.retriever import HybridRetriever
from eval.metrics import Question, normalise
from eval.question_set import hash_fold, split_of

C_GRID = (0.01, 0.1, 1.0)
FOLDS = 5


@dataclass(frozen=True)
class QuestionUnits:
    id: str
    evidence: tuple[str, ...]
    cands: list[Candidate]
    rows: np.ndarray
    labels: np.ndarray
    hand: np.ndarray  # the hand-weighted scores, for the report


def question_units(engine: Engine, questions: list[Question]) -> list[QuestionUnits]:
    index, retriever = engine.require()
    own: dict[str, Any] = {}
    if isinstance(retriever, HybridRetriever) and retriever.options.query_adapter is not None:
        from eval.adapter_training import crossfit

        own = crossfit(retriever, questions)  # passages as a question the adapter never saw gets them
    elif isinstance(retriever, HybridRetriever):
        from eval.memory_training import held_out

        own = held_out(retriever, questions)  # and not through the question's own memory entry
    out: list[QuestionUnits] = []
    for q in questions:
        result = own.get(q.id, retriever).search(q.question, 5)
        sources, sims = answer_sources(index, result)
        cands = candidates(sources)
        if not cands or sims is None or len(sims) != len(cands):
            continue
        ask = split_question(result.query).ask
        evidence = [normalise(e) for e in q.evidence if normalise(e)]
        labels = np.array([any(e in normalise(c.unit.text) for e in evidence) for c in cands], dtype=np.int64)
        out.append(QuestionUnits(q.id, q.evidence, cands, unit_features(ask, cands, sims, result.seen_units), labels,
                                 unit_scores(ask, cands, sims, semantic_weight=SEMANTIC_WEIGHT)))
    return out


def fit(data: list[QuestionUnits], c: float, trained_on: str = "", encoder: str = "") -> LinearModel:
    from sklearn.linear_model import LogisticRegression

    x = np.vstack([d.rows for d in data])
    y = np.concatenate([d.labels for d in data])
    if not y.any():
        raise ValueError("no tune question has a unit holding its evidence: nothing to learn from")
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    lr = LogisticRegression(C=c, class_weight="balanced", max_iter=5000).fit((x - mean) / scale, y)
    return LinearModel(UNIT_FEATURES, mean, scale, lr.coef_[0].astype(np.float64), float(lr.intercept_[0]),
                       trained_on, encoder=encoder)


def evidence_share(data: list[QuestionUnits], score: Any) -> float:
    """Share of questions whose composed answer (units ordered by `score(d)`) holds a gold phrase."""
    hits = 0
    for d in data:
        answer = normalise(compose(d.cands, score(d)))
        hits += any(normalise(e) in answer for e in d.evidence if normalise(e))
    return hits / max(len(data), 1)


def probability(model: LinearModel, rows: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-model.score(rows)))


def choose_c(data: list[QuestionUnits]) -> tuple[float, dict[float, float]]:
    fold_of = [hash_fold(d.id, FOLDS) for d in data]
    results: dict[float, float] = {}
    for c in C_GRID:
        total = 0.0
        for f in range(FOLDS):
            train = [d for d, k in zip(data, fold_of, strict=True) if k != f]
            held = [d for d, k in zip(data, fold_of, strict=True) if k == f]
            if train and held:
                model = fit(train, c)
                total += evidence_share(held, lambda d, m=model: probability(m, d.rows)) * len(held)
        results[c] = total / max(len(data), 1)
    return max(results, key=lambda c: (results[c], -c)), results


def train_answer_units(engine: Engine, tune: list[Question], out: Path = UNIT_MODEL_FILE) -> dict[str, Any]:
    if any(split_of(q.id) != "tune" for q in tune):
        raise ValueError("the answer unit scorer is trained on tune questions only")
    _, retriever = engine.require()
    data = question_units(engine, tune)
    c, cv = choose_c(data)
    if not isinstance(retriever, HybridRetriever):
        raise TypeError("the answer unit scorer is trained over the shipped hybrid retriever")
    encoder = retriever.embedder.name
    model = fit(data, c, f"tune split, {len(data)} questions, C={c}", encoder=encoder)
    model.save(out)
    return {
        "questions": len(data),
        "with_relevant_unit": sum(1 for d in data if d.labels.any()),
        "C": c,
        "cv_evidence_in_answer": {str(k): round(v, 4) for k, v in cv.items()},
        "hand_weights_evidence_in_answer": round(evidence_share(data, lambda d: d.hand), 4),
        "weights": dict(zip(UNIT_FEATURES, model.weights.round(3).tolist(), strict=True)),
        "out": str(out),
    }
