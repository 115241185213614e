"""Retrieval quality with the real model and the real index (slow): floors on our `test` split (never
tuned on), the tune/test gap, the dev set, the peers, and the shipped ranker reproduced from tune."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from app.answer import (
    load_unit_model,
)
from app.answer_keys import keys_named
from app.answer_shapes import ERROR_LINE, config_fragment
from app.ask import ask, prepare
from app.coverage import load_abstention
from app.coverage_overrides import api_line_asked
from app.engine import load_engine
from app.query import (
    TERSE,
    api_names_in,
    asks_only_what_key_is,
    coverage_group,
    titles_in,
)
from app.query_adapter import UNIT_ADAPTER_FILE, load_query_adapter
from app.ranking import load_ranker
from app.refusal_memory import REFUSAL_MEMORY_FILE, load_refusal_memory
from app.retriever import HybridRetriever
from app.schemas import MAX_QUESTION_CHARS, AskRequest
from app.settings import Settings
from eval.abstention_training import coverage_rows, train_on_tune
from eval.adapter_training import train_adapter
from eval.answer_quality import (
    TERSE_UNANSWERABLE,
    UNANSWERABLE_OUTSIDE,
    answer_report,
    load_training_unanswerable,
    load_unanswerable,
)
from eval.answer_training import probability, question_units, train_answer_units
from eval.memory_training import build_memory
from eval.metrics import load_questions
from eval.question_set import (
    OUTSIDE_B_QUESTIONS,
    OUTSIDE_QUESTIONS,
    QUESTIONS_DIR,
    TERSE_QUESTIONS,
    load_question_set,
    load_split,
    split_of,
)
from eval.ranker_training import train_ranker
from eval.retrieval_eval import format_table, peers, question_sets, score_sets
from indexer.identifiers import ABBREVIATIONS
from indexer.tokenize import tokenize

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(real_index: Path):  # noqa: ANN201
    return load_engine(Settings(index_dir=real_index, batch_queries=False))  # the served (full-precision ONNX) query encoder


@pytest.fixture(scope="module")
def scores(engine, dev_questions: Path) -> dict[str, dict]:
    results = score_sets(peers(engine), engine.index, question_sets(QUESTIONS_DIR, dev_questions, [OUTSIDE_QUESTIONS, OUTSIDE_B_QUESTIONS],
                                                                          engine.index.chunks, TERSE_QUESTIONS))
    print("\n" + format_table(results))
    return results


def test_floors_on_the_test_split(scores: dict[str, dict]) -> None:
    """Measured at stop 50, after index fixes (a config table row keeps the key line above it; the catalogue's
    docs reference stops at the next `***name***` entry; lead-ins to code dropped as units; two new notes) and
    every learned part retrained: hit@1 0.715, hit@5 0.920, MRR@10 0.800, zh hit@5 0.910. Measured at stop 49, with passages grown past their section into its subsections and then the section
    that holds it, up to 350 words (`RetrievalOptions.passage_scopes`; chosen on tune's cross-validated ranker,
    MRR@10 0.793 -> 0.806; median passage 177 -> 301 words) and every learned part retrained: hit@1 0.693,
    hit@5 0.920, MRR@10 0.790, zh hit@5 0.900, which reach issue 9's four targets on test (the outside sets
    stay under them). Before it, at stop 48, with the question memory's lexical side (`seen_lex`: the character n-gram TF-IDF
    cosine with remembered questions; chosen on tune's cross-validated ranker MRR@10, 0.752 -> 0.786) and every
    learned part after it retrained: hit@1 0.687, hit@5 0.905, MRR@10 0.779, zh hit@5 0.890. Before it:
    hit@1 0.678, hit@5 0.896, MRR@10 0.772, zh hit@5
    0.870 at stop 42, with the full-precision query encoder (the torch model's hit@5 on every question; the int8
    one had moved eight test questions, net +2) and every learned part retrained on its vectors; before it
    hit@1 0.663, hit@5 0.899, MRR@10 0.763, zh hit@5 0.880, after every learned part was retrained on the index with stop 38's 19 new known-error sections (one
    question left first place); stop 37: 0.666 / 0.899 / 0.764 / 0.880, after the retraining on its eleven sections
    (one question, rq-b-015, moved from fifth to sixth place; stop 36: 0.666 / 0.902 / 0.765 / 0.880, after the
    retraining on stop 35's fifteen sections; stop 34: 0.672 / 0.902 / 0.768 / 0.880, after the retraining on stop 33's sections; before
    it 0.666 / 0.902 / 0.764 / 0.880; two stops before that, without the question memory: 0.635 / 0.877 / 0.737 / 0.850). A test question
    is scored with the remembered questions of its own GitHub thread left out (13 test questions have one
    in tune), so the memory counts only for what a new user's question would get from it. Issue 9's
    targets, 0.65 / 0.92 / 0.75 / 0.90: at stop 48 hit@1 and MRR@10 were reached, hit@5 and zh hit@5 were not;
    these floors keep what was won, about two questions of margin."""
    t = scores["shipped"]["test"]
    assert t["all"]["hit@5"] >= 0.913
    assert t["all"]["hit@1"] >= 0.69
    assert t["all"]["mrr@10"] >= 0.785
    assert t["zh"]["hit@5"] >= 0.88
    assert t["all"]["median_top5_words"] <= 350


def test_floors_on_the_outside_set(scores: dict[str, dict]) -> None:
    """`eval/heldout/outside.jsonl`: 80 real-user questions written after every model was trained and never
    split, tuned or trained on. Measured at stop 50 (the index fixes above, every part retrained): hit@1
    0.675, hit@5 0.887, MRR@10 0.772, zh hit@5 0.886. At stop 49 (passages grown into subsections and the enclosing
    section): hit@1 0.662, hit@5 0.875, MRR@10 0.759, zh hit@5 0.857. At stop 48 (the memory's lexical side): hit@1 0.662, hit@5 0.863,
    MRR@10 0.750, zh hit@5 0.857 (stop 46: 0.625 / 0.863 / 0.723 / 0.857). At stop 38's landing (every learned part retrained on the index with
    its 19 new known-error sections): hit@1 0.575, hit@5 0.863, MRR@10 0.702, zh hit@5 0.857 (one question
    lost at rank 1). Earlier: hit@1 0.600, hit@5 0.863, MRR@10 0.715, zh hit@5 0.857
    (35 zh), after every learned part was retrained on the index with stop 35's fifteen new known-error
    sections (four questions gained at rank 1, one lost from the top 5); stop 34: 0.550 / 0.875 / 0.693 / 0.886,
    after every learned part was retrained on the index with stop 33's eight new known-error
    sections (the ranker's regularisation, chosen on tune, moved from C 1 to 0.01): three questions lost at
    rank 1, one gained in the top 5 (tune hit@1 0.679 -> 0.682, test 0.666 -> 0.672); before it 0.588 /
    0.863 / 0.709 / 0.857; the stop before that 0.600 / 0.875 / 0.715 / 0.886 (the ranker retrained on the new text units:
    one question each), two stops before, without the question memory, 0.550 / 0.838 / 0.676 / zh 0.886.
    Floors one or two questions under."""
    o = scores["shipped"]["outside"]
    assert o["all"]["n"] == 80
    assert o["all"]["hit@5"] >= 0.85 and o["all"]["hit@1"] >= 0.637 and o["all"]["mrr@10"] >= 0.735
    assert o["zh"]["hit@5"] >= 0.83
    for name in ("bm25", "dense", "rrf"):
        assert o["all"]["mrr@10"] > scores[name]["outside"]["all"]["mrr@10"], name


def test_floors_on_the_second_outside_set(scores: dict[str, dict]) -> None:
    """`eval/heldout/outside_b.jsonl`: 326 real-user questions from 326 threads no other set uses, one gold phrase
    each (the split set's have 1.8 on average), written at stop 36 as training-only questions; as training they
    did not help tune (cross-fitted hit@5 0.893 -> 0.885), so they were never trained on and report only.
    At stop 59 (five known-error sections added, nothing retrained): hit@1 0.580, hit@5 0.816, MRR@10 0.688, zh hit@5
    0.815; the notes' words moved BM25's term statistics, which changed the first docs passage of two questions
    (one lost its hit@1), so the hit@1 floor, one question under stop 58's 0.583, went to two under. Measured at stop 50 (the index fixes, every part retrained): hit@1 0.586, hit@5 0.822, MRR@10 0.690, zh hit@5
    0.822. At stop 49 (passages grown into subsections and the enclosing section): hit@1 0.592, hit@5 0.819,
    MRR@10 0.694, zh hit@5 0.815. At stop 48 (the memory's lexical side): hit@1 0.537, hit@5 0.804, MRR@10 0.655, zh hit@5 0.778
    (stop 46: 0.531 / 0.782 / 0.647 / 0.748). At landing: hit@1 0.512, hit@5 0.779, MRR@10 0.632, zh hit@5 0.748 (135 zh; stop 38: 0.515 / 0.779 /
    0.635 / 0.748): well under test's
    0.902, and under test scored on each question's first gold phrase alone (0.850): the split set flatters
    the retriever. BM25 alone 0.460, dense alone 0.414, RRF 0.500. Floors about two questions under."""
    o = scores["shipped"]["outside_b"]
    assert o["all"]["n"] == 326
    assert o["all"]["hit@5"] >= 0.81 and o["all"]["hit@1"] >= 0.575 and o["all"]["mrr@10"] >= 0.68
    assert o["zh"]["hit@5"] >= 0.79
    for name in ("bm25", "dense", "rrf"):
        assert o["all"]["hit@5"] > scores[name]["outside_b"]["all"]["hit@5"] + 0.2, name


def test_tune_and_test_agree(scores: dict[str, dict]) -> None:
    """`tune` is cross-fitted (each question through a query adapter fitted without its fold and a
    question memory without it and its thread); the in-sample `tune-in` (1.000 at landing, cross-fitted
    0.882) only shows how much the adapter and the memory hold of the questions they were built from."""
    s = scores["shipped"]
    assert s["tune-in"]["all"]["hit@5"] >= s["tune"]["all"]["hit@5"]
    assert s["tune"]["all"]["hit@5"] - s["test"]["all"]["hit@5"] <= 0.03


def test_floors_on_the_dev_set(scores: dict[str, dict]) -> None:
    d = scores["shipped"]["dev"]
    assert d["all"]["hit@5"] >= 0.90 and d["all"]["mrr@10"] >= 0.83
    assert d["zh"]["hit@5"] >= 0.85 and d["all"]["mention_share"] >= 0.90


def test_shipped_is_ahead_of_every_peer_on_test(scores: dict[str, dict]) -> None:
    ours = scores["shipped"]["test"]["all"]
    for name in ("bm25", "dense", "rrf"):
        peer = scores[name]["test"]["all"]
        for metric in ("hit@1", "hit@5", "hit@10", "mrr@10", "ndcg@10"):
            assert ours[metric] > peer[metric], (name, metric)


CV_TIE = 0.003  # held-out MRR@10 closer than this is a tie (one question at rank 2 instead of 1 is 0.0013)


def test_shipped_ranker_is_the_one_tune_gives(engine, tmp_path: Path) -> None:
    """Retrained here from the tune split (and the training-only questions asked in threads), the ranker
    matches app/ranker.json: what ships was learned from them, by this code, on this index. The regularisation is chosen by held-out MRR@10 on
    tune, and two of them can sit within a hair of each other (0.7577 at C 0.01, 0.7561 at C 0.1 on the
    index the shipped one was trained on; an index built from nothing, whose vectors differ in the last
    float bits, picked C 0.1): the shipped C must be within CV_TIE of the best here, and at the same C
    the weights must match."""
    retriever = engine.retriever
    assert isinstance(retriever, HybridRetriever)
    report = train_ranker(retriever, load_split("tune"), tmp_path / "ranker.json")
    fresh, shipped = load_ranker(tmp_path / "ranker.json"), load_ranker()
    assert fresh is not None and shipped is not None
    assert report["questions"] == len(load_split("tune"))
    cv = report["cv_mrr@10"]
    shipped_c = shipped.trained_on.rsplit("C=", 1)[1]
    assert cv[str(float(shipped_c))] >= max(cv.values()) - CV_TIE, (shipped_c, cv)
    if float(shipped_c) == report["C"]:
        assert np.allclose(fresh.weights, shipped.weights, atol=0.05), (fresh.weights, shipped.weights)


def test_shipped_question_memory_is_the_one_tune_gives(engine) -> None:
    """Rebuilt here from the tune split alone, the memory matches app/question_memory.npz: the same tune
    questions, answered by the same chunks of this index, and vectors that agree to a cosine of 0.995 (the
    int8 query encoder's rounding differs a little between CPUs: 0.015 in one coordinate at most, measured)."""
    retriever = engine.retriever
    assert isinstance(retriever, HybridRetriever) and retriever.options.question_memory is not None
    shipped = retriever.options.question_memory.memory
    fresh = build_memory(retriever.with_options(query_adapter=None, question_memory=None), load_split("tune"))
    assert fresh.ids == shipped.ids and fresh.origins == shipped.origins and fresh.encoder == shipped.encoder
    assert fresh.answers == shipped.answers and fresh.units == shipped.units  # and the same units answer them
    agreement = np.sum(fresh.vectors * shipped.vectors, axis=1) / np.linalg.norm(shipped.vectors, axis=1)
    assert agreement.min() >= 0.995, float(agreement.min())
    assert retriever.options.question_memory.resolved == len(shipped.ids)  # every entry found in this index


def test_shipped_query_adapter_is_the_one_tune_gives(engine, tmp_path: Path) -> None:
    """Refitted here from the tune split alone, the adapter matches app/query_adapter.npz (to 5% of its
    size: it is stored in float16), and on held-out tune folds it ranks the dense side better."""
    retriever = engine.retriever
    assert isinstance(retriever, HybridRetriever) and retriever.options.query_adapter is not None
    report = train_adapter(retriever, load_split("tune"), tmp_path / "adapter.npz")
    fresh, shipped = load_query_adapter(tmp_path / "adapter.npz"), load_query_adapter()
    assert fresh is not None and shipped is not None and fresh.encoder == shipped.encoder
    assert np.linalg.norm(fresh.delta - shipped.delta) <= 0.05 * np.linalg.norm(shipped.delta)
    assert report["cv_dense_mrr@10"]["adapted"] > report["cv_dense_mrr@10"]["base"] + 0.05


def test_every_abbreviation_is_part_of_deepspeed_names(engine) -> None:
    """The abbreviation table describes DeepSpeed's own names (config keys, API, flags)."""
    parts: set[str] = set()
    for chunk in engine.index.chunks:
        if chunk.source in ("config", "api", "docs"):
            for token in tokenize(chunk.text, expand=False):
                if "_" in token or "." in token:
                    parts.update(p for p in token.replace(".", "_").split("_") if p)
    missing = sorted(a for a in ABBREVIATIONS if a not in parts)
    assert not missing, missing


def test_catalogue_answers_a_config_key(engine) -> None:
    hits = engine.retriever.search("what does stage3_max_live_parameters do", 5).hits
    assert any("stage3_max_live_parameters" in h.chunk.text for h in hits)


def test_answers_on_held_out_questions(engine) -> None:
    """Stop 70's unit scorer of gradient-boosted trees (tune's cross-validated evidence 0.7754 -> 0.7914): test
    evidence 74.23% both (zh 67.0% -> 68.0%), 0 cut of 1549, median 117 words; outside 67.5% -> 66.25%; the
    coverage decision unchanged (refused 89.12% of 294 at 2.15% of the answerable; outside 90.0% at 5.0%). Then
    121 more thread questions (issues_f, _g) and every learned part retrained: test evidence 76.99% (zh 72.0%),
    refused 88.44% at 2.45% (8), 0 cut of 1536, median 117 words; outside 73.75% evidence, 90.0% refused at 5.0%.
    Stop 54 added two known-error sections (two tune error logs' causes), which changed the index's notes, so
    every learned part was retrained: test evidence 71.2% -> 70.9% (zh 63.0%), refused 88.8% -> 88.4% of 294 at
    2.45% (8) of the answerable, 0 cut, median 117 words; outside 67.5% -> 68.75% evidence, 91.25% refused at
    3.75% (3). Stop 53 changed nothing this test measures; it tried and did not keep two things. A lead never about a
    sibling of the option asked (tune's cross-validated evidence 287 -> 288 of 374; no test figure moved) put
    "NVMe offloading is available only with ZeRO stage 3." second for "Does NVMe offload work with ZeRO-2?".
    398 general glossary terms (tune's Chinese hit@1 0.761 -> 0.779; after every learned part was retrained,
    test evidence 71.2% -> 70.6%, zh 63.0% -> 66.0%, refused 88.8% -> 88.4%, and a training-only unanswerable
    question came within a cosine of 0.81 of a scored one through its new English expansion).
    Measured at stop 52, with the coverage decision also learning the terse sets' tune halves and holding
    terse questions to a threshold of their own (tune's cross-validation on the long questions: 91.9% refused
    at 2.31% false -> 92.9% at 1.96%), a pasted message's raising line first and the page a question names
    first: test evidence 71.2% (zh 63.0%), refused 88.8% of 294 at 2.45% (8) of the answerable (stop 51:
    72.7%, 88.1% at 0.9%, 3), 0 cut of 1510, median 117 words; outside 67.5% evidence, 91.25% refused at
    3.75% (3). (151 training-only terse unanswerable questions as well: tune's cross-validation level, long
    93.6% at 2.15%, terse 80.0% at 1.87% against 80.8% at 2.15%; not kept.) Measured at stop 50 after two index fixes (a table row keyed by the key line above it, not the block's last;
    the catalogue's docs reference of an entry no longer runs into the `***name***` entry after it) and every
    learned part retrained (tune's cross-validated evidence 0.770 -> 0.749, C now the most regularised within
    a point of the best): test evidence 71.2% (zh 63.0%), refused 88.4% of 294 at 0.9% (3) of the answerable,
    0 cut of 1558, median 117 words; outside 70.0%
    evidence, 92.5% refused at 3.75% (3). Measured at stop 49 after passages grew into subsections and the enclosing section (every learned part
    retrained; tune's cross-validated evidence 0.757 -> 0.770): test evidence 68.7% (zh 60.0%), a loss of 3.4
    points that tune did not show, refused 89.1% of 294 at 1.2% (4) of the answerable, 0 cut of 1554, median
    117 words; outside 66.25% evidence, 92.5% refused at 3.75% (3). At stop 48 after the question memory's lexical side (every learned part after it retrained):
    test evidence 72.1% (zh 67.0%), refused 88.4% of 294 at 1.2% (4) of the answerable, 0 cut of 1542, median
    117 words; outside 65.0% evidence, 93.75% refused at 3.75% (3). Before it, with the wording probe (`app/wording_probe.py`, a 23rd signal of the coverage
    decision; chosen on tune's cross-validation, 87.9% -> 92.5% refused at 2.0% -> 2.2% false): test evidence
    72.4% (zh 71.0%), refused 87.1% of 294 at 0.9% (3) of the answerable, 0 cut segments of 1573, median 117
    words; outside 66.25% evidence, 91.25% refused at 3.75% (3) of the answerable (1 before); dev 2 of 60
    refused (1 before). Just before it, with `unknown_setting` also firing on an argument the installed
    function does not take: test 71.8%, 79.6% refused at 1.8% (6), 1551 segments; outside 67.5%, 88.75% at
    1.25% (1). Before both (stop 46): test 71.5%, 78.6% refused at 2.15% (7); outside 67.5%, 88.75%, 1.25%.
    Measured at stop 41's landing (the learned parts retrained on its 43 new known-error sections): test
    evidence 69.9% (zh 66.0%), refused 80.6% of 294 at 1.5% (5) of the answerable, 0 cut segments of 1551,
    median 117 words; outside 65.0% evidence, 88.75% refused at 2.5% (2). (With the first 28 of those sections
    outside evidence was 63.75%, two questions fewer; the floor below sits one question under 65.0%. The
    parts are always retrained on the new index: picking them by an outside figure would tune on a held-out set.)
    Measured at stop 38's landing (the learned parts retrained on its 19 new known-error sections): test
    evidence 69.9% (zh 67.0%), refused 78.9% of 294 at 1.5% (5) of the answerable, 0 cut segments of 1551,
    median 117 words; outside 66.25% evidence, 88.75% refused at 1.25%. At stop 37's landing (the learned parts retrained on eleven new known-error sections: evidence
    69.6% -> 69.0%, refused 79.6% -> 79.25%, answerable refused 5 -> 6; outside evidence 65.0% -> 66.25%,
    refused 91.25% -> 90.0%), on sets no choice was made on. The test split, 326 answerable and 294
    unanswerable questions: the answer text holds a gold phrase for 69.0% (zh 66.0%); no cited segment is cut
    (0 of 1533), median 116 words; 79.6% of the unanswerable refused and 1.5% (5) of the answerable. The
    outside sets (`eval/heldout/`, 80 and 80, never trained or tuned on): 65.0% evidence, 91.25% refused,
    1.25% (1) of the answerable refused. This stop's change: the coverage decision and its refusal memory also
    learn from 626 training-only unanswerable questions (630 until stop 42, when four within a cosine of 0.75 of a scored one under the full-precision encoder were dropped) (`eval/training/unanswerable/`, written apart from the
    scored sets; none within a cosine of 0.75 of a scored one), and the threshold moves from the 2% to the
    1.75% conformal quantile by the same rule on tune's cross-validation (`dsqa eval train-abstention`'s `cv`:
    82.8% refused at 2.0% false before, 84.8% at 2.4% now; 2% would now give 3.0% false). Before it (stop
    35): test 69.6% evidence (zh 66.0%), 75.9% refused, 1.2% (4) of the answerable; outside 65.0%, 82.5%,
    1.25%. Issue 10's targets (75% evidence, 90% refused at <= 3% false) are not reached on test."""
    unanswerable = [u for u in load_unanswerable() if split_of(u.id) == "test"]
    report = answer_report(engine, load_split("test"), unanswerable)
    print(report)
    assert report["evidence_in_answer"] >= 0.675
    assert report["cut_segments"] == 0 and report["segments"] > 300
    assert report["median_answer_words"] <= 120
    assert report["abstention"] >= 0.86
    assert report["false_abstention"] <= 0.025
    outside = answer_report(engine, load_questions(OUTSIDE_QUESTIONS), load_unanswerable(UNANSWERABLE_OUTSIDE))
    print(outside)
    assert outside["answerable"] == 80 and outside["unanswerable"] == 80
    assert outside["evidence_in_answer"] >= 0.63 and outside["cut_segments"] == 0
    assert outside["abstention"] >= 0.9 and outside["false_abstention"] <= 0.05


def test_terse_questions_on_held_out(engine) -> None:
    """Terse questions (`app.query.coverage_group`: at most 7 words or 20 Chinese characters, as typed into
    a chat: "bf16 or fp16?", "zero3 怎么导出权重？"), which no other labelled set holds. Before the coverage
    decision learned them (their tune split, with a threshold of their own), it refused 31 of the 76 answerable
    ones of the test split (40.8%) and 71 of the 75 unanswerable ones (94.7%). Measured at stop 52 with the
    decision trained on them (stop 52): 0 of 76 answerable refused, 77.3% (58) of the unanswerable; the answer
    holds a gold phrase for 64.5% (zh 54.8%; 50.0% and 38.7% before)."""
    answerable = [q for q in load_questions(TERSE_QUESTIONS) if split_of(q.id) == "test"]
    unanswerable = [u for u in load_unanswerable(TERSE_UNANSWERABLE) if split_of(u.id) == "test"]
    report = answer_report(engine, answerable, unanswerable)
    print(report)
    assert report["answerable"] == 76 and report["unanswerable"] == 75
    assert report["cut_segments"] == 0 and report["median_answer_words"] <= 120
    assert report["false_abstention"] <= 0.05 and report["abstention"] >= 0.72 and report["evidence_in_answer"] >= 0.6


def test_asking_what_a_key_does_is_never_refused(engine) -> None:
    """Every distinctive key of the installed catalogue, asked tersely in English and Chinese: the
    coverage decision alone refused 42% and 57% of them at landing (a short question sits far from
    every passage); the catalogue's entry answers each, its type, default and what it does first.
    None of our answerable or unanswerable questions has this form: the rule changes none of their
    figures. Asked that way, the catalogue passage that holds the key's entry is the first passage."""
    facts = engine.config_facts
    leaves = sorted({p.rsplit(".", 1)[-1] for p in facts if "_" in p.rsplit(".", 1)[-1] and keys_named(p.rsplit(".", 1)[-1], facts)})
    assert len(leaves) > 150
    for form in ("What does {} do?", "{} 是什么意思？", "How do I set {}?"):  # the last: 123 refused before the rule took it
        refused = [k for k in leaves if not prepare(engine, AskRequest(question=form.format(k))).covered]
        assert not refused, (form, refused[:5])
    reply = ask(engine, AskRequest(question="What does stage3_prefetch_bucket_size do?"))
    assert reply.answer.startswith("Config: `zero_optimization.stage3_prefetch_bucket_size`")
    said = reply.answer.split("\n")[1]  # then what it does, in the catalogue's words
    assert said.startswith("`zero_optimization.stage3_prefetch_bucket_size`: ") and "prefetch" in said.lower()
    # the catalogue passage holding the key's entry comes first, from the index when the search ranked it lower
    # (overlap_comm: seventh, under tensor_parallel's tp_overlap_comm); a filter that leaves the catalogue out keeps it out
    first = prepare(engine, AskRequest(question="What does overlap_comm do?")).passages[0]
    assert first.source == "config" and "`zero_optimization.overlap_comm` (" in first.text
    said = ask(engine, AskRequest(question="What does overlap_comm do?")).answer  # its type and default once, in the Config line
    assert said.startswith("Config: `zero_optimization.overlap_comm` (") and said.count("default None") == 1
    # and quotes nothing about other keys (tp_overlap_comm's entry and the sentence after it, reduce_bucket_size's
    # entry, pin_memory's later sentence were quoted before); every sentence it quotes is cited
    assert "tp_overlap_comm" not in said and "reduce_bucket_size" not in said and "allreduce supports" not in said
    assert all(line.rstrip().endswith("]") for line in said.split("\n")[1:])
    for key in ("sub_group_size", "stage3_max_live_parameters", "round_robin_gradients"):
        body = ask(engine, AskRequest(question=f"What does {key} do?")).answer.split("\n", 1)[1]
        named = [k for k in re.findall(r"`([a-z_][\w.]*)`", body) if not k[0].isdigit()]
        assert body.startswith(f"`zero_optimization.{key}`") and named == [f"zero_optimization.{key}"], body  # its entry alone
    assert all(p.source == "docs" for p in prepare(engine, AskRequest(question="What does overlap_comm do?", source="docs")).passages)
    unanswerable = [u.question for u in load_unanswerable() + load_unanswerable(UNANSWERABLE_OUTSIDE)]
    assert not [q for q in unanswerable if asks_only_what_key_is(q, keys_named(q, facts))]


def test_a_pasted_config_is_answered_with_the_validators_findings_first(engine) -> None:
    """"Is this config right? {...}" opens with what the real validator (deepspeed's parser behind it) finds,
    the docs' passages after; a whole config is answered whatever the coverage decision says of its words.
    A block inside a question about something else adds nothing when it passes, and a refused question
    keeps its own words on an unknown key. 3 of our answerable questions hold a config block (all pass);
    none holds a whole config: every answer and refusal figure is the same with and without this."""
    config = ('{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, '
              '"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}, "fp16": {"enabled": true}, "bf16": {"enabled": true}}')
    reply = ask(engine, AskRequest(question=f"Is this ds_config right for 8 GPUs? {config}"))
    assert reply.covered
    lines = reply.answer.split("\n")
    assert lines[0].startswith("Your config, checked by deepspeed ") and lines[0].endswith("3 problems.")
    assert any(line.startswith("- `bf16.enabled`: fp16 and bf16 are both enabled") for line in lines[1:4])
    assert any("x world size 8 = 64" in line for line in lines[1:4])
    assert any(line.startswith("- `zero_optimization.offload_param`: offload_param is ignored at ZeRO stage 2") for line in lines[1:4])
    # the docs' answer follows, from whichever passage quotes best (since stop 70 the batch-size note of the
    # config page [2], where a linear unit scorer quoted the autotuning example [1])
    assert re.search(r"\[\d\]$", lines[-1])
    passing = ask(engine, AskRequest(question='is this right {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}'))
    assert passing.covered and passing.answer.startswith("Your config passes deepspeed ")
    block = ask(engine, AskRequest(question='Training on TITAN X cards with "bf16": {"enabled": true} crashes with CUBLAS_STATUS_NOT_SUPPORTED. Is bf16 tied to particular GPUs?'))
    assert "Your " not in block.answer.split("\n")[0]
    refused = ask(engine, AskRequest(question='Can it stream checkpoints to S3 with "checkpoint": {"s3_bucket": "x"}?'))
    assert not refused.covered and "checked by deepspeed" not in refused.answer and "`s3_bucket`" in refused.answer


def test_asking_how_to_set_a_key_shows_where_it_goes_in_the_config(engine) -> None:
    """"How do I set overlap_comm?" ends with the key nested where the config reads it. Every key of the installed
    catalogue with a value to show (a boolean, number or string), asked to set, enable or disable: the fragment
    passes the validator's own checks (known keys at that depth, the catalogue's types); deepspeed's parser
    refuses a few alone for what they need beside them (ZeRO stage 1-3, a CUDA accelerator), which their
    descriptions say."""
    from indexer.config_check import validate_config

    facts = engine.config_facts
    shown = 0
    for key in facts:
        for question in ("How do I set it?", "How do I enable it?", "How do I disable it?"):
            fragment = config_fragment([key], facts, question)
            if fragment:
                shown += 1
                findings = validate_config(fragment).errors
                assert all(f.message.startswith("deepspeed's own config parser rejects it") for f in findings), (key, fragment, findings)
    assert shown > 400
    said = ask(engine, AskRequest(question="How do I set overlap_comm?")).answer
    assert said.rstrip().endswith('In the DeepSpeed config: `{"zero_optimization": {"overlap_comm": true}}`.')
    said = ask(engine, AskRequest(question="How to enable pin_memory for offload_optimizer?")).answer  # default true: enable asked
    assert said.rstrip().endswith('`{"zero_optimization": {"offload_optimizer": {"pin_memory": true}}}`.')
    said = ask(engine, AskRequest(question="How do I set stage3_max_live_parameters?")).answer
    assert '(its default shown): `{"zero_optimization": {"stage3_max_live_parameters": 1000000000}}`' in said
    assert "In the DeepSpeed config" not in ask(engine, AskRequest(question="What does overlap_comm do?")).answer


def test_a_config_block_inside_the_ask_does_not_outweigh_what_it_asks(engine) -> None:
    """Searched with the block's keys as the ask, "how do I save the full model weights?" ranked ZeRO-3's
    "Extracting weights" below five pages about the block's bf16 and offload keys; with the block as context it is
    in the first passages, as when the same block is written as a sentence of its own."""
    block = '{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "bf16": {"enabled": true}}'
    for question in (f"With {block} how do I save the full model weights?", f"My config is {block}. How do I save the full model weights?"):
        reply = ask(engine, AskRequest(question=question))
        assert "Extracting weights" in [p.heading for p in reply.passages[:3]], question
        assert reply.answer.startswith("Your config passes deepspeed")  # the validator's word on the block still leads


def test_asking_what_an_api_symbol_does_is_never_refused(engine) -> None:
    """Every API symbol with a distinctive name (CamelCase or snake_case), asked tersely: the coverage
    decision alone refused 47 of 60 "What does <name> do?" (DeepSpeedCPUAdam, GatheredParameters) while
    the symbol's own API page stood among the passages. None of our labelled questions has this form."""
    names = sorted({p.rsplit(".", 1)[-1] for p in engine.api_pages if api_names_in(p.rsplit(".", 1)[-1], [p])})
    assert len(names) > 50 and "WarmupDecayLR" in names and "safe_get_full_fp32_param" in names
    for form in ("What does {} do?", "{} 是什么意思？", "What is {} for?", "How do I use {}?"):  # the last: 33 refused before
        refused = [n for n in names if not prepare(engine, AskRequest(question=form.format(n))).covered]
        assert not refused, (form, refused[:5])
    assert not api_names_in("What does Init do?", engine.api_pages)  # a common word is no symbol's name
    assert api_names_in("What does zero.Init do?", engine.api_pages) == ["deepspeed.zero.Init"]  # a dotted ending is
    # the answer opens with the symbol and its docstring's first sentence, cited; no stub line ("API `x` in deepspeed
    # 0.19.8."), no torch docstring: 9 and 1 of 120 such answers had one, 0 of 120 opened with the summary
    for name, summary in (("TiledLinear", "A replacement for `torch.nn.Linear` that works with ZeRO-3"),
                          ("zero.Init", "A context to enable massive model construction for training with ZeRO-3.")):
        said = ask(engine, AskRequest(question=f"What does {name} do?")).answer
        assert said.startswith(f"`deepspeed.zero.{name.removeprefix('zero.')}`: {summary}") and said.split("\n")[0].endswith("[1]")
    for name in names:
        said = ask(engine, AskRequest(question=f"What does {name} do?")).answer
        assert not re.search(r"API `[\w.]+` in deepspeed|Base class for all", said), (name, said)
    labelled = [q.question for q in load_question_set()] + [u.question for u in load_unanswerable() + load_unanswerable(UNANSWERABLE_OUTSIDE)]
    assert not [q for q in labelled if (named := api_names_in(q, engine.api_pages)) and asks_only_what_key_is(q, named)]


def test_asking_what_an_api_function_returns_or_takes_leads_with_its_docstring_or_signature(engine) -> None:
    """"What does deepspeed.initialize return?" was answered from sentences that name it (the engine "returned by
    deepspeed.initialize", a scheduler passed to it), the docstring's Returns section unquoted; "What does the config
    argument of deepspeed.initialize do?" from sentences naming initialize, the argument's line unquoted. Now that
    section or line leads, cited, and the symbol's own section is the first passage. None of our labelled questions
    takes either form."""
    said = ask(engine, AskRequest(question="What does deepspeed.initialize return?")).answer
    assert said.startswith("`deepspeed.initialize` returns: A tuple of `engine`, `optimizer`, `training_dataloader`, `lr_scheduler`.")
    assert said.split("\n")[0].endswith("[1]")
    for question in ("What does model_engine.load_checkpoint return?", "load_checkpoint 返回什么？"):
        reply = ask(engine, AskRequest(question=question))
        assert reply.covered and reply.answer.startswith("`deepspeed.runtime.engine.DeepSpeedEngine.load_checkpoint` returns: A tuple of "
                                                         "`load_path` and `client_state`."), reply.answer
        assert reply.passages[0].heading == "deepspeed.runtime.engine.DeepSpeedEngine.load_checkpoint"
    # asked what one of its arguments is, the argument's line leads, told with the call
    for question, lead in (("What does the config argument of deepspeed.initialize do?",
                            "`deepspeed.initialize(config=...)`: Optional: Instead of requiring args.deepspeed_config"),
                           ("init_inference 的 config 参数是什么？", "`deepspeed.init_inference(config=...)`: Optional: instead of arguments"),
                           ("What is the partition_method parameter of PipelineModule?",
                            "`deepspeed.pipe.PipelineModule(partition_method=...)` (str, optional): The method upon which")):
        reply = ask(engine, AskRequest(question=question))
        lines = [line for line in reply.answer.split("\n") if not line.startswith("术语")]  # a Chinese question's terms first
        assert reply.covered and lines[0].startswith(lead) and lines[0].endswith("[1]"), reply.answer
    # asked which arguments it takes, its signature in the installed deepspeed answers first
    said = ask(engine, AskRequest(question="What arguments does deepspeed.initialize take?")).answer
    assert said.startswith("`deepspeed.initialize` takes: `args=None`, `model: Module = None`, `optimizer=None`, "
                           "`model_parameters: Optional[Module] = None`,"), said  # a short annotated type beside its name
    assert "`distributed_port: int = 29500`" in said.split("\n")[0] and "`config=None`" in said.split("\n")[0]
    # a required argument is named bare, one whose default is an object only says it may be left out
    said = ask(engine, AskRequest(question="Which arguments does save_checkpoint take?")).answer
    assert "save_checkpoint` takes: `save_dir`, `tag=None`, `client_state={}`, `save_latest=True`" in said.split("\n")[0], said
    said = ask(engine, AskRequest(question="PipelineModule 有哪些参数？")).answer
    takes = next(line for line in said.split("\n") if "PipelineModule` takes: `layers`, `num_stages=None`" in line)
    assert "`activation_checkpoint_func=...`" in takes and "0x" not in takes
    labelled = [q.question for q in load_question_set()] + [u.question for u in load_unanswerable() + load_unanswerable(UNANSWERABLE_OUTSIDE)]
    assert not [q for q in labelled if api_line_asked(engine, q)[0]]


def test_asking_how_to_use_a_documented_feature_is_answered(engine) -> None:
    """A docs page's title or a config section's name asked about tersely ("How do I enable Domino?", "How does
    ZenFlow work?", "What is the elasticity config for?"): the
    coverage decision alone refused 16 of 72 and 25 of 72 such probes while the page stood among the
    passages. The page answers it; none of our labelled questions takes the rule."""
    titles = sorted(engine.page_titles)
    assert len(titles) > 100 and "ZenFlow" in titles
    for form in ("How do I use {}?", "How do I enable {}?", "How does {} work?", "{} 怎么用？"):
        refused = [t for t in titles if not prepare(engine, AskRequest(question=form.format(t))).covered]
        assert len(refused) <= 0.03 * len(titles), (form, refused)  # what is left: generic titles ("Getting Started")
    assert not prepare(engine, AskRequest(question="When was ZenFlow released?")).covered  # a date asks more
    labelled = [q.question for q in load_question_set()] + [u.question for u in load_unanswerable() + load_unanswerable(UNANSWERABLE_OUTSIDE)]
    assert not [q for q in labelled if (named := titles_in(q, engine.page_titles)) and asks_only_what_key_is(q, named)]


def test_asking_what_a_named_page_is_about_leads_with_that_page(engine) -> None:
    """"What is ZeRO?" led with ZeRO++ (ranked first) and "what is ZeRO-Offload?" with ZeRO-Infinity; the page
    the question names now stands first and the lead is its own (`named_page_first`), the longest title named."""
    reply = ask(engine, AskRequest(question="What is ZeRO?"))
    assert reply.passages[0].title == "ZeRO" and reply.answer.startswith("The Zero Redundancy Optimizer (ZeRO) removes"), reply.answer
    reply = ask(engine, AskRequest(question="what is ZeRO-Offload?"))
    assert reply.passages[0].title == "ZeRO-Offload" and reply.answer.startswith("ZeRO-Offload is"), reply.answer
    reply = ask(engine, AskRequest(question="What does TiledLinear do?"))
    assert reply.passages[0].path.endswith("TiledLinear") and ":ivar" not in reply.answer, reply.answer
    # a question that asks more keeps the retriever's order
    plain = prepare(engine, AskRequest(question="Why does ZeRO-3 slow down my training compared to stage 2?"))
    searched = engine.retriever.search("Why does ZeRO-3 slow down my training compared to stage 2?", 5)
    assert [p.id for p in plain.passages] == [h.chunk.id for h in searched.hits]


def test_apple_silicon_is_answered_from_our_note(engine) -> None:
    """The docs never say whether a Mac's GPU works; the installed deepspeed has an MPS accelerator, and our note
    says what it does. Before the note, "Does DeepSpeed support Apple M1 GPUs?" was answered from the Intel XPU guide."""
    for question in ("Does DeepSpeed support Apple M1 GPUs?", "Can I train with deepspeed on my MacBook?"):
        reply = ask(engine, AskRequest(question=question))
        assert reply.covered and reply.passages[0].title == "DeepSpeed on Apple silicon (MPS)", (question, reply.answer)
        assert "mps" in reply.answer.lower(), reply.answer


def test_a_question_quoting_a_message_deepspeed_raises_is_answered(engine) -> None:
    """"I get <exception>: <message>" for messages of the error catalogue: the coverage decision refused 21 of
    40 sampled ones. The raising line and its condition answer such a question, and lead the answer."""
    rows = [json.loads(line) for line in (engine.index.path / "errors.jsonl").read_text(encoding="utf-8").splitlines()[1:]]
    rows = [r for r in rows if r["exception"] and 8 <= len(r["template"].split()) <= 30 and r["template"].count("{}") <= 2]
    sample = random.Random(1).sample(rows, 40)
    replies = [ask(engine, AskRequest(question=f"I get {r['exception']}: {r['template'].replace('{}', '8')}")) for r in sample]
    assert sum(not r.covered for r in replies) <= 3
    assert sum("(source: https://github.com/deepspeedai/DeepSpeed/blob/" in r.answer for r in replies) >= 15
    # the message pasted alone, without its exception class: 1 of 60 sampled led with its raising line, now 58
    bare = [ask(engine, AskRequest(question=r["template"].replace("{}", "8"))) for r in sample[:20]]
    assert sum(r.answer.startswith("Raised by ") or "(source: https://github.com/deepspeedai/DeepSpeed/blob/" in r.answer.split("\n")[0]
               for r in bare) >= 16
    told = ask(engine, AskRequest(question="fp16 is not supported on CPU"))  # a statement, not deepspeed's message
    assert "(source: https://github.com/deepspeedai/DeepSpeed/blob/" not in told.answer


KEYWORD_SEARCHES = [
    "zero3 offload config example", "bf16 config", "hostfile format", "zero stage 2 json", "pipeline parallel example",
    "deepspeed launcher multi node", "fp16 loss scaling", "activation checkpointing config", "moe expert parallel",
    "flops profiler usage", "nvme offload config", "gradient accumulation deepspeed", "deepspeed inference tensor parallel",
    "wandb monitor config", "deepspeed autotuning", "curriculum learning config", "zero++ config", "torch.compile deepspeed",
    "ds_report", "cpu adam", "fused adam build error", "deepspeed mpi launch", "sequence parallel ulysses",
    "offload optimizer cpu pin memory", "deepspeed config batch size", "save checkpoint zero3", "load checkpoint different gpus",
    "comms logging", "deepspeed hf trainer", "deepspeed zero init", "GatheredParameters example", "estimate memory zero3",
    "lr scheduler warmup", "deepspeed elastic", "deepspeed compression", "ZeRO-Offload", "ZeRO-Infinity",
    "zero_to_fp32 usage", "universal checkpoint conversion", "accelerate deepspeed plugin",  # still refused: a word the passage lacks
]


def test_a_keyword_search_the_first_passage_matches_is_answered(engine) -> None:
    """Keywords typed as into a search box: the coverage decision refused 9 of 40 ("ZeRO-Infinity",
    "ds_report", "hostfile format") while the first passage held every keyword. None of our labelled
    questions is written so (`is_keyword_query`): no figure moves."""
    refused = [q for q in KEYWORD_SEARCHES if not prepare(engine, AskRequest(question=q)).covered]
    assert len(refused) <= 4, refused
    assert not prepare(engine, AskRequest(question="deepspeed release date")).covered  # a date asks what docs do not hold


def test_a_setting_nothing_indexed_names_is_said_so(engine) -> None:
    """A question that writes out a config key or a launcher flag DeepSpeed never had is refused, and
    the reply names it; real keys and flags written the same way are known (tune CV at the 2% conformal
    threshold: held-out unanswerable refused 73.1% -> 81.2%, answerable refused 2.4% -> 2.3%). Whether such a
    question is answered is the coverage decision's, measured as false refusals on the test split (this terse
    one, "what overlaps?", is refused since stop 42's full-precision query encoder, but not for its settings)."""
    reply = ask(engine, AskRequest(question='How do I tune "stage3_prefetch_strategy": "adaptive" under zero_optimization?'))
    assert not reply.covered and reply.answer.startswith("`stage3_prefetch_strategy` appears nowhere")
    assert reply.passages  # the closest matches are still listed
    flag = ask(engine, AskRequest(question="Does the deepspeed launcher's --gpu_type flag pick nodes by GPU model?"))
    assert not flag.covered and "`gpu_type`" in flag.answer
    terse = 'With "overlap_comm": true and deepspeed --num_gpus 8, what overlaps?'
    assert engine.retriever.search(terse, 5).unknown_settings == ()
    assert "appears nowhere" not in ask(engine, AskRequest(question=terse)).answer
    # a misspelt key is told the catalogue key it nearly spells, and a made-up one none
    typo = ask(engine, AskRequest(question='my ds_config: {"zero_optimization": {"stage": 2, "overlap_comms": true}}, what is wrong with it?'))
    assert not typo.covered and "did you mean `zero_optimization.overlap_comm`?" in typo.answer
    assert "did you mean" not in reply.answer


def test_an_argument_the_installed_function_lacks_is_said_first(engine, dev_questions: Path) -> None:
    """A question passing a DeepSpeed function a keyword argument the installed one does not take hears so
    first, refused or answered (`indexer/api_signatures.py`). Real arguments are never flagged: none of the
    700 questions of our set passes one it lacks, nor the dev set; 4 of tune's 299 unanswerable questions do
    (tune CV at the 1.75% quantile: 87.25% -> 87.89% refused, 2.10% -> 2.02% of the answerable)."""
    from indexer.config_catalogue import deepspeed_version

    reply = ask(engine, AskRequest(question="Does deepspeed.initialize(..., seed=1234) seed torch, numpy and random on every rank?"))
    assert reply.answer.startswith(f"`deepspeed.initialize` takes no keyword argument `seed` in deepspeed {deepspeed_version()}.")
    assert reply.passages
    saved = ask(engine, AskRequest(question="Will engine.save_checkpoint(out, tag, tokenizer=tok) put the tokenizer next to the shards?"))
    assert saved.answer.startswith("`deepspeed.runtime.engine.DeepSpeedEngine.save_checkpoint` takes no keyword argument `tokenizer`")
    real = "Can deepspeed.initialize(model=model, config=ds_config, model_parameters=model.parameters()) take a dict config?"
    assert engine.retriever.search(real, 5).unaccepted_arguments == ()
    assert "takes no keyword argument" not in ask(engine, AskRequest(question=real)).answer
    questions = [q.question for q in load_question_set()] + [q.question for q in load_questions(dev_questions)]
    assert len(questions) >= 760 and not [q for q in questions if engine.retriever.unaccepted_arguments(q)]


def test_a_pasted_message_of_a_known_failure_leads_with_it(engine) -> None:
    """A pasted message no line of deepspeed raises but our notes' known failures hold ("CUDA out of memory",
    NCCL's watchdog timeout) was answered from passages that only share its words (CUDA version mismatch) or
    refused; it now leads with that failure and its fix. A question asked about such a message is answered
    from the docs as before (test evidence 71.78% either way; one answerable test question fewer refused)."""
    oom = ask(engine, AskRequest(question="torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert oom.covered and oom.answer.startswith("CUDA out of memory during training: ")
    nccl = ask(engine, AskRequest(question="torch.distributed.DistBackendError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
                                           "OpType=ALLREDUCE) ran for 600005 milliseconds before timing out."))
    assert nccl.covered and nccl.answer.startswith("NCCL watchdog timeout on a collective: ")
    # pasted alone, the failure's why and fix are the whole answer: the passages after it shared only the message's
    # words ("No module named 'deepspeed'" went on with set_z3_leaf_modules, the out of memory with CUDA versions)
    for reply in (oom, ask(engine, AskRequest(question="ModuleNotFoundError: No module named 'deepspeed'"))):
        lead, rest = reply.answer.split("\n", 1)
        assert "(source: dsqa://notes/known-errors#" in lead and rest == ERROR_LINE, reply.answer
        assert f"(source: {reply.passages[0].url})" in lead  # the note it quotes heads the passages (fifth or absent)
    # a message without an exception class, refused before as no error at all
    bare = ask(engine, AskRequest(question="[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, "
                                           "NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800439 milliseconds before timing out."))
    assert bare.covered and bare.answer.startswith("NCCL watchdog timeout on a collective: ")
    # a message line pasted without its exception class was answered from passages that share its words (23 of the
    # notes' 314 failures led with their own when pasted so, 260 now): the failure leads, deepspeed's raising line cited
    line = ask(engine, AskRequest(question="Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."))
    assert line.answer.startswith("Fp16 loss scale hits its minimum") and "/deepspeed/runtime/fp16/loss_scaler.py#L" in line.answer
    # a whole traceback pasted: its frames are no words of the asker (it was answered from loss.backward passages)
    traceback = ("Traceback (most recent call last):\n  File \"/home/user/train.py\", line 55, in <module>\n    loss.backward()\n"
                 "  File \"/opt/conda/lib/python3.10/site-packages/torch/_tensor.py\", line 522, in backward\n"
                 "    torch.autograd.backward(\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB.")
    assert ask(engine, AskRequest(question=traceback)).answer.startswith("CUDA out of memory during training: ")
    # asked for nothing but its cause or fix, a known failure is the answer too (3 of the notes' 315 failures, asked as
    # "RuntimeError: <its text>. How do I fix this?", led with their own; 282 now): "why?" was answered with set_z3_leaf_modules
    why = ask(engine, AskRequest(question="I get ModuleNotFoundError: No module named 'deepspeed' when I run my script, why?"))
    assert why.answer.startswith("DeepSpeed is not installed in the environment") and why.answer.endswith(ERROR_LINE)
    assert ask(engine, AskRequest(question="训练报 RuntimeError: Error building extension 'cpu_adam' 怎么解决？")).answer.startswith("An op fails to build")
    # someone telling of the message asks nothing else: its failure leads, the docs' passages follow
    told = ask(engine, AskRequest(question="my run stops with Current loss scale already at minimum after 2 hours on V100, fp16"))
    assert told.answer.startswith("Fp16 loss scale hits its minimum") and "[1]" in told.answer
    # a message deepspeed raises keeps the docs' passages after its line (they held the answer of test questions)
    batch = ask(engine, AskRequest(question="AssertionError: Check batch related parameters. train_batch_size is not equal to "
                                            "micro_batch_per_gpu * gradient_acc_step * world_size 16 != 4 * 1 * 2"))
    assert batch.answer.count("\n") >= 2 and "[1]" in batch.answer
    asked = ask(engine, AskRequest(question="torch.cuda.OutOfMemoryError: CUDA out of memory. Does DeepSpeed have guidance on "
                                            "memory fragmentation?"))
    assert not asked.answer.startswith("CUDA out of memory during training")


def test_each_question_kind_gets_its_answer_shape(engine) -> None:
    """Error, version, compare, config and how-to questions on the real index (app/answer_shapes.py)."""
    def answer(question: str) -> str:
        reply = ask(engine, AskRequest(question=question))
        assert reply.covered, question
        return reply.answer

    error = answer("AssertionError: Check batch related parameters. train_batch_size is not equal to "
                   "micro_batch_per_gpu * gradient_acc_step * world_size 16 != 4 * 1 * 2. How do I fix it?")
    assert error.endswith(ERROR_LINE) and "train_batch_size" in error
    removed = answer("Was the elasticity config block removed from DeepSpeed?")
    assert "Elastic training has been removed" in removed.split("[1]")[0]  # the installed version's word first
    compare = answer("ZeRO stage 2 vs stage 3: which one should I pick?")
    assert re.search(r"stage 2|zero-2", compare, re.I) and re.search(r"stage 3|zero-3", compare, re.I)  # both sides named
    config = answer("What does overlap_comm do?")
    assert config.startswith("Config: `zero_optimization.overlap_comm` (bool")
    howto = answer("How do I launch training on two nodes with a hostfile?")
    sid = howto.rsplit("Example: snippet `", 1)[1].split("`")[0]
    assert engine.index.snippets[sid].kind in ("launcher", "hostfile")


def test_shipped_answer_unit_scorer_is_the_one_tune_gives(engine, tmp_path: Path) -> None:
    report = train_answer_units(engine, load_split("tune"), tmp_path / "u.json")
    fresh, shipped = load_unit_model(tmp_path / "u.json"), load_unit_model()
    assert fresh is not None and shipped is not None and engine.unit_model is not None
    # where early stopping ends may move by a tree or two with cosines a hair apart on another machine
    assert fresh.feature.shape[0] == report["trees_fitted"] <= report["trees"]
    assert abs(fresh.feature.shape[0] - shipped.feature.shape[0]) <= max(5, shipped.feature.shape[0] // 10)
    # the whole split: its adapter folds are the ones train_answer_units just fitted (remembered); a part refits them
    rows = np.vstack([d.rows for d in question_units(engine, load_split("tune"))])
    # the same trees give the same probabilities (a cosine a hair apart on another machine may cross a threshold)
    assert np.abs(probability(fresh, rows) - probability(shipped, rows)).mean() < 0.02
    assert report["with_relevant_unit"] > 80
    # the unit adapter beside it, and the shipped one the engine reads
    fresh_adapter, shipped_adapter = load_query_adapter(tmp_path / UNIT_ADAPTER_FILE.name), load_query_adapter(UNIT_ADAPTER_FILE)
    assert fresh_adapter is not None and shipped_adapter is not None and engine.unit_adapter is not None
    assert np.abs(fresh_adapter.delta - shipped_adapter.delta).max() < 0.01 < np.abs(shipped_adapter.delta).max()
    with pytest.raises(ValueError, match="tune questions only"):
        train_answer_units(engine, load_split("test")[:3], tmp_path / "x.json")


def test_shipped_coverage_decision_is_the_one_tune_gives(engine, tmp_path: Path) -> None:
    tune_unanswerable = [u for u in load_unanswerable() + load_unanswerable(TERSE_UNANSWERABLE) if split_of(u.id) == "tune"]
    training_only = load_training_unanswerable()
    report = train_on_tune(engine.retriever, tmp_path / "a.json", with_cv=False)
    fresh, shipped = load_abstention(tmp_path / "a.json"), load_abstention()
    assert fresh is not None and shipped is not None
    assert max(report["tune_false_abstention"].values()) <= 0.03
    assert set(fresh.group_thresholds) == set(shipped.group_thresholds) == {TERSE}
    # the refusal memory beside it: the tune and training-only unanswerable questions' vectors, the engine's the same
    fresh_memory, shipped_memory = load_refusal_memory(tmp_path / REFUSAL_MEMORY_FILE.name), load_refusal_memory()
    assert fresh_memory is not None and shipped_memory is not None
    assert engine.retriever.options.refusal_memory is not None and len(shipped_memory.vectors) == len(tune_unanswerable) + len(training_only)
    assert np.abs(fresh_memory.vectors - shipped_memory.vectors).max() < 0.01
    assert fresh_memory.probe is not None and shipped_memory.probe is not None  # and its leaning probe
    assert np.abs(fresh_memory.probe - shipped_memory.probe).max() < 0.05
    assert fresh_memory.wording is not None and shipped_memory.wording is not None  # and its wording probe
    sample = [q.question for q in load_split("test")[:60]]
    assert max(abs(fresh_memory.wording.logit(q) - shipped_memory.wording.logit(q)) for q in sample) < 0.01
    # the same decision, not the same weights: BM25's two strengths and the top passage's cover move
    # together, and an index built again (the chunk vectors differ in the last float bits) shifted
    # their weights by up to 0.1 while the two models' decisions agreed on 99.8% of the test questions
    questions = [q.question for q in load_split("test") + load_questions(TERSE_QUESTIONS) if split_of(q.id) == "test"] + \
        [u.question for u in load_unanswerable() + load_unanswerable(TERSE_UNANSWERABLE) if split_of(u.id) == "test"]
    rows = coverage_rows(engine.retriever, questions)
    fresh_scores, shipped_scores = fresh.score(rows), shipped.score(rows)
    groups = [coverage_group(q) for q in questions]
    fresh_yes = fresh_scores >= np.array([fresh.threshold_for(g) for g in groups])
    agree = np.mean(fresh_yes == (shipped_scores >= np.array([shipped.threshold_for(g) for g in groups])))
    assert agree >= 0.98 and np.corrcoef(fresh_scores, shipped_scores)[0, 1] >= 0.995, agree


def test_training_only_unanswerables_are_no_near_copy_of_a_scored_one(engine) -> None:
    """A training-only unanswerable question close in meaning to a scored one (test, the outside set) would
    lift the figures it is scored by: none has a base-encoder cosine of 0.75 or more with any (the rule they
    were filtered by when written). The terse set's are held to a lexical rule instead (the English encoder
    puts unrelated short Chinese questions at a cosine near 1): no training-only one shares half the
    character trigrams of the two (Jaccard) with one of them."""
    from eval.adapter_training import base_vectors

    scored = load_unanswerable() + load_unanswerable(UNANSWERABLE_OUTSIDE)
    training = load_training_unanswerable()
    closest = (base_vectors(engine.retriever, [u.question for u in training])
               @ base_vectors(engine.retriever, [u.question for u in scored]).T).max(axis=1)
    assert float(closest.max()) < 0.75, training[int(closest.argmax())].question

    def trigrams(text: str) -> set[str]:
        flat = " ".join(text.lower().split())
        return {flat[i:i + 3] for i in range(len(flat) - 2)}

    terse = [trigrams(u.question) for u in load_unanswerable(TERSE_UNANSWERABLE)]
    for u in training:
        mine = trigrams(u.question)
        assert all(len(mine & t) < 0.5 * len(mine | t) for t in terse), u.question


def test_doctor_as_shipped_on_real_error_logs(engine) -> None:
    """The doctor the front ends call (with retrieval over the real index; `dsqa eval doctor`), measured at
    landing on the 122 real error logs: test cause right at 1 71.2% of 66 (69.7% without retrieval, the figure
    tests/test_doctor.py floors), tune 96.4% of 56; the raising line among the first three for 88.5% of the 26
    test logs deepspeed raises. Stop 54 added the last 21 (err-141..161, threads no set had used; 14 in test),
    scored before anything was written for them: 11 right (tune 5 of 7, test 6 of 14), which took test from
    78.8% of 52 to 71.2% of 66; two sections for the tune misses moved no test log. Stop 38 added three batches of tune-only logs (69, 56 and 55; tune-err-137..353),
    each scored before anything was written for it: 46.4%, 71.4% and 41.7% (48 of the third) cause right; what
    their misses showed (a known text close to a message only when the message holds its names; texts marked
    `(follow-up)`, such as "Error building extension", giving way to the line the log shows earlier; the
    catalogue's class-name field matching only the raising class and its subclasses; 19 known-error sections
    and wording in 23) took the 316 tune-only logs to 79.1% cause right and 82.1% source in 3 (of 84), and
    test from 69.2% to 76.9% (65.4% -> 73.1% without retrieval; nothing was chosen on test). Stop 37 added 70 tune-only logs (`eval/training/error_logs/tune_only.jsonl`,
    threads the split set does not use), scored before anything changed at 61.4% cause right and 76.7% source
    in 3 (of 30); what their misses showed (an exception quoted in prose, a traceback cut off inside deepspeed,
    a message followed by code, a conditional message, a message without its full stop, a known cause's text
    worded a little differently, and four known-error sections plus wording in seven) took them to 90.0% and
    90.0%, and test from 59.6% to 67.3% (nothing was chosen on test). A second batch of 66 tune-only logs
    (tune-err-071..) scored before anything was written for it: 40.9% cause right, 73.7% source in 3 (of 19);
    one mechanism change chosen on it (a short generic exact pattern gives way to a close, longer message):
    all 136 tune-only logs 66.2% / 85.7% (of 49), test unchanged; then seven sections and wording in eight
    for its misses: 75.7% / 85.7%, test 69.2% (65.4% without retrieval). Before (stop 36): 59.6%, 53.8% without
    retrieval. Stop 39 added 98 tune-only logs (tune-err-354..485, four threads dropped), scored as they came:
    50.0% cause right, with or without stop 39's one change (a bare `Exception:` line, and the last failing line
    of a log with no exception line); all 414 tune-only logs stood at 72.5% cause right and 84.0% source in 3
    (of 106). Stop 40 wrote 14 sections and wording in 10 for their misses: those 98 went 50 -> 82 right, the
    414 to 80.4% / 84.0%, test unchanged at 76.9% (nothing chosen on it). Stop 41 added 116 tune-only logs
    (batch H, tune-err-486..645 with gaps; 16 of its 132 dropped: rebuilt or unsettled logs, threads the question
    sets use), scored before anything was written for them: 30.2% (35 of 116); 28 sections and wording in 19 for
    their misses took them to 87.9% (102), all 530 tune-only logs to 82.3% / 85.0% (of 120), and test from 76.9%
    to 78.8% (73.1% -> 75.0% without retrieval; nothing chosen on test). Then 11 sections and wording in six for
    mechanisms older tune-only misses share two or three times (curand and FP6 symbols, MPI rank check, diffusers
    pipelines, Trainer.deepspeed, _restore_from_bit16_weights, tensors on two devices, illegal memory access,
    load_state_dict arguments, pipeline timers, the consolidated 16-bit state dict): 530 -> 87.4%. Batch I, 18
    logs (tune-err-700..827, the threads left unused are few), scored fresh: 44.4% (8); two sections and wording
    in five: 15. Then two sections and wording in two for older misses (ZeRO-3 parameter-state assertions,
    NVMe offload with a GPU optimizer, accelerate's DeepSpeedPlugin). All 548: 88.7% / 85.2% (of 122); test
    unchanged at 78.8%. Against stop 40's note on the 548 logs (without retrieval): 366 -> 480 right, none worse. Stop 42:
    17 sections and wording in 10 for mechanisms the remaining tune-only misses show (pinned memory under WSL2,
    config blocks given plain values, MPI launcher limits, ZeRO-3 defragment, ...) and two broad texts narrowed:
    548 -> 92.9% / 85.2% (480 -> 508 without retrieval, none worse); test 78.8% (75.0% -> 76.9% without
    retrieval); then the full-precision query encoder (issue 13: no question's hit@5 may move against torch)
    took test to 76.9% (one log the retrieval fallback had answered). Batch J: 43 more tune-only logs from
    threads no set had used, scored before anything was written for them: 3 of 43 right (7.0%), the 591 at
    87.1%; a log that only says it hangs then gets the known causes of a stall: 87.6%; ten sections for
    the batch's misses (NVMe swapper bugs, PEP 604 on Python 3.9, launcher quoting, import-time CUDA and start
    method, the ZeRO-3 TrainingArguments order, 0.18's OpenMPI check, pdsh exports, glog, op_builder
    packaging, parallel op builds) and the Triton cache's two stray messages: 90.7% (test unchanged). Batch K:
    25 more, scored fresh: 6 right (24.0%; the 616 at 88.0%); four sections (ZeRO-3 over bitsandbytes, YAML's
    5e8, get_accelerator on an old DeepSpeed, wheel tags) and wording in four: 89.4% (test unchanged). Batch L (stop 59):
    20 more (tune-err-x01..w11; three searchers found few threads left unused), scored fresh: 11 right (55.0%); four
    sections (DeepSpeed not installed, an empty --master_addr, transformers 4.53's --deepspeed parsing, ms-swift's
    one process for several GPUs) and wording in two (hidden_size as an AttributeError, PEFT's empty modules_to_save):
    17 of 20, the 636 at 89.3% (test unchanged). Batch M (stop 60): 5 more (tune-err-va01..vb02; two searchers found
    five settled threads left), scored fresh: 4 right; one section (LLaMA-Factory's FORCE_TORCHRUN): 5 of 5, the 641 at
    89.4% (test unchanged). Issue 15's 80% is not reached. Paraphrased failures the note covers lead with their known
    cause; an error nothing is close to does not get one."""
    from corpus import NOTES_DIR
    from eval.doctor_eval import run_doctor_eval

    index, retriever = engine.require()
    results = run_doctor_eval(index.path, retriever, NOTES_DIR)
    print(results["shipped"]["test"], results["without_retrieval"]["test"])
    shipped, bare = results["shipped"], results["without_retrieval"]
    assert shipped["test"]["matched"]["none"] == 0 and shipped["test"]["matched"]["retrieval"] > 0
    assert shipped["test"]["cause_at_1"] >= 0.69 and shipped["test"]["source_in_3"] >= 0.85
    assert shipped["test"]["cause_at_1"] >= bare["test"]["cause_at_1"] and shipped["tune"]["cause_at_1"] >= 0.9
    assert shipped["tune_only"]["logs"] == 641 and shipped["tune_only"]["cause_at_1"] >= 0.89 and shipped["tune_only"]["source_in_3"] >= 0.83
    from app.doctor import diagnose_with

    def first_cause(message: str) -> str:
        log = f'Traceback (most recent call last):\n  File "train.py", line 1, in <module>\n{message}'
        top = diagnose_with(index.path, retriever, log, NOTES_DIR).causes[0]
        return top.title if "closest known failure" in top.explanation else ""

    # cosines at landing 0.79 and 0.69 (the threshold is 0.6), the unrelated one 0.50
    assert first_cause("RuntimeError: no GPU found: the deepspeed launcher sees no CUDA devices on this machine") == "The launcher sees no GPU"
    assert first_cause("RuntimeError: ssh to the other node failed because passwordless ssh is not set up for the launcher") \
        == "Passwordless SSH to a node is missing"
    assert first_cause("ValueError: the learning rate frobnicator is misconfigured") == ""


def test_the_doctor_finds_a_known_failure_told_in_other_words(engine) -> None:
    """`dsqa eval doctor --known-ablation` on every fourth tuning log: of those whose first cause is a known one the
    log shows a text of, the share right once that cause's texts are taken away (found again by meaning) and once the
    cause is taken away (right from elsewhere). With the cause chosen by meaning and words (`app.known_cause_search`)
    65.8% and 22.8% of these 158 (64.0% and 24.4% of all 636); by meaning alone 46.2% and 21.5%; by meaning alone and
    after a close text and a release's bug 30.4% and 16.5%."""
    from corpus import NOTES_DIR
    from eval.doctor_eval import all_error_logs, run_known_ablation

    index, retriever = engine.require()
    result = run_known_ablation(index.path, retriever, NOTES_DIR, [log for log in all_error_logs() if log.split != "test"][::4])
    print(result)
    assert result["known_first"] >= 140 and result["new_wording_share"] >= 0.6 and result["unknown_share"] >= 0.19


def test_a_pasted_log_is_answered_with_the_doctors_first_cause(engine) -> None:
    """A log pasted into /ask (Slack, the web page, MCP's ask) was answered from passages that share its words unless
    it was little but an exception line: of the 641 tune-only error logs asked as they were pasted, 164 led with the
    doctor's first cause at 95285ca (157 of the 572 the doctor got right); a traceback's frames, a launcher's output
    around the error, a message without its exception class now count as the log they are, and 560 do (541 of 573;
    the 66 held-out test logs: 19 -> 54). Every third log here, the doctor without retrieval as /ask calls it."""
    from app.doctor import diagnose_with
    from eval.doctor_eval import TUNE_ONLY_LOGS, load_error_logs

    index, _ = engine.require()
    logs = load_error_logs(TUNE_ONLY_LOGS, tune_only=True)[::3]
    led = 0
    for log in logs:
        pasted = log.log[-MAX_QUESTION_CHARS:].strip()
        first = ask(engine, AskRequest(question=pasted)).answer.split("\n")[0]
        top = diagnose_with(index.path, None, pasted, engine.settings.notes_dir).causes[0]
        led += bool(top.source_url and top.source_url in first) or top.title[:40].lower() in first.lower()
    assert led >= 0.8 * len(logs), (led, len(logs))
