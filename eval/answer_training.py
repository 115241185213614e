"""`dsqa eval train-answer`: fit the choice of answer units on the `tune` split only.

For each tune question the shipped retriever's first passages give the candidate units
(`app/answer.py`); a unit is relevant when it holds a gold evidence phrase (the project's one
rule, `eval/metrics.py`). The unit adapter (`eval/unit_adapter_training.py`) is fitted first; the
scorer reads its cosines, cross-fitted (each question's from an adapter fitted without its fold, as a
new question would get them). Gradient-boosted trees over UNIT_FEATURES are fitted (`app/tree_model.py`),
relevant and other units weighing half each; their number is chosen by 5-fold cross-validation over tune
questions, scored by what the reader gets: the share of composed answers that hold a gold phrase. Written
to `app/answer_units.json` and `app/unit_adapter.npz`. The `test` split is never read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
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
from app.ask import source_units
from app.engine import Engine
from app.query import split_question
from app.query_adapter import UNIT_ADAPTER_FILE, QueryAdapter
from app.retriever import HybridRetriever
from app.tree_model import TreeModel
from eval.metrics import Question, normalise
from eval.question_set import hash_fold, split_of
from eval.unit_adapter_training import UNIT_LAMBDA, UNIT_TEMPERATURE, fit_unit_delta

# the trees, chosen on tune's cross-validation at stop 70 (a linear model over the same features: 0.7754; trees
# without stopping early at 100 / 200 / 300 at most: 0.7781 / 0.7807 / 0.7701, with it 0.7807 / 0.7914 / 0.7914;
# depth 2 / 3 / 4 at 200: 0.7781 / 0.7914 / 0.7861; 60 / 80 / 120 units per leaf at least: 0.7807 / 0.7914 / 0.7888;
# once the adapter and memory also learnt issues_f and _g's 121 thread questions: 0.7888 / 0.7807 / 0.7834, 100 chosen)
TREES_GRID = (100, 200, 300)
TREE_DEPTH = 3
LEARNING_RATE = 0.05
MIN_LEAF = 80
L2 = 1.0
MARGIN = 0.01  # a share of the tune questions: about 4 of 374
FOLDS = 5


@dataclass(frozen=True)
class QuestionUnits:
    id: str
    evidence: tuple[str, ...]
    cands: list[Candidate]
    rows: np.ndarray
    labels: np.ndarray
    hand: np.ndarray  # the hand-weighted scores, for the report
    ask: str
    seen: Mapping[str, float] | None  # the search's `seen_units`
    query_vector: np.ndarray  # the searched vector
    unit_vectors: np.ndarray  # one row per candidate

    def adapted(self, delta: np.ndarray) -> QuestionUnits:
        """The same candidates with their features read through a unit adapter `delta`."""
        sims = self.unit_vectors @ QueryAdapter(delta, "").apply(self.query_vector)
        return replace(self, rows=unit_features(self.ask, self.cands, sims, self.seen))


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
        sources, vectors = source_units(index, result)
        cands = candidates(sources)
        if not cands or vectors is None or result.query_vector is None or len(vectors) != len(cands):
            continue
        sims = vectors @ result.query_vector
        ask = split_question(result.query).ask
        evidence = [normalise(e) for e in q.evidence if normalise(e)]
        labels = np.array([any(e in normalise(c.unit.text) for e in evidence) for c in cands], dtype=np.int64)
        out.append(QuestionUnits(q.id, q.evidence, cands, unit_features(ask, cands, sims, result.seen_units), labels,
                                 unit_scores(ask, cands, sims, semantic_weight=SEMANTIC_WEIGHT), ask, result.seen_units,
                                 np.array(result.query_vector, dtype=np.float32), np.array(vectors, dtype=np.float32)))
    return out


def fit(data: list[QuestionUnits], trees: int, trained_on: str = "", encoder: str = "") -> TreeModel:
    """Gradient-boosted trees over UNIT_FEATURES, relevant and other units weighing half each; at most `trees`,
    fewer when ten more in a row do not lower the loss on a tenth of the units held back (a fixed draw)."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    x = np.vstack([d.rows for d in data])
    y = np.concatenate([d.labels for d in data])
    if not y.any():
        raise ValueError("no tune question has a unit holding its evidence: nothing to learn from")
    weight = np.where(y == 1, 0.5 / y.mean(), 0.5 / (1 - y.mean()))
    model = HistGradientBoostingClassifier(max_depth=TREE_DEPTH, learning_rate=LEARNING_RATE, max_iter=trees,
                                           min_samples_leaf=MIN_LEAF, l2_regularization=L2, early_stopping=True,
                                           random_state=0).fit(x, y, sample_weight=weight)
    return TreeModel.from_sklearn(model, UNIT_FEATURES, trained_on, encoder=encoder)


def evidence_hits(data: list[QuestionUnits], score: Any) -> int:
    """How many questions' composed answers (units ordered by `score(d)`) hold a gold phrase."""
    hits = 0
    for d in data:
        answer = normalise(compose(d.cands, score(d)))
        hits += any(normalise(e) in answer for e in d.evidence if normalise(e))
    return hits


def evidence_share(data: list[QuestionUnits], score: Any) -> float:
    """Share of questions whose composed answer holds a gold phrase (`evidence_hits`)."""
    return evidence_hits(data, score) / max(len(data), 1)


def probability(model: TreeModel, rows: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-model.score(rows)))


def choose_trees(data: list[QuestionUnits]) -> tuple[int, dict[int, float]]:
    """The number of trees: the fewest within MARGIN of the best cross-validated evidence share."""
    fold_of = [hash_fold(d.id, FOLDS) for d in data]
    results: dict[int, float] = {}
    for trees in TREES_GRID:
        total = 0
        for f in range(FOLDS):
            train = [d for d, k in zip(data, fold_of, strict=True) if k != f]
            held = [d for d, k in zip(data, fold_of, strict=True) if k == f]
            if train and held:
                model = fit(train, trees)
                # a count, not a float sum of shares: float noise once decided between settings with as many
                # answers right
                total += evidence_hits(held, lambda d, m=model: probability(m, d.rows))
        results[trees] = total / max(len(data), 1)
    best = max(results.values())
    # the fewest trees within MARGIN of the best: counts a question or two apart swap between machines
    return min(t for t in results if results[t] >= best - MARGIN), results


def unit_delta(data: list[QuestionUnits]) -> np.ndarray:
    return fit_unit_delta([d.query_vector for d in data], [d.unit_vectors for d in data], [d.labels for d in data])


def crossfit_adapted(data: list[QuestionUnits]) -> list[QuestionUnits]:
    """Each question's candidates read through a unit adapter fitted without its fold."""
    fold_of = [hash_fold(d.id, FOLDS) for d in data]
    out: list[QuestionUnits | None] = [None] * len(data)
    for f in range(FOLDS):
        train = [d for d, k in zip(data, fold_of, strict=True) if k != f]
        if not any(k == f for k in fold_of):
            continue
        delta = unit_delta(train)
        for i, (d, k) in enumerate(zip(data, fold_of, strict=True)):
            if k == f:
                out[i] = d.adapted(delta)
    return [d for d in out if d is not None]


def train_answer_units(engine: Engine, tune: list[Question], out: Path = UNIT_MODEL_FILE) -> dict[str, Any]:
    """Writes the scorer to `out` and the unit adapter beside it (UNIT_ADAPTER_FILE's name)."""
    adapter_out = Path(out).with_name(UNIT_ADAPTER_FILE.name)
    if any(split_of(q.id) != "tune" for q in tune):
        raise ValueError("the answer unit scorer is trained on tune questions only")
    _, retriever = engine.require()
    if not isinstance(retriever, HybridRetriever):
        raise TypeError("the answer unit scorer is trained over the shipped hybrid retriever")
    data = question_units(engine, tune)
    _, base_cv = choose_trees(data)  # the report: without the unit adapter
    crossfitted = crossfit_adapted(data)
    trees, cv = choose_trees(crossfitted)
    encoder = retriever.embedder.name
    adapter = QueryAdapter(unit_delta(data), encoder, f"tune split, {len(data)} questions, lambda={UNIT_LAMBDA}, "
                                                      f"temperature={UNIT_TEMPERATURE}")
    adapter.save(adapter_out)
    # the scorer learns from cross-fitted adapter cosines: what a question the adapter never saw gets
    model = fit(crossfitted, trees, f"tune split, {len(data)} questions, {trees} trees of depth {TREE_DEPTH}, unit adapter cosines "
                "cross-fitted", encoder=encoder)
    model.save(out)
    return {
        "questions": len(data),
        "with_relevant_unit": sum(1 for d in data if d.labels.any()),
        "trees": trees,
        "trees_fitted": len(model.feature),  # fewer when stopped early
        "cv_evidence_in_answer": {str(k): round(v, 4) for k, v in cv.items()},
        "cv_evidence_in_answer_without_unit_adapter": {str(k): round(v, 4) for k, v in base_cv.items()},
        "hand_weights_evidence_in_answer": round(evidence_share(data, lambda d: d.hand), 4),
        "out": str(out),
        "unit_adapter": str(adapter_out),
    }
