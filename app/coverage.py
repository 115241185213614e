"""Does the index cover the question? A decision from more than the top cosine.

Signals of one search: the best cosine, the top passage's cosine, ranking score and raw BM25 per
query term, the best such anywhere, how much of the ask the top passage and the top five cover, whether the
question's identifiers appear in the top five (a key DeepSpeed never had does not) and in the index at
all (the ask's share the index never names, and whether a `deepspeed.` path is among them), the share
of the ask's words no passage or heading holds at all (a GPU, library or product the docs never name), whether
it asks for a date, price, opinion or measured number or for the release that first had a feature
(what docs never hold), whether it writes out a config key (`"name": ...`) or a launcher flag
(`--name`) that nothing indexed names (a key DeepSpeed never had) or passes a DeepSpeed function a keyword
argument the installed one does not take (`indexer/api_signatures.py`), how far BM25's
and the dense model's top ten agree, how close the question comes to one already answered (the
best cosine with a question of the memory, `app/question_memory.py`), and how close to one the docs do not
answer and how much it leans toward such questions, by its vector and by its ask's words (`app/refusal_memory.py`,
`app/wording_probe.py`). A logistic model over them, trained on the `tune` split of our
answerable questions against the tune half of `eval/unanswerable.jsonl`, with its threshold set so
that about 3% of answerable questions it never saw are refused (`dsqa eval train-abstention`); a terse
question (`app.query.coverage_group`) has a threshold of its own, set the same way on terse tune questions
(`LinearModel.threshold_for`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.linear_model import LinearModel, load_linear_model
from app.ranking import ChunkTerms, QuerySignals

ABSTENTION_FILE = Path(__file__).resolve().parent / "abstention.json"

COVERAGE_FEATURES: tuple[str, ...] = (
    "best_cos",  # best cosine among the candidates
    "top_cos",  # the first passage's cosine
    "top_score",  # the first passage's ranking score
    "top_bm25",  # the first passage's raw BM25 per query term (an absolute match strength, not
    "best_bm25",  # normalised by the best passage) and the best such over the whole index
    "top_cover",  # share of the ask's terms in the first passage
    "top5_cover",  # share of the ask's terms in the first five
    "ident_found",  # share of the question's identifiers found in the first five (1 when none)
    "idents",  # how many identifiers the question names
    "agreement",  # overlap of BM25's and the dense model's top ten
    "cjk",
    "ask_unknown",  # share of the ask's identifiers that no chunk or heading of the index names
    "ds_unknown",  # the question names a `deepspeed.` path the index never names
    "unknowable",  # asks for a date, price, opinion or measured number (`app.query.asks_unknowable`)
    "ask_unseen",  # share of the ask's terms that no chunk's text or heading holds (a GPU, library or
    "any_unseen",  # product the docs never name), and whether there is any
    "seen_best",  # the best cosine with a remembered question (`ChunkMemory.best`; missing without a memory)
    "first_release",  # asks which release first had a feature (`app.query.asks_first_release`)
    "unknown_setting",  # writes out a config key ("name": ...), flag (--name) or keyword argument (f(a_b=1)) that nothing indexed
    # names, or passes a DeepSpeed function a keyword argument the installed one does not take (`indexer/api_signatures.py`)
    "refused_best",  # how close it comes to a remembered question the docs do not answer (`app/refusal_memory.py`)
    "plan_or_figure",  # asks for a plan, an expected figure or others' experience (`app.query.asks_plan_or_figure`)
    "refused_leaning",  # how much the question leans toward the kinds the docs do not answer (`RefusalMemory.leaning`)
    "refused_wording",  # how much its ask's words lean that way (`app/wording_probe.py`)
    "other_library",  # names another framework and nothing of DeepSpeed's (`app.query.asks_other_library`)
)


def coverage_features(q: QuerySignals, candidate_cos: np.ndarray, top: list[int], top_score: float,
                      terms: list[ChunkTerms], top_texts: list[str]) -> np.ndarray:
    """One row of COVERAGE_FEATURES for a search whose first passages are `top` (chunk ids, best
    first, at most five; `top_texts` their texts)."""
    first = top[0]
    n_terms = max(len(q.ask_terms), 1)
    text5 = frozenset().union(*(terms[i].text for i in top[:5]))
    low5 = " ".join(t.lower() for t in top_texts[:5])
    found = sum(1 for t in q.identifiers if t in low5) / len(q.identifiers) if q.identifiers else 1.0
    bm25_top = set(np.argsort(-q.bm25)[:10].tolist())
    dense_top = set(np.argsort(-q.cos)[:10].tolist())
    return np.array([
        float(candidate_cos.max()),
        float(q.cos[first]),
        top_score,
        float(q.bm25[first]) / q.query_terms,
        float(q.bm25.max()) / q.query_terms,
        len(q.ask_terms & terms[first].text) / n_terms,
        len(q.ask_terms & text5) / n_terms,
        found,
        float(len(q.identifiers)),
        len(bm25_top & dense_top) / 10.0,
        float(q.cjk),
        len(q.ask_identifiers & q.unknown_identifiers) / len(q.ask_identifiers) if q.ask_identifiers else 0.0,
        float(any(t.startswith("deepspeed.") for t in q.unknown_identifiers)),
        float(q.unknowable),
        q.unseen_terms / n_terms,
        float(q.unseen_terms > 0),
        np.nan if q.seen_best is None else q.seen_best,
        float(q.first_release),
        float(bool(q.unknown_settings or q.unaccepted_arguments)),
        np.nan if q.refused_best is None else q.refused_best,
        float(q.plan_or_figure),
        np.nan if q.refused_leaning is None else q.refused_leaning,
        np.nan if q.refused_wording is None else q.refused_wording,
        float(q.other_library),
    ], dtype=np.float64)


def load_abstention(path: Path = ABSTENTION_FILE) -> LinearModel | None:
    """The shipped coverage decision, or None (then the best cosine against a threshold decides)."""
    return load_linear_model(path, COVERAGE_FEATURES)
