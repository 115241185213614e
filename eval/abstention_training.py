"""`dsqa eval train-abstention`: fit the coverage decision on tune questions only.

Positives: the `tune` split of our answerable questions; negatives: the `tune` half of
`eval/unanswerable.jsonl` (split by the same id hash) and the training-only unanswerable questions
(`eval/training/unanswerable/`, never scored). A balanced logistic regression over the
coverage signals (`app/coverage.py`); its threshold is the split-conformal quantile of the answerable
tune questions' scores at CONFORMAL_ALPHA, per question group (`app.query.coverage_group`: the terse
ones, from the terse sets' tune halves, get their own). Written to `app/abstention.json`, with the refusal memory
(`app/refusal_memory.py`: the unanswerable questions' vectors, the leaning probe over question vectors
and the wording probe over the ask's character n-grams, `app/wording_probe.py`) beside it; an
unanswerable training question's resemblance leaves out its own entry, and every training question's
two leanings come from probes fitted without its fold (PROBE_FOLDS, by a hash of the id), as a new
question's would (`fit_decision`). The trainer also reports `cross_validate`: the same fit on four
assignments of five folds, the held-out shares refused per conformal quantile (the choice of
CONFORMAL_ALPHA).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.char_tfidf import fit_char_tfidf
from app.coverage import ABSTENTION_FILE, COVERAGE_FEATURES
from app.linear_model import LinearModel
from app.query import TERSE, coverage_group
from app.refusal_memory import REFUSAL_MEMORY_FILE, RefusalMemory, excess, probe_logit
from app.retriever import COVERAGE_DEPTH, HybridRetriever
from app.wording_probe import WordingProbe, wording
from eval.adapter_training import base_vectors
from eval.answer_quality import Unanswerable
from eval.metrics import Question
from eval.question_set import hash_fold, split_of

# the quantile of the answerable tune questions' scores the threshold sits at: the split-conformal
# quantile, the largest of CV_ALPHAS whose cross-validated false refusals stay under issue 10's 3% with a
# margin (`cross_validate`: 374 answerable, 299 unanswerable, the 626 training-only ones always in the fitted
# part). Held-out answerable refused / unanswerable refused at 1.5%, 1.75%, 2%, 2.5% with the wording probe
# (stop 48): 2.1% / 91.8%, 2.2% / 92.5%, 2.4% / 92.8%, 2.7% / 93.9% (2% would now stay under the margin too,
# for 0.3 points more refused: kept); just before it 1.8% / 85.9%, 2.0% / 87.9%, 2.7% / 88.8%, 3.5% / 91.6%.
# When 1.75% was chosen: 1.6% / 82.9%, 2.4% / 84.8%, 3.0% / 85.6%, 3.7% / 88.0%; without the training-only
# ones 1.4% / 79.6%, 1.8% / 82.5%, 2.0% / 82.8%, 3.4% / 86.7%. With the terse sets' tune halves (stop 52), long
# questions at 1.5%, 1.75%, 2%, 2.5%: 1.83% / 92.4%, 1.96% / 92.9%, 2.33% / 93.1%, 2.65% / 93.9%; terse ones
# 2.15% / 80.8% at each but the last (2.15% / 82.3%): 1.75% kept. (151 training-only terse unanswerable ones
# as well gave, at 1.75%, long 2.15% / 93.6% and terse 1.87% / 80.0%: level, not kept.)
CONFORMAL_ALPHA = 0.0175
# the leaning probe: a balanced logistic regression over base question vectors, its training values
# cross-fitted over PROBE_FOLDS; PROBE_C by the same cross-validation on tune (unanswerable refused at the
# 1.5% quantile: C 0.03 82.4%, 0.1 82.5%, 0.3 82.7%, 1 83.4%; 81.8% without the leaning)
PROBE_C = 1.0
PROBE_FOLDS = 5
MIN_GROUP = 30  # answerable questions a group needs for a threshold of its own
# the wording probe's regularisation (`app/wording_probe.py`), by the same cross-validation (refused at the
# 1.75% quantile / held-out answerable refused): C 0.3 90.9% / 2.17%, 1 90.7% / 2.11%, 3 90.4% / 2.11%;
# 87.3% / 2.10% without it (n-grams in at least 1, 2, 3 questions: 92.2%, 92.5%, 92.3%, `app/char_tfidf.MIN_DF`)
WORDING_C = 1.0
CV_FOLDS, CV_ASSIGNMENTS = 5, 4
# signals tried beside COVERAGE_FEATURES and not kept (stop 55; long questions at the 1.75% quantile, 93.0% refused
# at 1.96% false without them): the best answer unit's probability (its AUC alone 0.81) 93.15% at 1.90%; another
# library named (horovod, vLLM, ...) that none of the first five passages names 93.38% at 1.96%; the idf-weighted
# share of the ask's terms missing from the first five 92.52% at 2.31%. A gradient-boosted decision (depth 3) in
# place of the logistic regression, both thresholded on out-of-fold scores: 80.1% against 90.8% refused.
CV_ALPHAS = (0.015, 0.0175, 0.02, 0.025)


def fit_wording(questions: list[str], unanswerable: np.ndarray) -> WordingProbe:
    """A balanced logistic regression over the TF-IDF of the asks' character n-grams, as `WordingProbe`
    reads them: its logit leans toward unanswerable."""
    from sklearn.linear_model import LogisticRegression

    tfidf, x = fit_char_tfidf([wording(q) for q in questions])
    # the model's logit leans toward the class labelled 1, here unanswerable
    lr = LogisticRegression(C=WORDING_C, class_weight="balanced", max_iter=5000).fit(x, unanswerable)
    return WordingProbe(tfidf, lr.coef_[0].astype(np.float64), float(lr.intercept_[0]))


def crossfit_wording(questions: list[str], unanswerable: np.ndarray, ids: list[str]) -> np.ndarray:
    """Each question's wording leaning from a probe fitted without its fold."""
    def held_out(held: np.ndarray) -> list[float]:
        probe = fit_wording(_kept(questions, ~held), unanswerable[~held])
        return [probe.logit(q) for q in _kept(questions, held)]

    return _crossfit(ids, held_out)


def _crossfit(ids: list[str], held_out: Callable[[np.ndarray], Any]) -> np.ndarray:
    """Per row, the value `held_out(mask)` gives the rows of its fold (PROBE_FOLDS, by a hash of the id)
    from a probe fitted on the other folds."""
    folds = np.array([hash_fold(i, PROBE_FOLDS) for i in ids])
    out = np.zeros(len(ids))
    for f in range(PROBE_FOLDS):
        held = folds == f
        if held.any():
            out[held] = held_out(held)
    return out


def fit_probe(vectors: np.ndarray, unanswerable: np.ndarray) -> np.ndarray:
    """Weights then bias of a balanced logistic regression: its logit leans toward unanswerable."""
    from sklearn.linear_model import LogisticRegression

    lr = LogisticRegression(C=PROBE_C, class_weight="balanced", max_iter=5000).fit(vectors, unanswerable)
    return np.r_[lr.coef_[0], lr.intercept_[0]].astype(np.float64)


def crossfit_leaning(vectors: np.ndarray, unanswerable: np.ndarray, ids: list[str]) -> np.ndarray:
    """Each question's leaning from a probe fitted without its fold."""
    return _crossfit(ids, lambda held: probe_logit(fit_probe(vectors[~held], unanswerable[~held]), vectors[held]))


def coverage_rows(retriever: HybridRetriever, questions: list[str], own: list[HybridRetriever] | None = None) -> np.ndarray:
    """`own`: per question, the retriever to search with (the cross-fitted query adapters). The refusal
    memory is the retriever's (its column is missing, NaN, without one)."""
    searchers = own if own is not None else [retriever] * len(questions)
    rows = []
    for text, searcher in zip(questions, searchers, strict=True):
        plain = searcher.with_options(abstention=None)
        _, q = plain.signals(text)
        ids = plain.candidates(q)
        top = plain.select(ids, plain.score(ids, q), COVERAGE_DEPTH)
        rows.append(plain.coverage_row(q, ids, top))
    return np.vstack(rows)


@dataclass(frozen=True)
class FittedDecision:
    """The coverage decision fitted on some rows: the logistic regression over standardised features,
    its threshold, and the refusal memory's vectors and leaning probe it was fitted with."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: float
    threshold: float
    memory: np.ndarray  # the remembered unanswerable questions' base vectors
    probe: np.ndarray
    wording: WordingProbe
    group_thresholds: dict[str, float]  # a question group's own threshold (`app.query.coverage_group`)

    def model(self, trained_on: str = "", encoder: str = "") -> LinearModel:
        """The decision as the retriever loads it: its weights and thresholds (the memory columns aside)."""
        return LinearModel(COVERAGE_FEATURES, self.mean, self.scale, self.weights, self.bias, trained_on, encoder=encoder,
                           threshold=self.threshold, group_thresholds=self.group_thresholds)

    def refused(self, rows: np.ndarray, vectors: np.ndarray, questions: list[str]) -> np.ndarray:
        """Whether each new question is refused: its score below its group's threshold."""
        model = self.model()
        limits = np.array([model.threshold_for(coverage_group(q)) for q in questions])
        return self.scores(rows, vectors, questions, model) < limits

    def scores(self, rows: np.ndarray, vectors: np.ndarray, questions: list[str], model: LinearModel | None = None) -> np.ndarray:
        """Scores of new questions (coverage rows, base vectors, texts): their memory columns from this fit's.
        `model`: this fit's `model()` when the caller has built it already."""
        rows = rows.copy()
        rows[:, _BEST] = _resemblance(vectors @ self.memory.T)
        rows[:, _LEANING] = probe_logit(self.probe, vectors.astype(np.float64))
        rows[:, _WORDING] = [self.wording.logit(q) for q in questions]
        return (model if model is not None else self.model()).score(rows)


_BEST = COVERAGE_FEATURES.index("refused_best")
_LEANING = COVERAGE_FEATURES.index("refused_leaning")
_WORDING = COVERAGE_FEATURES.index("refused_wording")


def _resemblance(cosines: np.ndarray) -> list[float]:
    """Each row's resemblance to the refusal memory from its cosines with the remembered questions (columns)."""
    return [excess(float(c)) for c in cosines.max(axis=1)]


def fit_decision(pos: np.ndarray, neg: np.ndarray, pos_vectors: np.ndarray, neg_vectors: np.ndarray,
                 ids: list[str], questions: list[str], alpha: float = CONFORMAL_ALPHA) -> tuple[FittedDecision, np.ndarray, np.ndarray]:
    """Fit on answerable (`pos`) and unanswerable (`neg`, all remembered) rows; `ids` and `questions` name
    and hold the pos then the neg rows' questions (the probes' folds and texts). Each unanswerable row's
    resemblance leaves out its own entry and every row's two leanings come from probes fitted without its
    fold, as a new question's would. Returns the fit and the pos and neg rows with their memory columns filled."""
    from sklearn.linear_model import LogisticRegression

    pos, neg = pos.copy(), neg.copy()
    pos[:, _BEST] = _resemblance(pos_vectors @ neg_vectors.T)
    among = neg_vectors @ neg_vectors.T
    np.fill_diagonal(among, -np.inf)  # a remembered question does not resemble itself
    neg[:, _BEST] = _resemblance(among)
    vectors = np.vstack([pos_vectors, neg_vectors]).astype(np.float64)
    leans_out = np.r_[np.zeros(len(pos)), np.ones(len(neg))]
    leaning = crossfit_leaning(vectors, leans_out, ids)
    pos[:, _LEANING], neg[:, _LEANING] = leaning[:len(pos)], leaning[len(pos):]
    words = crossfit_wording(questions, leans_out, ids)
    pos[:, _WORDING], neg[:, _WORDING] = words[:len(pos)], words[len(pos):]
    x = np.vstack([pos, neg])
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    lr = LogisticRegression(C=1.0, class_weight="balanced", max_iter=5000).fit((x - mean) / scale, np.r_[np.ones(len(pos)), np.zeros(len(neg))])
    weights, bias = lr.coef_[0].astype(np.float64), float(lr.intercept_[0])
    pos_scores = ((pos - mean) / scale) @ weights + bias
    # each group's threshold from its own answerable questions (Mondrian conformal): a terse question scores
    # lower than a long one that the docs answer as well, so one threshold refused 38.6% of the terse
    # answerable ones in tune's cross-validation (2.3% of the others)
    groups = np.array([coverage_group(q) for q in questions[:len(pos)]])
    thresholds = {str(g): _conformal(pos_scores[groups == g], alpha) for g in set(groups.tolist())
                  if g == "" or (groups == g).sum() >= MIN_GROUP}
    threshold = thresholds.pop("", None)
    fitted = FittedDecision(mean, scale, weights, bias, _conformal(pos_scores, alpha) if threshold is None else threshold, neg_vectors,
                            fit_probe(vectors, leans_out), fit_wording(questions, leans_out), thresholds)
    return fitted, pos, neg


def _conformal(scores: np.ndarray, alpha: float) -> float:
    """The split-conformal quantile: with k = floor(alpha (n + 1)), refusing below the k-th smallest score
    refuses a new answerable question with probability at most alpha (the plain quantile, floor(alpha n)
    + 1, gave 2.9% on tune and more on unseen questions)."""
    k = max(int(np.floor(alpha * (len(scores) + 1))), 1)
    return float(np.sort(scores)[k - 1])


def cross_validate(pos: np.ndarray, neg: np.ndarray, pos_vectors: np.ndarray, neg_vectors: np.ndarray,
                   pos_ids: list[str], neg_ids: list[str], pos_questions: list[str], neg_questions: list[str], kept: int,
                   alphas: tuple[float, ...] = CV_ALPHAS) -> dict[str, Any]:
    """Per conformal alpha, the held-out answerable and unanswerable shares refused: CV_FOLDS folds of the
    first `kept` unanswerable rows and of every answerable one, CV_ASSIGNMENTS fold assignments (by a hash
    of the id); the unanswerable rows after `kept` (training-only) are always in the fitted part."""
    out: dict[str, Any] = {}
    for alpha in alphas:
        false, refused = [], []
        for assignment in range(CV_ASSIGNMENTS):
            pos_fold = np.array([hash_fold(f"{assignment}:{i}", CV_FOLDS) for i in pos_ids])
            neg_fold = np.array([hash_fold(f"{assignment}:{i}", CV_FOLDS) if n < kept else -1 for n, i in enumerate(neg_ids)])
            for fold in range(CV_FOLDS):
                p, n = pos_fold != fold, neg_fold != fold
                fitted, _, _ = fit_decision(pos[p], neg[n], pos_vectors[p], neg_vectors[n], _kept(pos_ids, p) + _kept(neg_ids, n),
                                            _kept(pos_questions, p) + _kept(neg_questions, n), alpha)
                false.append(_by_group(fitted.refused(pos[~p], pos_vectors[~p], _kept(pos_questions, ~p)), _kept(pos_questions, ~p)))
                refused.append(_by_group(fitted.refused(neg[~n], neg_vectors[~n], _kept(neg_questions, ~n)), _kept(neg_questions, ~n)))
        out[str(alpha)] = {"false_abstention": _mean_of(false, ""), "abstention": _mean_of(refused, ""),
                           **({f"{TERSE}_false_abstention": _mean_of(false, TERSE), f"{TERSE}_abstention": _mean_of(refused, TERSE)}
                              if any(TERSE in f for f in false) else {})}
    return out


def _by_group(refused: np.ndarray, questions: list[str]) -> dict[str, float]:
    """The share refused per question group, over the groups present."""
    groups = np.array([coverage_group(q) for q in questions])
    return {str(g): float(refused[groups == g].mean()) for g in set(groups.tolist())}


def _mean_of(shares: list[dict[str, float]], group: str) -> float:
    return round(float(np.mean([s[group] for s in shares if group in s])), 4)


def _kept(items: list[str], mask: np.ndarray) -> list[str]:
    return [x for x, k in zip(items, mask, strict=True) if k]


def train_abstention(retriever: HybridRetriever, answerable: list[Question], unanswerable: list[Unanswerable],
                     out: Path = ABSTENTION_FILE, training_only: list[Unanswerable] | None = None, *,
                     with_cv: bool = True, terse: list[Question] | None = None) -> dict[str, Any]:
    """Writes the decision to `out` and the refusal memory beside it (REFUSAL_MEMORY_FILE's name).
    `training_only`: further unanswerable questions no set scores, learned from like tune's. `terse`: the
    tune split of the terse answerable questions (`eval/terse/`; searched as they come, since no query
    adapter or question memory learned them; their unanswerable ones come in `unanswerable`). `with_cv`:
    also report the cross-validated shares refused (`cross_validate`, about half a minute)."""

    terse = list(terse or [])
    if any(split_of(q.id) != "tune" for q in answerable + terse) or any(split_of(u.id) != "tune" for u in unanswerable):
        raise ValueError("the coverage decision is trained on tune questions only")
    tune_unanswerable = len(unanswerable)
    unanswerable = unanswerable + list(training_only or [])
    retriever = retriever.with_options(refusal_memory=None)  # the resemblance column is filled below, each leaving itself out
    # with a query adapter, an answerable tune question is searched through one fitted without it (an
    # adapter's cosines are higher on the questions it was fitted on than on any new question)
    # and with a question memory, through one that leaves out the question and its thread (its own
    # entry would make every answerable tune question look already answered)
    if retriever.options.query_adapter is not None:
        from eval.adapter_training import crossfit

        by_id = crossfit(retriever, answerable)
    else:
        from eval.memory_training import held_out

        by_id = held_out(retriever, answerable)
    own = [by_id[q.id] for q in answerable] + [retriever] * len(terse)
    answerable = answerable + terse
    pos = coverage_rows(retriever, [q.question for q in answerable], own)
    neg = coverage_rows(retriever, [u.question for u in unanswerable])
    pos_vectors = base_vectors(retriever, [q.question for q in answerable])
    neg_vectors = base_vectors(retriever, [u.question for u in unanswerable])
    pos_ids, neg_ids = [q.id for q in answerable], [u.id for u in unanswerable]
    pos_questions, neg_questions = [q.question for q in answerable], [u.question for u in unanswerable]
    fitted, pos, neg = fit_decision(pos, neg, pos_vectors, neg_vectors, pos_ids + neg_ids, pos_questions + neg_questions)
    model = fitted.model(f"tune split: {len(pos)} answerable, {len(neg)} unanswerable", retriever.embedder.name)
    model.save(out)
    refusals = RefusalMemory(neg_vectors, retriever.embedder.name,
                             f"tune split, {tune_unanswerable} unanswerable questions, {len(unanswerable) - tune_unanswerable} training-only",
                             probe=fitted.probe, wording=fitted.wording)
    memory_out = refusals.save(Path(out).with_name(REFUSAL_MEMORY_FILE.name))
    pos_refused = fitted.refused(pos, pos_vectors, pos_questions)
    neg_refused = fitted.refused(neg[:tune_unanswerable], neg_vectors[:tune_unanswerable], neg_questions[:tune_unanswerable])
    cv = cross_validate(pos, neg, pos_vectors, neg_vectors, pos_ids, neg_ids, pos_questions, neg_questions,
                        tune_unanswerable) if with_cv else None
    return {
        "answerable": len(pos),
        "unanswerable": tune_unanswerable,
        "unanswerable_training_only": len(neg) - tune_unanswerable,
        "threshold": round(fitted.threshold, 4),
        "group_thresholds": {g: round(t, 4) for g, t in fitted.group_thresholds.items()},
        "tune_false_abstention": _by_group(pos_refused, pos_questions),
        "tune_abstention": _by_group(neg_refused, neg_questions[:tune_unanswerable]),
        "cv": cv,
        "weights": dict(zip(COVERAGE_FEATURES, model.weights.round(3).tolist(), strict=True)),
        "out": str(out),
        "refusal_memory": str(memory_out),
    }


def train_on_tune(retriever: HybridRetriever, out: Path = ABSTENTION_FILE, *, with_cv: bool = True) -> dict[str, Any]:
    """`train_abstention` on what it learns from: the tune split of the answerable questions, of
    `eval/unanswerable.jsonl` and of the terse sets (`eval/terse/`), and the training-only unanswerable ones."""
    from eval.answer_quality import TERSE_UNANSWERABLE, load_training_unanswerable, load_unanswerable
    from eval.metrics import load_questions
    from eval.question_set import TERSE_QUESTIONS, load_split

    unanswerable = [u for u in load_unanswerable() + load_unanswerable(TERSE_UNANSWERABLE) if split_of(u.id) == "tune"]
    terse = [q for q in load_questions(TERSE_QUESTIONS) if split_of(q.id) == "tune"]
    return train_abstention(retriever, load_split("tune"), unanswerable, out, training_only=load_training_unanswerable(),
                            with_cv=with_cv, terse=terse)
