"""`dsqa eval retrieval`: the shipped retriever (and its peers) on the tune and test splits of our
question set and on the dev set, side by side, from one loaded index and model."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from app.engine import Engine, load_engine
from app.errors import IndexNotReady
from app.peer_retrievers import Bm25Retriever, DenseRetriever, RrfRetriever
from app.retriever import HybridRetriever, Retriever
from app.settings import Settings
from eval.metrics import Question, evaluate, load_questions
from eval.question_set import (
    QUESTIONS_DIR,
    SPLITS,
    TERSE_QUESTIONS,
    load_question_file,
    load_question_set,
    split_of,
)
from indexer.documents import Chunk
from indexer.store import LoadedIndex

METRICS = ("hit@1", "hit@5", "hit@10", "mrr@10", "ndcg@10", "mention_share", "median_top5_words")


def search_fn(retriever: Retriever, index: LoadedIndex, k: int = 10) -> Callable[[str], tuple[list[str], list[str]]]:
    def fn(question: str) -> tuple[list[str], list[str]]:
        result = retriever.search(question, k)
        codes = [index.snippets[s].code for h in result.hits[:5] for s in h.chunk.snippet_ids if s in index.snippets]
        return [h.chunk.text for h in result.hits], codes

    return fn


def question_sets(questions_dir: Path = QUESTIONS_DIR, dev: Path | None = None, extra: Sequence[Path] = (),
                  chunks: Iterable[Chunk] = (), terse: Path | None = None) -> dict[str, list[Question]]:
    """tune and test (our set, split by id hash), dev when given, any further files, each a set named by
    its stem (a keyed file's phrases found in `chunks`, the index's passages), and `terse`'s test split
    (TERSE_QUESTIONS; its tune split trains only the coverage decision)."""
    ours = load_question_set(questions_dir) if questions_dir.is_dir() else []
    sets: dict[str, list[Question]] = {s: [q for q in ours if split_of(q.id) == s] for s in SPLITS}
    if dev is not None and dev.is_file():
        sets["dev"] = load_questions(dev)
    chunks = list(chunks)
    for path in extra:
        sets[path.stem] = load_question_file(path, chunks)
    if terse is not None and terse.is_file():
        sets["terse"] = [q for q in load_questions(terse) if split_of(q.id) == "test"]
    return {name: qs for name, qs in sets.items() if qs}


def peers(engine: Engine) -> dict[str, Retriever]:
    """The retrievers measured beside the shipped one, over the same index, tokens and glossary."""
    index, shipped = engine.require()
    if not isinstance(shipped, HybridRetriever):
        return {"shipped": shipped}
    g = shipped.glossary
    return {
        "bm25": Bm25Retriever(index, g),
        "dense": DenseRetriever(index, shipped.embedder, g),
        "rrf": RrfRetriever(index, shipped.embedder, g),
        "shipped": shipped,
    }


def score_sets(retrievers: dict[str, Retriever], index: LoadedIndex, sets: dict[str, list[Question]]) -> dict[str, Any]:
    """retriever name -> set name -> summary (all / en / zh blocks and misses@5).

    A retriever with a query adapter learned on tune is scored on tune twice: `tune`, each question
    searched through an adapter fitted without its fold (cross-fitted: what the adapter does for a
    question it never saw, comparable with test), and `tune-in`, through the shipped adapter that
    was fitted on every tune question (in-sample)."""
    out: dict[str, Any] = {}
    for name, r in retrievers.items():
        out[name] = {}
        for set_name, qs in sets.items():
            if set_name == "tune" and isinstance(r, HybridRetriever) and r.options.query_adapter is not None:
                out[name]["tune"] = evaluate(qs, crossfit_search(r, index, qs))[1]
                out[name]["tune-in"] = evaluate(qs, search_fn(r, index))[1]
            elif isinstance(r, HybridRetriever) and r.options.question_memory is not None:
                out[name][set_name] = evaluate(qs, held_out_search(r, index, qs))[1]
            else:
                out[name][set_name] = evaluate(qs, search_fn(r, index))[1]
    return out


def crossfit_search(retriever: HybridRetriever, index: LoadedIndex, tune: list[Question], k: int = 10) -> Callable[[str], tuple[list[str], list[str]]]:
    """A search over tune questions, each through the retriever whose query adapter never saw it."""
    from eval.adapter_training import crossfit

    by_id = crossfit(retriever, tune)
    by_text = {q.question: search_fn(by_id[q.id], index, k) for q in tune}
    return lambda question: by_text[question](question)


def held_out_search(retriever: HybridRetriever, index: LoadedIndex, questions: list[Question], k: int = 10) -> Callable[[str], tuple[list[str], list[str]]]:
    """A search over questions, each through a memory without the tune questions of its own thread
    (a test question written from the same GitHub thread as a tune one must not find it there)."""
    from eval.memory_training import held_out

    by_id = held_out(retriever, questions)
    by_text = {q.question: search_fn(by_id[q.id], index, k) for q in questions}
    return lambda question: by_text[question](question)


def run_retrieval_eval(settings: Settings, *, dev: Path | None = None, extra: Sequence[Path] = (),
                       baseline: bool = False, questions_dir: Path = QUESTIONS_DIR) -> dict[str, Any]:
    engine = load_engine(settings)
    if engine.index is None or engine.retriever is None:
        raise IndexNotReady(f"no usable index at {settings.index_dir}: build it with `dsqa index`")
    sets = question_sets(questions_dir, dev, extra, engine.index.chunks, TERSE_QUESTIONS)
    retrievers = peers(engine) if baseline else {"shipped": engine.retriever}
    return score_sets(retrievers, engine.index, sets)


def format_table(results: dict[str, Any]) -> str:
    """One line per retriever and question set (all questions, then the Chinese part's hit@5)."""
    lines = [f"{'retriever':>9} {'set':>7} {'n':>4} " + " ".join(f"{m:>8}" for m in ("hit@1", "hit@5", "hit@10", "MRR@10", "nDCG@10", "mention", "words")) + "  hit@5 95% CI   zh_hit@5"]
    for name, by_set in results.items():
        for set_name, summary in by_set.items():
            a = summary["all"]
            vals = " ".join(f"{a[m]:>8.3f}" if m != "median_top5_words" else f"{a[m]:>8.0f}" for m in METRICS)
            zh = summary.get("zh", {})
            zh_txt = f"{zh['hit@5']:.3f} (n={zh['n']})" if zh.get("n") else "-"
            lo, hi = a.get("hit@5_95ci", (0.0, 1.0))
            lines.append(f"{name:>9} {set_name:>7} {a['n']:>4} {vals}  [{lo:.3f}, {hi:.3f}]  {zh_txt}")
    if any("tune-in" in by_set for by_set in results.values()):
        lines.append("tune: each question through a query adapter fitted without its fold and a question memory without it and its thread; "
                     "tune-in: the shipped adapter and memory, built from all of tune (in-sample)")
    lines.append("hit@5 95% CI: the Wilson interval of the share on that many questions (what a figure may differ by from the rate it estimates)")
    if any("terse" in by_set for by_set in results.values()):
        lines.append("terse: the test split of eval/terse/answerable.jsonl (questions of at most 7 words or 20 Chinese characters)")
    return "\n".join(lines)
