"""`dsqa eval train-abstention`: fit the coverage decision on tune questions only.

Positives: the `tune` split of our answerable questions; negatives: the `tune` half of
`eval/unanswerable.jsonl` (split by the same id hash). A balanced logistic regression over the
coverage signals (`app/coverage.py`); its threshold is the split-conformal quantile of the answerable
tune questions' scores at CONFORMAL_ALPHA. Written to `app/abstention.json`, with the refusal memory
(`app/refusal_memory.py`: the tune unanswerable questions' vectors) beside it; an unanswerable training
question's resemblance leaves out its own entry.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from app.coverage import ABSTENTION_FILE, COVERAGE_FEATURES
from app.linear_model import LinearModel
from app.refusal_memory import REFUSAL_MEMORY_FILE, RefusalMemory, excess
from app.retriever import COVERAGE_DEPTH, HybridRetriever
from eval.adapter_training import base_vectors
from eval.answer_quality import Unanswerable
from eval.metrics import Question
from eval.question_set import split_of

# the quantile of the answerable tune questions' scores the threshold sits at: the split-conformal
# quantile, the largest whose cross-validated false refusals stay under issue 10's 3% with a margin (5-fold
# on tune, four fold assignments each; 374 answerable, 210 unanswerable). With `plan_or_figure`: held-out
# answerable refused / unanswerable refused at 1.5% 2.3% / 88.5%, at 1.8% 2.9% / 89.5%, at 2% 3.3% / 91.0%
# (C 0.3: 1.9% / 87.4%, 2.6% / 89.2%, 2.9% / 90.7%); with keyword arguments read as settings too, 2.2% /
# 89.3%, 2.8% / 90.5%, 3.2% / 91.6%. Before it, 2% gave 2.6% / 80.2%
CONFORMAL_ALPHA = 0.015


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


def train_abstention(retriever: HybridRetriever, answerable: list[Question], unanswerable: list[Unanswerable],
                     out: Path = ABSTENTION_FILE) -> dict[str, Any]:
    """Writes the decision to `out` and the refusal memory beside it (REFUSAL_MEMORY_FILE's name)."""
    from sklearn.linear_model import LogisticRegression

    if any(split_of(q.id) != "tune" for q in answerable) or any(split_of(u.id) != "tune" for u in unanswerable):
        raise ValueError("the coverage decision is trained on tune questions only")
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
    own = [by_id[q.id] for q in answerable]
    pos = coverage_rows(retriever, [q.question for q in answerable], own)
    neg = coverage_rows(retriever, [u.question for u in unanswerable])
    refusals = RefusalMemory(base_vectors(retriever, [u.question for u in unanswerable]), retriever.embedder.name,
                             f"tune split, {len(unanswerable)} unanswerable questions")
    column = COVERAGE_FEATURES.index("refused_best")
    pos[:, column] = [excess(float(c)) for c in refusals.cosines(base_vectors(retriever, [q.question for q in answerable])).max(axis=1)]
    among = refusals.cosines(refusals.vectors)
    np.fill_diagonal(among, -np.inf)  # a remembered question does not resemble itself
    neg[:, column] = [excess(float(c)) for c in among.max(axis=1)]
    x = np.vstack([pos, neg])
    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    lr = LogisticRegression(C=1.0, class_weight="balanced", max_iter=5000).fit((x - mean) / scale, y)
    model = LinearModel(COVERAGE_FEATURES, mean, scale, lr.coef_[0].astype(np.float64), float(lr.intercept_[0]),
                        f"tune split: {len(pos)} answerable, {len(neg)} unanswerable", encoder=retriever.embedder.name)
    pos_scores = np.sort(model.score(pos))
    # the split-conformal quantile: with k = floor(alpha (n + 1)), refusing below the k-th smallest score
    # refuses a new answerable question with probability at most alpha (the plain quantile, floor(alpha n)
    # + 1, gave 2.9% on tune and more on unseen questions)
    k = max(int(np.floor(CONFORMAL_ALPHA * (len(pos_scores) + 1))), 1)
    threshold = float(pos_scores[k - 1])
    model = replace(model, threshold=threshold)
    model.save(out)
    memory_out = refusals.save(Path(out).with_name(REFUSAL_MEMORY_FILE.name))
    neg_scores = model.score(neg)
    return {
        "answerable": len(pos),
        "unanswerable": len(neg),
        "threshold": round(threshold, 4),
        "tune_false_abstention": round(float((pos_scores < threshold).mean()), 4),
        "tune_abstention": round(float((neg_scores < threshold).mean()), 4),
        "weights": dict(zip(COVERAGE_FEATURES, model.weights.round(3).tolist(), strict=True)),
        "out": str(out),
        "refusal_memory": str(memory_out),
    }
