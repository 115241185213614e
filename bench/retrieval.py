"""Retrieval benchmark: the shipped hybrid retriever against BM25 alone, measured in one run.

    .venv/bin/python bench/retrieval.py --questions ../shared/eval/dev.jsonl [--index var/index]

Prints each metric and its ratio to the BM25 baseline, plus query latency ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from app.engine import load_engine  # noqa: E402
from app.retriever import Bm25Retriever, HybridRetriever  # noqa: E402
from app.settings import Settings  # noqa: E402
from eval.metrics import evaluate, load_questions  # noqa: E402
from eval.retrieval_eval import search_fn  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=Path, required=True)
    ap.add_argument("--index", type=Path, default=Path("var/index"))
    args = ap.parse_args()
    engine = load_engine(Settings(index_dir=args.index))
    assert isinstance(engine.retriever, HybridRetriever) and engine.index is not None
    questions = load_questions(args.questions)
    hybrid = engine.retriever
    baseline = Bm25Retriever(hybrid.index, hybrid.embedder, hybrid.glossary)
    results = {}
    for name, retriever in (("bm25", baseline), ("shipped", hybrid)):
        fn = search_fn(retriever, engine.index)
        times = []
        for q in questions:
            t = time.perf_counter()
            fn(q.question)
            times.append(time.perf_counter() - t)
        _, summary = evaluate(questions, fn)
        results[name] = (summary["all"], statistics.median(times) * 1000)
    base, base_ms = results["bm25"]
    ship, ship_ms = results["shipped"]
    for key in ("hit@1", "hit@5", "hit@10", "mrr@10", "ndcg@10", "mention_share"):
        ratio = ship[key] / base[key] if base[key] else float("inf")
        print(f"{key:>14}: shipped {ship[key]:.3f}  bm25 {base[key]:.3f}  ratio {ratio:.2f}")
    print(f"{'p50 latency':>14}: shipped {ship_ms:.1f} ms  bm25 {base_ms:.1f} ms  ratio {ship_ms / base_ms:.2f}")


if __name__ == "__main__":
    main()
