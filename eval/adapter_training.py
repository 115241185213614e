"""`dsqa eval train-adapter`: fit the query adapter (`app/query_adapter.py`) on the `tune` split only.

For each tune question, its positives are the chunks whose passage (section span) holds a gold
evidence phrase (the project's one relevance rule); every other chunk of the index is a negative. The
adapter `delta` minimises the softmax cross-entropy of the adapted query's cosines over all chunks
(temperature TEMPERATURE) plus LAMBDA * |delta|^2, by full-batch L-BFGS from zero run to convergence
(~1 s on 2 cores): deterministic, and stable to the last bits of the inputs (an index built on another
machine gives the same adapter to 0.1%; a fixed number of Adam steps stopped short of the minimum and
moved 8% for a 1e-5 change of the vectors). LAMBDA and TEMPERATURE were chosen by 5-fold
cross-validation on tune, the ranker's held-out MRR@10 with cross-fitted adapters (0.7199 without an
adapter): temperature 0.02 / 0.03 / 0.05 / 0.1 at lambda 0.1: 0.7380 / 0.7433 / 0.7361 / 0.7258; at
temperature 0.03, lambda 0.03 / 0.1 / 0.3: 0.7443 / 0.7433 / 0.7441 (differences under 0.003 not taken).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.query_adapter import ADAPTER_FILE, QueryAdapter
from app.retriever import HybridRetriever
from eval.metrics import Question, normalise
from eval.question_set import hash_fold, load_training_questions, split_of

LAMBDA = 0.1
TEMPERATURE = 0.03
MAX_ITERATIONS = 100
FOLDS = 5


def positives(retriever: HybridRetriever, questions: list[Question]) -> list[list[int]]:
    """Per question, the chunks (not our notes) whose passage holds one of its evidence phrases."""
    chunks = retriever.index.chunks
    norm = [normalise(c.text) for c in chunks]
    span_text = [" ".join(norm[j] for j in retriever.section_span(i)) for i in range(len(chunks))]
    out = []
    for q in questions:
        evidence = [e for e in (normalise(x) for x in q.evidence) if e]
        out.append([i for i, c in enumerate(chunks) if c.source != "notes" and any(e in span_text[i] for e in evidence)])
    return out


def base_vectors(retriever: HybridRetriever, questions: list[str]) -> np.ndarray:
    """The encoder's vectors of the searched texts (the base vectors the adapter moves and the
    question and refusal memories hold)."""
    base = retriever.with_options(query_adapter=None)
    rows = []
    for text in questions:
        vector = base.signals(text)[1].query_vector
        if vector is None:
            raise ValueError("the retriever gave no query vector")
        rows.append(vector)
    return np.vstack(rows).astype(np.float32)


def positive_mask(pos: list[list[int]], chunks: int) -> Any:
    """A boolean tensor, one row per question: its positive chunks."""
    import torch

    mask = torch.zeros(len(pos), chunks, dtype=torch.bool)
    for row, p in enumerate(pos):
        mask[row, p] = True
    return mask


def passage_loss(queries: Any, matrix: Any, mask: Any) -> Any:
    """The mean softmax cross-entropy of unit query vectors' cosines over every chunk's vector
    (temperature TEMPERATURE), each row's positives those of `mask` (tensors in, a scalar tensor out)."""
    import torch

    logits = queries @ matrix.T / TEMPERATURE
    return (torch.logsumexp(logits, 1) - torch.logsumexp(logits.masked_fill(~mask, -1e9), 1)).mean()


def fit_delta(vectors: np.ndarray, pos: list[list[int]], matrix: np.ndarray, *, lam: float = LAMBDA) -> np.ndarray:
    import torch

    torch.manual_seed(0)
    keep = [i for i, p in enumerate(pos) if p]
    if not keep:
        raise ValueError("no tune question has a passage holding its evidence: nothing to learn from")
    q = torch.tensor(vectors[keep])
    m = torch.tensor(matrix.astype(np.float32))
    mask = positive_mask([pos[i] for i in keep], len(matrix))
    delta = torch.zeros(q.shape[1], q.shape[1], requires_grad=True)
    opt = torch.optim.LBFGS([delta], lr=1.0, max_iter=MAX_ITERATIONS, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        moved = torch.nn.functional.normalize(q + q @ delta, dim=1)
        loss = passage_loss(moved, m, mask) + lam * (delta ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)  # run to convergence: the same minimum whatever the last bits of the inputs
    return delta.detach().numpy().astype(np.float32)


def _dense_scores(vectors: np.ndarray, pos: list[list[int]], matrix: np.ndarray) -> tuple[float, float]:
    """hit@5 and MRR@10 of the dense ranking alone (chunks, not passages) over questions with positives."""
    hits = rr = 0.0
    n = 0
    for v, p in zip(vectors, pos, strict=True):
        if not p:
            continue
        n += 1
        order = np.argsort(-(matrix @ v))[:10]
        first = next((k for k, j in enumerate(order, 1) if j in p), None)
        hits += bool(first and first <= 5)
        rr += 1.0 / first if first else 0.0
    return hits / max(n, 1), rr / max(n, 1)


@dataclass(frozen=True)
class FoldFits:
    """The base vectors and positives of tune and the training-only questions (tune's first), each one's
    fold by a hash of its id, and per fold the delta fitted without that fold's questions: a training-only
    question's signals can then come from an adapter that never saw it, as a tune question's do."""

    vectors: np.ndarray
    pos: list[list[int]]
    folds: np.ndarray
    deltas: dict[int, np.ndarray]


# the last fold fits, by what they depend on: each training entry point (ranker, coverage decision,
# answer units) and the retrieval report's tune row needs the same five adapters (~15 s each time)
_FITS: dict[tuple[object, ...], tuple[HybridRetriever, FoldFits]] = {}


def fold_fits(retriever: HybridRetriever, tune: list[Question], extra: list[Question] | None = None) -> FoldFits:
    """`extra`: the training-only questions, by default `eval/training/`. Remembered for the same
    index, encoder, glossary, passages and questions (the retriever is kept with them, so its id is never
    another's)."""
    extra = load_training_questions(retriever.index.chunks) if extra is None else extra
    key = (id(retriever.index), id(retriever.embedder), id(retriever.glossary), retriever.options.section_words,
           retriever.options.split_ask, tuple((q.id, q.question, q.evidence) for q in tune + extra))
    if key in _FITS:
        return _FITS[key][1]
    fits = _fold_fits(retriever, tune, extra)
    _FITS.clear()  # one set of fits at a time: tests and the bench build several indexes
    _FITS[key] = (retriever, fits)
    return fits


def _fold_fits(retriever: HybridRetriever, tune: list[Question], extra: list[Question]) -> FoldFits:
    both = tune + extra
    vectors, pos = base_vectors(retriever, [q.question for q in both]), positives(retriever, both)
    folds = np.array([hash_fold(q.id, FOLDS) for q in both])
    deltas = {}
    for f in range(FOLDS):
        inside = np.flatnonzero(folds != f)
        deltas[f] = fit_delta(vectors[inside], [pos[i] for i in inside], retriever.matrix)
    return FoldFits(vectors, pos, folds, deltas)


def fold_adapters(retriever: HybridRetriever, tune: list[Question], extra: list[Question] | None = None) -> dict[int, QueryAdapter]:
    """Fold number -> the adapter fitted on the tune and training-only questions (`extra`, by default
    `eval/training/`) outside that fold."""
    fits = fold_fits(retriever, tune, extra)
    return {f: QueryAdapter(d, retriever.embedder.name, f"tune split without fold {f}") for f, d in fits.deltas.items()}


def crossfit(retriever: HybridRetriever, tune: list[Question], extra: list[Question] | None = None,
             also: Sequence[Question] = ()) -> dict[str, HybridRetriever]:
    """Question id (of tune, and of `also`: training-only questions) -> the retriever whose adapter never
    saw the question, and whose question memory does not hold it (`eval.memory_training.held_out`)."""
    from eval.memory_training import held_out

    by_fold = {f: retriever.with_options(query_adapter=a) for f, a in fold_adapters(retriever, tune, extra).items()}
    questions = tune + list(also)
    # and whose question memory leaves out its own entry and its thread's
    return held_out(retriever, questions, {q.id: by_fold[hash_fold(q.id, FOLDS)] for q in questions})


def train_adapter(retriever: HybridRetriever, tune: list[Question], out: Path = ADAPTER_FILE,
                  extra: list[Question] | None = None) -> dict[str, Any]:
    """Fitted on tune and the training-only questions (`extra`, by default `eval/training/`); the
    report's cross-validation holds out tune folds only."""
    if any(split_of(q.id) != "tune" for q in tune):
        raise ValueError("the query adapter is trained on tune questions only")
    extra = load_training_questions(retriever.index.chunks) if extra is None else extra
    fits = fold_fits(retriever, tune, extra)
    vectors, pos = fits.vectors, fits.pos
    held_base, held_adapted = np.zeros((FOLDS, 2)), np.zeros((FOLDS, 2))
    for f, delta in fits.deltas.items():
        held = np.flatnonzero(fits.folds[:len(tune)] == f)  # the report scores tune questions only
        adapter = QueryAdapter(delta, retriever.embedder.name)
        held_base[f] = _dense_scores(vectors[held], [pos[i] for i in held], retriever.matrix)
        held_adapted[f] = _dense_scores(adapter.apply(vectors[held]), [pos[i] for i in held], retriever.matrix)
    adapter = QueryAdapter(fit_delta(vectors, pos, retriever.matrix), retriever.embedder.name,
                           f"tune split, {len(tune)} questions, {len(extra)} training-only, lambda={LAMBDA}")
    adapter.save(out)
    return {
        "questions": len(tune),
        "training_only": len(extra),
        "with_positive": sum(1 for p in pos if p),
        "cv_dense_hit@5": {"base": round(float(held_base[:, 0].mean()), 4), "adapted": round(float(held_adapted[:, 0].mean()), 4)},
        "cv_dense_mrr@10": {"base": round(float(held_base[:, 1].mean()), 4), "adapted": round(float(held_adapted[:, 1].mean()), 4)},
        "delta_norm": round(float(np.linalg.norm(adapter.delta)), 4),
        "out": str(out),
    }
