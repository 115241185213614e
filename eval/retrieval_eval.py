"""`dsqa eval retrieval`: load the index and model once, score the shipped retriever (and BM25)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.api import load_engine
from app.errors import IndexNotReady
from app.retriever import Bm25Retriever, HybridRetriever, Retriever
from app.settings import Settings
from eval.metrics import evaluate, load_questions
from indexer.store import LoadedIndex


def search_fn(retriever: Retriever, index: LoadedIndex, k: int = 10) -> Any:
    def fn(question: str) -> tuple[list[str], list[str]]:
        result = retriever.search(question, k)
        codes = [index.snippets[s].code for h in result.hits[:5] for s in h.chunk.snippet_ids if s in index.snippets]
        return [h.chunk.text for h in result.hits], codes

    return fn


def run_retrieval_eval(settings: Settings, questions_file: Path, *, baseline: bool = False) -> dict[str, Any]:
    questions = load_questions(questions_file)
    engine = load_engine(settings)
    if engine.index is None or engine.retriever is None:
        raise IndexNotReady(f"no usable index at {settings.index_dir}: build it with `dsqa index`")
    _, summary = evaluate(questions, search_fn(engine.retriever, engine.index))
    out: dict[str, Any] = {"shipped": summary["all"], **{f"shipped_{k}": v for k, v in summary.items() if k not in ("all",)}}
    if baseline and isinstance(engine.retriever, HybridRetriever):
        r = engine.retriever
        bm25 = Bm25Retriever(r.index, r.embedder, r.glossary)
        _, base = evaluate(questions, search_fn(bm25, engine.index))
        out["bm25"] = base["all"]
        out["bm25_misses@5"] = base["misses@5"]
    return out
