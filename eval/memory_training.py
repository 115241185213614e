"""`dsqa eval train-memory`: the question memory (`app/question_memory.py`) from the `tune` split only.

Each tune question, and each training-only question of `eval/training/`, becomes one entry: the encoder's base vector of its searched text, the TF-IDF of its character n-grams, the keys of the
chunks whose passage holds one of its gold phrases (the project's one relevance rule, as the query
adapter's positives), its id and its origin. Nothing is fitted: the ranker learns how far to trust the
memory (`dsqa eval train-ranker`, run after this), from rows where each tune question is searched
with its own entry and its thread's left out (`held_out`), as a new question would be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from app.char_tfidf import fit_char_tfidf
from app.question_memory import MEMORY_FILE, ChunkMemory, LexicalEntries, QuestionMemory, chunk_key
from app.retriever import HybridRetriever
from eval.adapter_training import base_vectors, positives
from eval.metrics import Question, normalise
from eval.question_set import load_training_questions, split_of


def build_memory(retriever: HybridRetriever, tune: list[Question], extra: list[Question] | None = None) -> QuestionMemory:
    """`extra`: the training-only questions, by default `eval/training/` (the query adapter learns from
    them too). With them the ranker's tune CV MRR@10 was 0.7566 against 0.7515 without."""
    if any(split_of(q.id) != "tune" for q in tune):
        raise ValueError("the question memory holds tune questions only")
    extra = load_training_questions(retriever.index.chunks) if extra is None else extra
    both = tune + extra
    keys = [chunk_key(c.text) for c in retriever.index.chunks]
    vectors = base_vectors(retriever, [q.question for q in both])
    answers = tuple(tuple(sorted({keys[i] for i in p})) for p in positives(retriever, both))
    tfidf, matrix = fit_char_tfidf([q.question for q in both])
    by_ngram = matrix.tocsc()
    lexical = LexicalEntries(tfidf, by_ngram.indptr.astype(np.int64), by_ngram.indices.astype(np.int64), by_ngram.data.astype(np.float64))
    return QuestionMemory(vectors, answers, tuple(q.id for q in both), tuple(q.origin for q in both),
                          retriever.embedder.name, f"tune split, {len(tune)} questions, {len(extra)} training-only",
                          units=answering_units(retriever, both), lexical=lexical)


def answering_units(retriever: HybridRetriever, questions: list[Question]) -> tuple[tuple[str, ...], ...]:
    """Per question, the keys of the index's text units (our notes' excepted) that hold one of its
    gold phrases (the project's one relevance rule, applied to a unit alone)."""
    index = retriever.index
    texts: dict[str, str] = {}
    for i, c in enumerate(index.chunks):
        if c.source != "notes":
            for u in index.chunk_units(i)[0]:
                texts.setdefault(chunk_key(u.text), normalise(u.text))
    out = []
    for q in questions:
        evidence = [e for e in (normalise(x) for x in q.evidence) if e]
        out.append(tuple(sorted(k for k, t in texts.items() if any(e in t for e in evidence))))
    return tuple(out)


def resolve(memory: QuestionMemory, retriever: HybridRetriever) -> ChunkMemory:
    return ChunkMemory(memory, [chunk_key(c.text) for c in retriever.index.chunks])


def held_out(retriever: HybridRetriever, questions: list[Question],
             per_question: dict[str, HybridRetriever] | None = None) -> dict[str, HybridRetriever]:
    """Question id -> the retriever (its own from `per_question` when given) whose memory leaves out the
    question itself and the other questions of its thread. Without a memory, the retriever unchanged."""
    out: dict[str, HybridRetriever] = {}
    for q in questions:
        own = per_question.get(q.id, retriever) if per_question else retriever
        memory = own.options.question_memory
        if memory is not None:
            own = own.with_options(question_memory=memory.without(memory.memory.related(q.id, q.origin)))
        out[q.id] = own
    return out


def train_memory(retriever: HybridRetriever, tune: list[Question], out: Path = MEMORY_FILE) -> dict[str, Any]:
    memory = build_memory(retriever, tune)
    memory.save(out)
    resolved = resolve(memory, retriever)
    return {
        "questions": len(tune),
        "training_only": len(memory.ids) - len(tune),
        "with_answering_chunk": resolved.resolved,
        "answering_chunks": len(resolved.chunk),
        "with_answering_unit": sum(1 for u in memory.units if u),
        "answering_units": len({k for u in memory.units for k in u}),
        "encoder": memory.encoder,
        "out": str(out),
    }
