"""Retrieval quality on the dev set with the real model and the real index (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.api import load_engine
from app.retriever import Bm25Retriever, HybridRetriever
from app.settings import Settings
from eval.metrics import evaluate, load_questions
from eval.retrieval_eval import search_fn

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scores(real_index: Path, embedder, dev_questions: Path) -> dict[str, dict]:
    engine = load_engine(Settings(index_dir=real_index), embedder)
    assert isinstance(engine.retriever, HybridRetriever) and engine.index is not None
    questions = load_questions(dev_questions)
    _, shipped = evaluate(questions, search_fn(engine.retriever, engine.index))
    r = engine.retriever
    _, bm25 = evaluate(questions, search_fn(Bm25Retriever(r.index, r.embedder, r.glossary), engine.index))
    print("\nshipped", shipped, "\nbm25", bm25)
    return {"shipped": shipped, "bm25": bm25}


def test_floors_on_dev_set(scores: dict[str, dict]) -> None:
    s = scores["shipped"]
    assert s["en"]["hit@5"] >= 0.95
    assert s["zh"]["hit@5"] >= 0.85
    assert s["all"]["mrr@10"] >= 0.80
    assert s["all"]["median_top5_words"] <= 350
    assert s["all"]["mention_share"] >= 0.85


def test_shipped_retriever_beats_bm25_alone(scores: dict[str, dict]) -> None:
    s, b = scores["shipped"]["all"], scores["bm25"]["all"]
    assert s["mrr@10"] > b["mrr@10"]
    assert s["hit@1"] > b["hit@1"]
    assert s["hit@5"] >= b["hit@5"]


def test_catalogue_answers_a_config_key(real_index: Path, embedder) -> None:
    engine = load_engine(Settings(index_dir=real_index), embedder)
    assert engine.retriever is not None
    hits = engine.retriever.search("what does stage3_max_live_parameters do", 5).hits
    assert any(h.chunk.source == "config" and "zero_optimization.stage3_max_live_parameters" in h.chunk.text for h in hits)
