"""Tokeniser, fusion, glossary expansion and the scoring rule: pure functions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.fusion import near_duplicate, rrf_fusion, shingles, weighted_fusion
from app.glossary import Glossary, has_cjk
from corpus import GLOSSARY_ZH
from eval.metrics import Question, normalise, score_question, summarise, wilson_interval
from indexer.tokenize import tokenize


def test_identifier_tokens() -> None:
    toks = tokenize("Set stage3_max_live_parameters and --num_gpus for deepspeed.zero.Init with OneBitAdam")
    for t in ["stage3_max_live_parameters", "stage3", "live", "num_gpus", "deepspeed.zero.init", "zero.init", "init", "onebitadam", "adam"]:
        assert t in toks, t
    assert "and" not in toks and "for" not in toks
    assert tokenize("offloading") == tokenize("offload")
    # a segment of a dotted path that is a key of its own is a token: `overlap_comm` meets the catalogue's
    # `zero_optimization.overlap_comm`; a key that only ends like it (`tp_overlap_comm`) does not yield it
    assert {"overlap_comm", "zero_optimization", "offload_param"} <= set(tokenize("zero_optimization.overlap_comm, zero_optimization.offload_param.device"))
    assert "overlap_comm" not in tokenize("tensor_parallel.tp_overlap_comm")


def test_weighted_fusion_mixes_both_signals() -> None:
    bm25 = np.array([10.0, 0.0, 5.0])
    dense = np.array([0.2, 0.9, 0.5])
    fused = weighted_fusion(bm25, dense, 0.6, 0.4)
    assert fused.argmax() == 0
    assert fused[1] == pytest.approx(0.4)
    assert weighted_fusion(np.zeros(3), dense, 0.6, 0.4).argmax() == 1


def test_rrf_and_dedupe() -> None:
    fused = rrf_fusion([[1, 2, 3], [3, 1]], [1.0, 1.0])
    assert max(fused, key=fused.__getitem__) in (1, 3)
    a = shingles("the quick brown fox jumps over the lazy dog again and again")
    assert near_duplicate(a, shingles("the quick brown fox jumps over the lazy dog again and again today"))
    assert not near_duplicate(a, shingles("an entirely different sentence about pipeline parallel training"))


def test_glossary_expands_chinese_only(tmp_path: Path) -> None:
    g = Glossary.load(GLOSSARY_ZH)
    assert len(g.terms) > 100
    q = "流水线并行中如何使用 PipelineModule？"
    assert has_cjk(q)
    expanded = g.expand(q)
    assert "PipelineModule" in expanded and "pipeline" in expanded.lower() and not has_cjk(expanded)
    assert g.expand("What is ZeRO?") == "What is ZeRO?"
    f = tmp_path / "g.tsv"
    f.write_text("# comment\n显存\tgpu memory\n显存不足\tout of memory\nbad line\n")
    small = Glossary.load(f)
    assert small.matches("显存不足怎么办") == ["显存不足"]  # longest match wins, no overlap


def test_scoring_rule() -> None:
    assert normalise("Copies the gradients, to a *contiguous* buffer!") == "copies the gradients to a contiguous buffer"
    q = Question("q", "?", "en", "t", ("contiguous buffer as they are produced",), ("overlap_comm", "stage"))
    s = score_question(q, ["nothing here", "It copies to a Contiguous-buffer as they are produced.", "x"], ["overlap_comm: true"])
    assert s.first_relevant == 2 and s.rr == 0.5 and s.hit(5) and not s.hit(1)
    assert s.mention_share == 0.5
    summary = summarise([s])
    assert summary["all"]["hit@5"] == 1.0 and summary["en"]["mrr@10"] == 0.5


def test_a_share_comes_with_its_wilson_interval() -> None:
    """Half of 100 reads 0.40-0.60; a share of 0 or 1 keeps an interval on the open side only; test's hit@5 of
    299 in 326 reads 0.88-0.94; no questions say nothing (0-1)."""
    assert wilson_interval(50, 100) == (0.4038, 0.5962)
    assert wilson_interval(0, 10) == (0.0, 0.2775) and wilson_interval(10, 10) == (0.7225, 1.0)
    lo, hi = wilson_interval(299, 326)
    assert lo < 299 / 326 < hi and (round(lo, 2), round(hi, 2)) == (0.88, 0.94)
    assert wilson_interval(0, 0) == (0.0, 1.0)
