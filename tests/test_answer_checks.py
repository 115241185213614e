"""The answer-side checks: cut segments, the unanswerable set, the coverage signals and the guard
that keeps learned models to the encoder they were trained with."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np

from app.coverage import COVERAGE_FEATURES, coverage_features
from app.engine import retrieval_options
from app.ranking import QuerySignals, chunk_terms
from app.settings import Settings
from eval.answer_quality import UNANSWERABLE, answer_words, has_evidence, is_cut, load_unanswerable, segments
from eval.question_set import split_of
from indexer.documents import Chunk
from indexer.tokenize import tokenize


def test_segments_and_cuts() -> None:
    answer = "ZeRO-3 will automatically collect and partition the model parameters as they [1] Use `overlap_comm`. [2]"
    segs = segments(answer)
    assert segs == ["ZeRO-3 will automatically collect and partition the model parameters as they", "Use `overlap_comm`."]
    assert is_cut(segs[0]) and not is_cut(segs[1])
    assert is_cut("call deepspeed.init_inference first.")  # starts inside a sentence
    assert not is_cut("`wandb.group`: groups runs together (default none).")
    assert answer_words(answer) == 13
    assert has_evidence("It copies to a Contiguous-buffer as they are produced [1]", ("contiguous buffer as they are produced",))


def test_unanswerable_set_make_up() -> None:
    rows = [json.loads(line) for line in UNANSWERABLE.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) >= 40 and len({r["id"] for r in rows}) == len(rows)
    langs = Counter(r["lang"] for r in rows)
    assert langs["en"] >= 20 and langs["zh"] >= 10
    assert all(r.get("why") and r.get("kind") for r in rows)
    assert {split_of(u.id) for u in load_unanswerable()} == {"tune", "test"}


def test_coverage_signals() -> None:
    chunks = [Chunk(id=f"c{i}", text=t, path="p", url="u", title="T", heading="H", trail=("T",), source="docs")
              for i, t in enumerate(["Set overlap_comm to overlap reduction.", "Pipeline stages."])]
    terms = [chunk_terms(c) for c in chunks]
    q = QuerySignals(np.array([3.0, 1.0]), np.array([3.0, 1.0]), np.array([0.6, 0.2]), np.array([0.6, 0.2]),
                     frozenset(tokenize("overlap reduction")), frozenset({"overlap_comm", "made_up_key"}), False)
    row = coverage_features(q, q.cos, [0, 1], 2.5, terms, [c.text for c in chunks])
    named = dict(zip(COVERAGE_FEATURES, row, strict=True))
    assert len(row) == len(COVERAGE_FEATURES) and named["ident_found"] == 0.5 and named["top_cover"] == 1.0
    assert named["top_bm25"] == 3.0 and named["top_score"] == 2.5 and named["idents"] == 2


def test_learned_models_apply_only_to_their_encoder() -> None:
    settings = Settings()
    shipped = retrieval_options(settings, "all-MiniLM-L6-v2")
    assert shipped.ranker is not None and shipped.abstention is not None
    other = retrieval_options(settings, "hash-64")
    assert other.ranker is None and other.abstention is None
    assert retrieval_options(settings.model_copy(update={"learned_ranking": False}), "all-MiniLM-L6-v2").abstention is None
