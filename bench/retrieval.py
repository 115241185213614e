"""Retrieval benchmark: the shipped retriever, its peers and its ablations, measured in one run on the
tune and test splits of our question set and on the dev set, as ratios to BM25 alone.

    .venv/bin/python bench/retrieval.py [--index var/index] [--dev ../shared/eval/dev.jsonl] [--no-ablation]

Peers: BM25 alone on our chunks, the base dense model alone, RRF of the two. Ablations: the shipped
retriever with one method taken out; where the method changes the ranker's inputs, the ranker is
retrained on `tune` without it (the `test` split is only scored). `tune` is cross-fitted through the
query adapter where one is used, `tune-in` in-sample (see `eval/retrieval_eval.py`). Also the query latency ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import bm25s  # noqa: E402

from app.engine import load_engine  # noqa: E402
from app.ranking import load_ranker  # noqa: E402
from app.retriever import HybridRetriever, RetrievalOptions, Retriever  # noqa: E402
from app.settings import Settings  # noqa: E402
from eval.question_set import QUESTIONS_DIR  # noqa: E402
from eval.ranker_training import train_ranker  # noqa: E402
from eval.retrieval_eval import peers, question_sets, score_sets, search_fn  # noqa: E402
from indexer.quiet import captured  # noqa: E402
from indexer.store import LoadedIndex  # noqa: E402
from indexer.tokenize import tokenize  # noqa: E402

METRICS = ("hit@1", "hit@5", "hit@10", "mrr@10", "ndcg@10")


def _plain_tokens(text: str) -> list[str]:
    return tokenize(text, expand=False)


def _without_expansion(index: LoadedIndex) -> LoadedIndex:
    """The same index with a BM25 built from tokens without abbreviation words."""
    bm25 = bm25s.BM25(k1=1.2, b=0.75)
    with captured():
        bm25.index([_plain_tokens(c.search_text) for c in index.chunks], show_progress=False)
    return replace(index, bm25=bm25)


def ablations(shipped: HybridRetriever, tune: list) -> dict[str, Retriever]:  # type: ignore[type-arg]
    """Shipped minus one method each (ranker retrained on tune where its inputs change)."""
    o = shipped.options
    index, emb, g = shipped.index, shipped.embedder, shipped.glossary
    tmp = Path(tempfile.mkdtemp(prefix="dsqa-bench-"))

    def retrained(name: str, idx: LoadedIndex, opts: RetrievalOptions, tokens=tokenize) -> HybridRetriever:  # noqa: ANN001
        base = HybridRetriever(idx, emb, g, replace(opts, ranker=None), bm25_tokens=tokens)
        train_ranker(base, tune, tmp / f"{name}.json")
        return HybridRetriever(idx, emb, g, replace(opts, ranker=load_ranker(tmp / f"{name}.json")), bm25_tokens=tokens)

    plain = _without_expansion(index)
    return {
        "-ranker": shipped.with_options(ranker=None),
        "-adapter": retrained("noadapter", index, replace(o, query_adapter=None)),
        "-memory": retrained("nomemory", index, replace(o, question_memory=None)),
        "-ask_split": retrained("noask", index, replace(o, split_ask=False)),
        "-abbrev": retrained("noabbrev", plain, o, _plain_tokens),
        "-unit_cos": retrained("nounitcos", index, replace(o, sentence_cosine=False)),
        "-sections": shipped.with_options(section_words=0),
        "-one_per_sec": shipped.with_options(one_per_section=False),
        "-notes_last": shipped.with_options(notes_last=False),
        "v1": HybridRetriever(plain, emb, g, RetrievalOptions(split_ask=False, section_words=0, notes_last=False),
                              bm25_tokens=_plain_tokens),
    }


def latency_ms(retriever: Retriever, index: LoadedIndex, questions: list) -> float:  # type: ignore[type-arg]
    fn = search_fn(retriever, index)
    times = []
    for q in questions:
        t = time.perf_counter()
        fn(q.question)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--index", type=Path, default=Path("var/index"))
    ap.add_argument("--dev", type=Path, default=Path("../shared/eval/dev.jsonl"))
    ap.add_argument("--no-ablation", action="store_true")
    args = ap.parse_args()
    engine = load_engine(Settings(index_dir=args.index))
    index, shipped = engine.require()
    assert isinstance(shipped, HybridRetriever)
    sets = question_sets(QUESTIONS_DIR, args.dev)
    retrievers = peers(engine)
    if not args.no_ablation:
        retrievers.update(ablations(shipped, sets["tune"]))
    results = score_sets(retrievers, index, sets)
    base = results["bm25"]
    print(f"{'retriever':>11} {'set':>7} " + " ".join(f"{m:>14}" for m in METRICS) + f" {'zh hit@5':>9} {'words':>6}")
    for name, by_set in results.items():
        for set_name, summary in by_set.items():
            a, b = summary["all"], base[set_name if set_name in base else "tune"]["all"]
            cells = " ".join(f"{a[m]:.3f} ({a[m] / b[m] if b[m] else float('inf'):.2f}x)" for m in METRICS)
            zh = summary.get("zh", {}).get("hit@5")
            print(f"{name:>11} {set_name:>7} {cells} {zh if zh is None else f'{zh:.3f}':>9} {a['median_top5_words']:>6}")
    every = [q for qs in sets.values() for q in qs]
    ms = {name: latency_ms(retrievers[name], index, every) for name in ("bm25", "dense", "shipped")}
    print(f"median query latency: shipped {ms['shipped']:.1f} ms, dense {ms['dense']:.1f} ms, bm25 {ms['bm25']:.1f} ms; "
          f"shipped/dense {ms['shipped'] / ms['dense']:.2f}x")


if __name__ == "__main__":
    main()
