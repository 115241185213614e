"""The answer side: whole text units, the composed answer, version notes, Chinese terms, cut segments,
the unanswerable set, the coverage signals and the guard that keeps learned models to their encoder."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.answer import (
    NOT_COVERED,
    Source,
    about_other_option,
    compose,
    extractive_answer,
    restated,
    scored_candidates,
)
from app.answer_keys import about_other_keys, config_line, keys_named, owners
from app.answer_shapes import key_line
from app.ask import terms_line
from app.coverage import COVERAGE_FEATURES, coverage_features
from app.engine import retrieval_options
from app.glossary import Glossary
from app.installed_mismatch import version_notes
from app.ranking import QuerySignals, chunk_terms
from app.retriever import Hit
from app.settings import Settings
from eval.answer_quality import (
    UNANSWERABLE,
    UNANSWERABLE_OUTSIDE,
    answer_words,
    has_evidence,
    is_cut,
    load_training_unanswerable,
    load_unanswerable,
    segments,
)
from eval.question_set import load_question_set, split_of
from indexer.documents import Chunk, Snippet
from indexer.text_units import argument_unit, text_units, unit_table, without_type_and_default
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
    outside = load_unanswerable(UNANSWERABLE_OUTSIDE)  # never trained or tuned on
    assert len(outside) >= 80 and {u.id for u in outside}.isdisjoint({r["id"] for r in rows})
    assert {u.question for u in outside}.isdisjoint({r["question"] for r in rows})
    assert Counter(u.lang for u in outside)["zh"] >= 20 and all(u.kind for u in outside)
    # the chatty part is written like the answerable questions (a decision cannot tell them apart by length)
    chatty = [r["question"] for r in rows if r["id"].startswith("un-c-") and r["lang"] == "en"]
    asked = [q.question for q in load_question_set() if q.lang == "en"]
    assert len(chatty) >= 60 and abs(statistics.median(map(len, chatty)) / statistics.median(map(len, asked)) - 1) < 0.2


def test_training_only_unanswerable_questions_stay_apart_from_the_scored_ones(tmp_path: Path) -> None:
    """`eval/training/unanswerable/`: each checked (its `why`) and of a kind, en and zh, never an id or a
    question of a scored set; an id used twice or taken from a scored set is refused."""
    training = load_training_unanswerable()
    assert len(training) >= 100 and len({u.id for u in training}) == len(training)
    assert Counter(u.lang for u in training)["zh"] >= 30 and all(u.kind for u in training)
    scored = load_unanswerable() + load_unanswerable(UNANSWERABLE_OUTSIDE)
    assert {u.id for u in training}.isdisjoint({u.id for u in scored})
    assert {u.question for u in training}.isdisjoint({u.question for u in scored})
    assert load_training_unanswerable(tmp_path / "absent") == []
    row = {"id": "un-x-1", "question": "When was DeepSpeed 0.1 tagged?", "lang": "en", "kind": "release-date", "why": "grep"}
    (tmp_path / "a.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(row), encoding="utf-8")
    with pytest.raises(ValueError, match="already used"):
        load_training_unanswerable(tmp_path)
    (tmp_path / "a.jsonl").write_text(json.dumps({**row, "id": scored[0].id}), encoding="utf-8")
    with pytest.raises(ValueError, match="already used"):
        load_training_unanswerable(tmp_path)
    (tmp_path / "a.jsonl").write_text(json.dumps(row), encoding="utf-8")
    assert [u.id for u in load_training_unanswerable(tmp_path)] == ["un-x-1"]


def test_the_coverage_decision_fit_and_its_cross_validation() -> None:
    """`fit_decision` fills the memory columns as for new questions (a remembered question does not resemble
    itself) and sets the threshold at the conformal quantile; `cross_validate` holds out answerable and scored
    unanswerable rows, never the training-only ones, and on separable rows refuses the unanswerable ones and
    few answerable ones."""
    from app.refusal_memory import REFUSAL_FLOOR
    from eval.abstention_training import _BEST, _LEANING, _WORDING, cross_validate, fit_decision

    rng = np.random.default_rng(0)
    width = len(COVERAGE_FEATURES)

    def rows(n: int, centre: float) -> np.ndarray:
        x = rng.normal(0.0, 1.0, (n, width))
        x[:, 0] += centre
        return x

    def unit(n: int, axis: int) -> np.ndarray:
        v = rng.normal(0.0, 0.05, (n, 8)).astype(np.float32)
        v[:, axis] += 1.0
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    pos, neg = rows(120, 3.0), rows(100, -3.0)
    pos_v, neg_v = unit(120, 0), unit(100, 1)
    ids = [f"a{i}" for i in range(120)] + [f"u{i}" for i in range(100)]
    asks = ["How do I set up stage {} offload for my model?", "Is there a way to fix error {} in my run?"]
    unknowable = ["When will release {} come out, and what do you expect?", "什么时候发布 {} 版本？"]
    texts = [asks[i % 2].format(i) for i in range(120)] + [unknowable[i % 2].format(i) for i in range(100)]
    fitted, filled_pos, filled_neg = fit_decision(pos, neg, pos_v, neg_v, ids, texts, alpha=0.05)
    assert not np.allclose(filled_neg[:, _BEST], (neg_v @ neg_v.T).max(axis=1) - REFUSAL_FLOOR)  # itself left out
    pos_scores = ((filled_pos - fitted.mean) / fitted.scale) @ fitted.weights + fitted.bias
    assert np.sum(pos_scores < fitted.threshold) == int(np.floor(0.05 * 121)) - 1
    remembered = fitted.scores(neg[:1], neg_v[:1], texts[120:121])
    assert remembered.shape == (1,) and remembered[0] < fitted.threshold
    assert fitted.probe.shape == (9,) and filled_pos[:, _LEANING].std() > 0
    # the wording leaning, cross-fitted like the vector's: above 0 leans unanswerable, in both languages
    assert filled_neg[:, _WORDING].min() > 0 > filled_pos[:, _WORDING].max()
    assert fitted.wording.logit("When will release 7 come out?") > 0 > fitted.wording.logit("How do I fix error 7 in my run?")
    report = cross_validate(pos, neg, pos_v, neg_v, ids[:120], ids[120:], texts[:120], texts[120:], kept=60, alphas=(0.05,))
    assert report["0.05"]["abstention"] >= 0.95 and report["0.05"]["false_abstention"] <= 0.1


def test_a_question_group_gets_its_own_threshold(tmp_path: Path) -> None:
    """Terse answerable questions that score lower than the long ones get a threshold from their own scores
    (Mondrian conformal), so they are not refused wholesale; the long ones keep theirs; the model stores it."""
    from app.linear_model import LinearModel, load_linear_model
    from app.query import TERSE
    from eval.abstention_training import MIN_GROUP, fit_decision

    rng = np.random.default_rng(1)
    width = len(COVERAGE_FEATURES)
    n_long, n_terse, n_neg = 100, MIN_GROUP + 10, 100
    pos = rng.normal(0.0, 1.0, (n_long + n_terse, width))
    pos[:n_long, 0] += 3.0
    pos[n_long:, 0] += 0.5  # terse: answerable, but lower on the signal
    neg = rng.normal(0.0, 1.0, (n_neg, width))
    neg[:, 0] -= 3.0
    vectors = rng.normal(0.0, 1.0, (n_long + n_terse + n_neg, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    texts = ([f"How do I set up stage {i} offload for my model on eight GPUs?" for i in range(n_long)]
             + [f"offload {i}?" for i in range(n_terse)] + [f"When will release {i} come out, and what do you expect?" for i in range(n_neg)])
    ids = [f"q{i}" for i in range(len(texts))]
    fitted, _, _ = fit_decision(pos, neg, vectors[:n_long + n_terse], vectors[n_long + n_terse:], ids, texts, alpha=0.05)
    assert set(fitted.group_thresholds) == {TERSE} and fitted.group_thresholds[TERSE] < fitted.threshold
    terse_pos = fitted.refused(pos[n_long:], vectors[n_long:n_long + n_terse], texts[n_long:n_long + n_terse])
    assert terse_pos.mean() <= 0.1
    model = LinearModel(COVERAGE_FEATURES, fitted.mean, fitted.scale, fitted.weights, fitted.bias,
                        threshold=fitted.threshold, group_thresholds=fitted.group_thresholds)
    model.save(tmp_path / "m.json")
    back = load_linear_model(tmp_path / "m.json", COVERAGE_FEATURES)
    assert back is not None and back.threshold_for(TERSE) == pytest.approx(fitted.group_thresholds[TERSE], abs=1e-5)
    assert back.threshold_for("") == back.threshold_for("another group") == pytest.approx(fitted.threshold, abs=1e-5)


def test_refusal_memory_resemblance_and_round_trip(tmp_path: Path) -> None:
    """Only a cosine over the floor counts; the leaning is the probe's logit; the memory is stored (vectors
    as float16) and read back; a damaged file or a probe that does not fit the vectors is an error that
    says to retrain."""
    from app.refusal_memory import REFUSAL_FLOOR, RefusalMemory, load_refusal_memory

    remembered = np.eye(4, dtype=np.float32)[:2]
    memory = RefusalMemory(remembered, "enc", "test")
    close = np.array([0.9, 0.0, 0.0, np.sqrt(1 - 0.81)], dtype=np.float32)
    assert memory.resemblance(close) == pytest.approx(0.9 - REFUSAL_FLOOR, abs=1e-6)
    assert memory.resemblance(np.array([0.0, 0.0, 1.0, 0.0], dtype=np.float32)) == 0.0  # nothing alike: under the floor
    loaded = load_refusal_memory(memory.save(tmp_path / "r.npz"))
    assert loaded is not None and loaded.encoder == "enc" and np.allclose(loaded.vectors, remembered, atol=1e-3)
    assert loaded.probe is None and loaded.leaning(close) is None  # a memory trained before the probe
    probed = RefusalMemory(remembered, "enc", "test", probe=np.array([2.0, 0.0, 0.0, -1.0, 0.5]))
    assert probed.leaning(close) == pytest.approx(2.0 * 0.9 - np.sqrt(1 - 0.81) + 0.5, abs=1e-6)
    back = load_refusal_memory(probed.save(tmp_path / "p.npz"))
    assert back is not None and back.leaning(close) == pytest.approx(probed.leaning(close), abs=1e-5)
    assert load_refusal_memory(tmp_path / "missing.npz") is None
    np.savez(tmp_path / "bad.npz", vectors=np.ones(3), encoder=np.array("x"), trained_on=np.array(""))
    with pytest.raises(ValueError, match="retrain"):
        load_refusal_memory(tmp_path / "bad.npz")
    np.savez(tmp_path / "short.npz", vectors=remembered, encoder=np.array("x"), trained_on=np.array(""), probe=np.ones(3))
    with pytest.raises(ValueError, match="retrain"):
        load_refusal_memory(tmp_path / "short.npz")


def test_wording_probe_reads_the_ask_as_its_training_did(tmp_path: Path) -> None:
    """The query-time probe gives the trained model's logit (scikit-learn's char_wb n-grams and sublinear
    TF-IDF, re-done in numpy), reads only the ask without the settings written out, and is stored in the
    refusal memory's file; a probe whose arrays disagree is an error that says to retrain."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from app.char_tfidf import char_ngrams
    from app.refusal_memory import RefusalMemory, load_refusal_memory
    from app.wording_probe import wording
    from eval.abstention_training import fit_wording

    for text in ["Hi a  ZeRO-3 显存不够?", "x", "overlap_comm, then?"]:
        assert char_ngrams(text) == TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4)).build_analyzer()(text)
    assert wording('We run 8 nodes with "stage": 3 and --num_gpus 8. When is {"x": true} planned?') .split() == ["When", "is", "planned?"]
    questions = ["How do I fix error {} in my ZeRO run?", "When will release {} come out?", "你们用 {} 的经验如何？", "怎么配置 {} 卸载？"]
    texts = [questions[i % 4].format(i) for i in range(80)]
    labels = np.array([i % 4 in (1, 2) for i in range(80)], dtype=np.int64)
    probe = fit_wording(texts, labels)
    tfidf = TfidfVectorizer(analyzer=char_ngrams, min_df=2, sublinear_tf=True)
    from sklearn.linear_model import LogisticRegression

    x = tfidf.fit_transform([wording(t) for t in texts])
    reference = LogisticRegression(C=1.0, class_weight="balanced", max_iter=5000).fit(x, labels).decision_function(x)
    assert np.allclose([probe.logit(t) for t in texts], reference, atol=1e-9)
    assert probe.logit("qqqq") == probe.bias  # no n-gram it knows
    saved = load_refusal_memory(RefusalMemory(np.eye(4, dtype=np.float32)[:2], "enc", "test", wording=probe).save(tmp_path / "w.npz"))
    assert saved is not None and saved.wording_leaning(texts[1]) == pytest.approx(probe.logit(texts[1]), abs=1e-4)
    assert RefusalMemory(np.eye(4, dtype=np.float32)[:2], "enc").wording_leaning(texts[1]) is None
    with np.load(tmp_path / "w.npz") as data:
        arrays = {k: data[k] for k in data.files}
    np.savez(tmp_path / "bad.npz", **{**arrays, "wording_idf": arrays["wording_idf"][:3]})
    with pytest.raises(ValueError, match="retrain"):
        load_refusal_memory(tmp_path / "bad.npz")


def test_coverage_signals() -> None:
    chunks = [Chunk(id=f"c{i}", text=t, path="p", url="u", title="T", heading="H", trail=("T",), source="docs")
              for i, t in enumerate(["Set overlap_comm to overlap reduction.", "Pipeline stages."])]
    terms = [chunk_terms(c) for c in chunks]
    q = QuerySignals(np.array([3.0, 1.0]), np.array([3.0, 1.0]), np.array([0.6, 0.2]),
                     frozenset(tokenize("overlap reduction")), frozenset({"overlap_comm", "made_up_key"}), False)
    row = coverage_features(q, q.cos, [0, 1], 2.5, terms, [c.text for c in chunks])
    named = dict(zip(COVERAGE_FEATURES, row, strict=True))
    assert len(row) == len(COVERAGE_FEATURES) and named["ident_found"] == 0.5 and named["top_cover"] == 1.0
    assert named["top_bm25"] == 3.0 and named["top_score"] == 2.5 and named["idents"] == 2
    assert named["ask_unknown"] == 0.0 and named["ds_unknown"] == 0.0  # nothing said to be unknown
    unknown = QuerySignals(q.bm25, q.bm25_ask, q.cos, q.ask_terms, frozenset({"overlap_comm", "deepspeed.made_up"}), False,
                           ask_identifiers=frozenset({"overlap_comm", "deepspeed.made_up"}),
                           unknown_identifiers=frozenset({"deepspeed.made_up"}), unknowable=True)
    named = dict(zip(COVERAGE_FEATURES, coverage_features(unknown, q.cos, [0, 1], 2.5, terms, [c.text for c in chunks]), strict=True))
    assert named["ask_unknown"] == 0.5 and named["ds_unknown"] == 1.0 and named["unknowable"] == 1.0


def test_learned_models_apply_only_to_their_encoder() -> None:
    settings = Settings()
    shipped = retrieval_options(settings, "all-MiniLM-L6-v2")
    assert shipped.ranker is not None and shipped.abstention is not None
    other = retrieval_options(settings, "hash-64")
    assert other.ranker is None and other.abstention is None
    assert retrieval_options(settings.model_copy(update={"learned_ranking": False}), "all-MiniLM-L6-v2").abstention is None


def test_text_units_are_whole() -> None:
    text = (
        "ZeRO-3 will automatically collect and partition the model parameters as they\n"
        "are needed during the forward and backward passes. It needs e.g. more memory.\n\n"
        "```python\nmodel = deepspeed.initialize(model=net)\n```\n\n"
        "after calling deepspeed.init_inference, call\n\n"
        "- the first item wraps\n  over two lines\n- `overlap_comm` overlaps the gradient reduction\n\n"
        "`wandb` (type dict; default {}). Sets parameters for WandB monitor.\n"
        "Reference: Fields; Value; Default\n"
        "group; Name for the WandB group. This can be used to group together runs.; `None`\n\n"
        "train_batch_size: [integer]\n\nValue; Example\nThe effective training batch size.; `32`\n\n"
        "API `deepspeed.comm.all_gather` in deepspeed 0.19.8. Signature: `f(a=<function g at 0x7f00>)`\n\n"
        "The example below shows how:\n\nFigure 2: throughput of the thing we measured here."
    )
    units = [u.text for u in text_units(text)]
    assert units[0] == "ZeRO-3 will automatically collect and partition the model parameters as they are needed during the forward and backward passes."
    assert units[1] == "It needs e.g. more memory."  # no split after an abbreviation
    assert "The first item wraps over two lines." in units and "`overlap_comm` overlaps the gradient reduction." in units
    assert "`wandb.group`: Name for the WandB group. This can be used to group together runs (default `None`)." in units
    assert "`train_batch_size`: The effective training batch size (for example `32`)." in units  # an Example column, no default
    joined = " ".join(units)
    for gone in ("deepspeed.initialize(", "init_inference, call", "0x7f", "Figure 2", "example below"):
        assert gone not in joined, gone
    assert all(not is_cut(u) for u in units)
    per_chunk, offsets = unit_table([Chunk(id="a", text=text, path="p", url="u", title="T", heading="H", trail=(), source="docs")])
    assert [u.text for u in per_chunk[0]] == units and offsets.tolist() == [0, len(units)]


def test_the_docs_entry_under_a_catalogue_key_is_a_unit_of_its_own() -> None:
    """`cpu_offload`'s docs entry opens with a line of prose, not its table: the catalogue passage's "Reference:"
    label and that line were read as the end of the package's sentence above them ("Deprecated, please use
    ``offload_optimizer`` Reference: Deprecated: ..."); reST literals read as Markdown's in units and key descriptions."""
    from indexer.config_catalogue import ConfigKey
    from indexer.package_source import describe_key, key_descriptions

    key = ConfigKey("zero_optimization.cpu_offload", "bool | None", "None", "Deprecated, please use ``offload_optimizer``",
                    deprecated="offload_optimizer")
    prose = {"cpu_offload": "Deprecated: cpu_offload is deprecated, please use `offload_optimizer` instead.\n"
                            "Description; Default\nEnable offloading of optimizer memory to CPU.; `False`"}
    text = describe_key(key, prose)
    units = [u.text for u in text_units(text)]
    assert not any("Reference" in u for u in units)
    assert "Deprecated: cpu_offload is deprecated, please use `offload_optimizer` instead." in units
    assert "`zero_optimization.cpu_offload`: Enable offloading of optimizer memory to CPU (default `False`)." in units
    assert "``" not in " ".join(units)
    described = key_descriptions(text)["zero_optimization.cpu_offload"]
    assert "``" not in described and "`offload_optimizer`" in described


def test_a_known_cause_of_our_notes_is_quoted_field_by_field() -> None:
    """Every section of the known-errors note gave one unit "Matches: `...` | `...` Why: ...": the doctor's match
    texts read as the start of the why. Why, check and fix are a unit each; the match texts and flags none."""
    from corpus import NOTES_DIR

    section = (NOTES_DIR / "known-errors.md").read_text(encoding="utf-8").split("\n## A hostfile line does not parse\n", 1)[1]
    units = [u.text for u in text_units(section.split("\n## ", 1)[0])]
    assert units[0].startswith("Every hostfile line must read `<hostname> slots=")
    assert [u.split(":")[0] for u in units[-2:]] == ["Check", "Fix"] and len(units) == 3
    assert not any("Matches" in u or "Hostfile contains a bad entry" in u for u in units)
    from indexer.known_causes import opens_a_cause

    assert opens_a_cause(section) and not opens_a_cause("Matches the texts below.\nFix: a docs page's own line.")


def test_a_markdown_hard_break_is_no_part_of_the_sentence() -> None:
    """A line ending in a lone backslash (Markdown's hard break) once kept it: "Install DeepSpeed \\ `pip install
    deepspeed`". A line that starts anew after it reads as what the line before introduced; a lower-case one
    goes on with the sentence; a backslash inside a line (LaTeX) stays."""
    text = ("Install DeepSpeed \\\n`pip install deepspeed`\n\n"
            "Install PyTorch with XPU support \\\nInstall the XPU variant from the PyTorch repository.\n\n"
            "Throughput for step 3 of the pipeline (the most time \\\nconsuming portion) on one node.\n\n"
            "The chunks are written where $\\ i\\ \\in \\ 0,1$ as the figure shows for them.")
    units = [u.text for u in text_units(text)]
    assert units[:3] == ["Install DeepSpeed: `pip install deepspeed`",
                         "Install PyTorch with XPU support: Install the XPU variant from the PyTorch repository.",
                         "Throughput for step 3 of the pipeline (the most time consuming portion) on one node."]
    assert "\\ i\\" in units[3]


def test_text_units_keep_what_a_reader_needs() -> None:
    text = (
        "DeepSpeed supports CPU with Intel Architecture instruction set.\n\n"
        "`gradient_predivide_factor` (type float; default 1.0).\n"
        "Reference: Description; Default\n"
        "Before mean allreduce, predivide gradients by a factor; this can help fp16 stability at scale; `1.0`\n\n"
        "*pin_memory*: [boolean]\n\nDescription; Default\n"
        'Offload to pinned memory; set to `false` when memlock is tight; `true`\n\n'
        "bf16:bf16_optimizer_states: [boolean]\n\nDescription; Default\n"
        'Select `"mean"` or `"sum"` here; `"sum"` needs stage 0, 1 or 2; `false`\n\n'
        "torch_autocast: [dictionary]\n\nParameter; Type; Default; Description\n"
        "enabled; boolean; `false`; Enable autocast without a manual call.\n\n"
        "ZeRO stage; with offload; without offload\n1/2/3; yes; no\n\n"
        "So you can call forward, backward and step on every micro-batch:\n\n"
        "```python\nengine.backward(loss)\nengine.step()\n```\n\n"
        "The example below shows how to do it:\n\n"
        "If you already have a distributed environment set up, you'd need to replace:\n\n"
        "when running deepspeed, the extensions weren't built for the card you use it for.\n\n"
        "More is in the guide at [14].\n"
    )
    units = [u.text for u in text_units(text)]
    assert "DeepSpeed supports CPU with Intel Architecture instruction set." in units
    assert ("`gradient_predivide_factor`: Before mean allreduce, predivide gradients by a factor; "
            "this can help fp16 stability at scale (default `1.0`).") in units  # a description's own semicolon
    assert "`pin_memory`: Offload to pinned memory; set to `false` when memlock is tight (default `true`)." in units
    assert '`bf16.bf16_optimizer_states`: Select `"mean"` or `"sum"` here; `"sum"` needs stage 0, 1 or 2 (default `false`).' in units
    assert "`torch_autocast.enabled`: Enable autocast without a manual call (default `false`)." in units
    assert "So you can call forward, backward and step on every micro-batch." in units  # a statement before its code
    assert "When running deepspeed, the extensions weren't built for the card you use it for." in units
    joined = " ".join(units)
    for gone in ("ZeRO stage", "1/2/3", "example below", "replace", "guide at"):
        assert gone not in joined, gone
    assert all(not is_cut(u) for u in units)


def test_a_lead_in_to_code_or_a_list_is_no_statement() -> None:
    """Quoted without what follows its colon, these read as whole sentences and say nothing ("If you just
    want the `state_dict`, you can do." stood in an answer); a statement before its code still counts."""
    text = ("If you just want the `state_dict`, you can do:\n\n```python\nsd = engine.module.state_dict()\nsave(sd)\n```\n\n"
            "The forward pass of a pipeline parallel model implicitly takes the form:\n\n```python\nx = f(x)\ny = g(x)\n```\n\n"
            "When not using a DeepSpeed's learning rate scheduler:\n\n- step it yourself after each optimizer step\n\n"
            "So you can call forward, backward and step on every micro-batch:\n\n```python\nengine.backward(loss)\nengine.step()\n```\n")
    joined = " ".join(u.text for u in text_units(text))
    for gone in ("you can do", "takes the form", "When not using"):
        assert gone not in joined, gone
    assert "So you can call forward, backward and step on every micro-batch." in joined
    assert "engine.step" not in joined  # a block of code is never a unit
    assert "Step it yourself after each optimizer step." in joined
    # "... as follows." points at code as the colon does: the statement before it stays, a bare copula goes
    after = [u.text for u in text_units("The update rules are as follows.\n\n```python\nm = b1 * m\n```\n\n"
                                        "The param groups are then fed to the ZeRO stage-2 optimizer as follows.\n\n```python\nopt(groups)\n```\n")]
    assert after == ["The param groups are then fed to the ZeRO stage-2 optimizer."]
    pointer = [u.text for u in text_units("You can install DeepSpeed in JIT mode via pip (see below). The memory saved is smaller (see NOTE below for details).")]
    assert pointer == ["You can install DeepSpeed in JIT mode via pip.", "The memory saved is smaller."]


def test_a_one_line_command_after_a_colon_reads_with_the_sentence_that_says_to_run_it() -> None:
    """"..., use the following environment variable:" was cut (it points at what it lacks) and the variable with it:
    a fence of one short line right after the colon is that sentence's inline code. A longer block, a block after a
    sentence that closes, and a fence that is not right after the colon stay code."""
    text = ("If you want to skip this check, use the following environment variable,\nbut beware:\n\n"
            "```bash\nDS_SKIP_CUDA_CHECK=1\n```\n\n"
            "To build every op at install time, set the variable, for example:\n\n```\n  DS_BUILD_OPS=1 pip install deepspeed  \n```\n\n"
            "Save the trained weights to disk from every rank at the end of training:\n\n```python\nsd = engine.module.state_dict()\nsave(sd)\n```\n\n"
            "The engine wraps the model.\n\n```python\nengine.step()\n```\n\n"
            f"Run this long command:\n\n```\n{'x' * 101}\n```\n")
    units = [u.text for u in text_units(text)]
    assert units[:2] == ["If you want to skip this check, use the following environment variable, but beware: `DS_SKIP_CUDA_CHECK=1`",
                         "To build every op at install time, set the variable, for example: `DS_BUILD_OPS=1 pip install deepspeed`"]
    assert units[2:] == ["Save the trained weights to disk from every rank at the end of training.", "The engine wraps the model."]
    assert all(not is_cut(u) for u in units)


def test_a_row_drops_its_sentence_about_an_example_it_does_not_hold() -> None:
    text = ("*bf16*: [dictionary]\n\nDescription; Default\n"
            "Configuration for bfloat16 training. An example, including the available dictionary keys is illustrated below. "
            "Training with bfloat16 does not require loss scaling.; None\n")
    assert [u.text for u in text_units(text)] == [
        "`bf16`: Configuration for bfloat16 training. Training with bfloat16 does not require loss scaling (default None)."]


def test_a_table_row_keeps_the_key_above_it_when_a_block_names_several() -> None:
    """A catalogue reference that ran into the next entry gave both rows the last key of the block: the
    `reduce_scatter` row read "`reduce_bucket_size`: Uses reduce or reduce scatter ...". Each row is keyed
    by the key line above it, as it is read."""
    text = (
        "`zero_optimization.reduce_scatter` (type bool; default True). Uses reduce scatter to average gradients\n"
        "Reference: Description; Default\n"
        "Uses reduce or reduce scatter instead of allreduce to average gradients; `true`\n"
        "*reduce_bucket_size*: [integer]\n"
        "Description; Default\n"
        "Number of elements reduced/allreduced at a time; `5e8`\n"
    )
    units = [u.text for u in text_units(text)]
    assert "`zero_optimization.reduce_scatter`: Uses reduce or reduce scatter instead of allreduce to average gradients (default `true`)." in units
    assert "`reduce_bucket_size`: Number of elements reduced/allreduced at a time (default `5e8`)." in units
    assert not any(u.startswith("`reduce_bucket_size`: Uses reduce") for u in units)


def test_a_table_row_keeps_the_key_line_that_ended_the_chunk_before() -> None:
    """The chunker's word budget cut 15 keys of config-json.md from their tables: one chunk ended on
    "managed_gradient_accumulation: [boolean]" and the next began with its table, whose row was quoted
    without a name. The next chunk of the same page goes on with that key; another page's does not."""
    def chunk(text: str, path: str = "docs/_pages/config-json.md") -> Chunk:
        return Chunk(id=str(hash(text)), text=text, path=path, url="u", title="t", heading="h", trail=("t",), source="docs")

    row = "Description; Default\nControls how gradient accumulation boundaries are managed.; `true`"
    before = chunk("Number of training steps to accumulate gradients.; `1`\n\nmanaged_gradient_accumulation: [boolean]")
    per_chunk, offsets = unit_table([before, chunk(row), chunk(row, path="other.md")])
    assert [u.text for u in per_chunk[1]] == ["`managed_gradient_accumulation`: Controls how gradient accumulation boundaries are managed (default `true`)."]
    assert [u.text for u in per_chunk[2]] == ["Controls how gradient accumulation boundaries are managed (default `true`)."]
    assert list(offsets) == [0, len(per_chunk[0]), len(per_chunk[0]) + 1, len(per_chunk[0]) + 2]


def test_a_docstring_argument_keeps_its_name_and_default() -> None:
    """An argument list's lines were joined as prose, so each "Defaults to x." opened the next argument's
    sentence ("Defaults to 1234. partition_method (str, optional): ...") and left its own name behind."""
    text = ("Args:\n    base_seed (int, optional): The starting seed. Defaults to 1234.\n"
            "    partition_method (str, optional): The method upon which the layers are partitioned. Defaults to 'parameters'.\n"
            "    checkpointable_layers (list[str], optional): Layer class names that may be checkpointed. For GPT models,\n"
            "        one layer is always checkpointed. Defaults to None.\n"
            "    dynamic_shape: Allows dynamic shapes of inputs.\n"
            "    warmup_type {'log', 'linear'}: increasing function during warmup. Default: log\n")
    assert [u.text for u in text_units(text)] == [
        "`base_seed` (int, optional): The starting seed. Defaults to 1234.",
        "`partition_method` (str, optional): The method upon which the layers are partitioned. Defaults to 'parameters'.",
        "`checkpointable_layers` (list[str], optional): Layer class names that may be checkpointed. For GPT models, one layer is "
        "always checkpointed. Defaults to None.",
        "`dynamic_shape`: Allows dynamic shapes of inputs.",
        "`warmup_type` {'log', 'linear'}: increasing function during warmup. Default: log.",
    ]
    # arguments a blank line apart (`deepspeed.initialize` writes them so) stay arguments: "config: Optional: ..." was
    # read as prose ("Config: Optional: Instead of ...") once the list's first paragraph ended; the list ends at prose
    spaced = ("Arguments:\n    args: an object with local_rank.\n        Optional if `config` is passed.\n\n"
              "config: Optional: a path or a dictionary\n\nmodel: Required: the module to wrap\n\n"
              "Initialize the engine before training.\n\nnote: a lower-case line after prose is prose again\n")
    assert [u.text for u in text_units(spaced)] == [
        "`args`: an object with local_rank. Optional if `config` is passed.", "`config`: Optional: a path or a dictionary.",
        "`model`: Required: the module to wrap.", "Initialize the engine before training.", "Note: a lower-case line after prose is prose again."]
    # an argument's unit gives its name and the rest, the way the API answers tell it with the call
    assert argument_unit("`tag` (str, optional): Checkpoint tag.") == ("tag", " (str, optional): Checkpoint tag.")
    assert argument_unit("`config`: Optional: a path or a dictionary.") == ("config", ": Optional: a path or a dictionary.")
    assert argument_unit("Note: the `zero.Init` context partitions parameters.") is None
    # a caption is no answer: what a figure or table beside it shows
    assert text_units("Upper figure is vanilla TP, bottom is Domino.\n\nTable 2: Training throughput on 128 GPUs.") == []
    # nor an attribute field list (torch's nn.Module documents `training` so)
    assert text_units(":ivar training: Boolean represents whether this module is in training or evaluation mode. :vartype training: bool.") == []
    # "name: what" outside an argument list is prose as before, and reST's ``literal`` reads as `code`
    assert [u.text for u in text_units("Note: the ``zero.Init`` context partitions parameters at construction.")] == [
        "Note: the `zero.Init` context partitions parameters at construction."]


def test_a_matrix_row_is_read_through_its_header_and_its_title_is_no_answer() -> None:
    """A support matrix's row was quoted bare ("1/2/3; Requires ZeRO-Offload ...; On GPU ...") and the bold line
    naming the table ("Support matrix (...)") was read on after the sentence above it."""
    text = ("Keeps the optimizer states in bf16.\n\nSupport matrix (bf16 master weights/gradients)\n\n"
            "ZeRO stage; bf16_optimizer_states=False; bf16_optimizer_states=True\n0; Not supported; Not supported\n"
            "1/2/3; Requires ZeRO-Offload + `DeepSpeedCPUAdam`; On GPU without offload, or on CPU; kept in bf16 either way\n")
    assert [u.text for u in text_units(text)] == [
        "Keeps the optimizer states in bf16.",
        "ZeRO stage 1/2/3 — bf16_optimizer_states=False: Requires ZeRO-Offload + `DeepSpeedCPUAdam`; "
        "bf16_optimizer_states=True: On GPU without offload, or on CPU; kept in bf16 either way.",
    ]
    # a matrix row whose last cells are empty is read through the header too, never as a row of the key table above
    # it: "`fp16.fp16_master_weights_and_grads`: 0 (default Not supported)." was quoted for the matrix's "0; Not supported"
    under_key = ("fp16:fp16_master_weights_and_grads: [boolean]\n\nDescription; Default\nKeep master weights in fp16.; `false`\n\n"
                 "Support matrix (fp16 master weights/gradients)\n\nZeRO stage; Offload required?; Notes\n0; Not supported\n"
                 "1/2/3; Yes (`offload_optimizer` with `DeepSpeedCPUAdam`); Optimizer states stay fp32 on CPU.\nA sentence after it.\n")
    assert [u.text for u in text_units(under_key)] == [
        "`fp16.fp16_master_weights_and_grads`: Keep master weights in fp16 (default `false`).",
        "ZeRO stage 0 — Offload required?: Not supported.",
        "ZeRO stage 1/2/3 — Offload required?: Yes (`offload_optimizer` with `DeepSpeedCPUAdam`); Notes: Optimizer states stay fp32 on CPU.",
        "A sentence after it."]  # prose after the matrix is prose
    # a table's last column that is no default says what it is; a sentence with a semicolon under a "Description;
    # Default" header is prose ("... slower (default subsequent generations replay them.)." was quoted)
    assert [u.text for u in text_units("Parameter; Values\nZeRO Stage; 2, 3\nLoRA; True, False\n")] == [
        "ZeRO Stage (values: 2, 3).", "LoRA (values: True, False)."]
    graphs = ("enable_cuda_graph; Capture decode graphs.; `false`\n* `inference_tp_size` greater than 1\n"
              "The first generation is therefore slower; subsequent generations replay them.\n")
    assert [u.text for u in text_units("Reference: Description; Default\n" + graphs)][-2:] == [
        "`inference_tp_size` greater than 1.", "The first generation is therefore slower; subsequent generations replay them."]
    # a row whose value is only badges (links with no text) says nothing: "Intel XPU (status: [](https://...))." was a unit
    assert text_units("Description; Status\nIntel XPU; [](https://github.com/x/y/actions/workflows/xpu.yml)\n") == []
    # a table of figures stays out, and a key's row under a three-column header is still the key's row
    assert text_units("Model; GPUs; Time\nGPT-2; 16; 33 hr\n") == []
    assert [u.text for u in text_units('"params" key; Description; Default\nfreeze_step; Warm-up steps before compression; 100000\n')] == [
        "`freeze_step`: Warm-up steps before compression (default 100000)."]


def test_composed_answer_leads_with_the_best_unit_and_reads_on() -> None:
    first = Source(1, "ZeRO", "Memory", "Stage 3 partitions the parameters across ranks. It needs at least 4 GPUs because the states are split four ways.\n\nUnrelated closing words about logging here.")
    second = Source(2, "Offload", "CPU", "Offloading the optimizer to CPU memory saves GPU memory for stage 3.")
    answer = extractive_answer("how does stage 3 partition the parameters", [first, second])
    segs = segments(answer)
    assert segs[0].startswith("Stage 3 partitions the parameters across ranks. It needs at least 4 GPUs")  # the lead reads on
    assert answer.count("[1]") == 1 and "logging" not in answer.split("[1]")[0]
    assert answer_words(answer) <= 120 and not any(is_cut(s) for s in segs)
    assert extractive_answer("anything", []) == NOT_COVERED
    sims = np.array([0.0, 0.0, 0.0, 0.9])  # the encoder prefers the second source's unit
    assert extractive_answer("how does stage 3 partition the parameters", [first, second], sims).startswith("Offloading the optimizer")


def test_a_lead_that_points_back_reads_after_the_sentence_it_points_to() -> None:
    """A best unit opening with "However," or "This" follows the unit before it in the same block."""
    text = ("The deepspeed launcher reads the hostfile to find the nodes. However, with --no_ssh it launches "
            "only the local node and each node runs the command itself.\n\nUnrelated words about logging here.")
    sims = np.array([0.1, 0.9, 0.0])  # the encoder prefers the "However" sentence
    lead = segments(extractive_answer("how does no_ssh launch nodes", [Source(1, "Launcher", "Hosts", text)], sims))[0]
    assert lead.startswith("The deepspeed launcher reads the hostfile to find the nodes. However, with --no_ssh")
    alone = "However, with --no_ssh it launches only the local node.\n\nThe hostfile lists the nodes."  # first of its block
    assert segments(extractive_answer("how does no_ssh launch nodes", [Source(1, "Launcher", "Hosts", alone)], np.array([0.9, 0.1])))[0].startswith("However")


def _lead(question: str, section: str, text: str) -> str:
    """The first segment of the answer from one config passage."""
    return segments(extractive_answer(question, [Source(1, f"DeepSpeed config: {section}", section, text)]))[0]


def test_the_lead_does_not_read_on_into_the_same_words_again() -> None:
    """A catalogue entry states a key in the package's words and again in the docs' row: the lead once
    quoted both ("`fp16.hysteresis` (int, default 2): Delay shift in dynamic loss scaling. `fp16.hysteresis`:
    hysteresis is a fp16 parameter representing the delay shift in dynamic loss scaling (default `2`)"). The
    package's words are inside the docs' row here, so the row, which says more, stands in for them."""
    lead = _lead("what is the delay shift of dynamic loss scaling fp16 hysteresis", "fp16",
                 "`fp16.hysteresis` (type int; default 2). Delay shift in dynamic loss scaling.\n"
                 "Reference: Description; Default\n"
                 "Hysteresis is the delay shift in dynamic loss scaling; `2`\n"
                 "It counts the overflows seen before the scale is lowered.")
    assert lead.startswith("`fp16.hysteresis`: Hysteresis is the delay shift in dynamic loss scaling (default `2`).")
    assert lead.count("elay shift") == 1  # said once
    assert "It counts the overflows" in lead  # what only the next unit says is still read on
    # the package's text in two sentences and the docs' row saying both again: the row is left out too
    said = "The maximum number of parameters resident per GPU before releasing. Smaller values use less memory, but perform more communication."
    lead = _lead("what does stage3_max_live_parameters mean", "zero_optimization",
                 f"`zero_optimization.stage3_max_live_parameters` (type int; default 1,000,000,000). {said}\n"
                 f"Reference: Description; Default\n{said}; `1e9`")
    assert lead.count("resident per GPU") == 1 and "Smaller values use less memory" in lead


def test_a_lead_about_a_sibling_option_loses_to_one_that_matches() -> None:
    assert about_other_option("does bf16 need loss scaling?", "FP16 training uses dynamic loss scaling.")
    assert not about_other_option("does bf16 need loss scaling?", "bf16 needs no loss scaling, unlike fp16.")
    assert about_other_option("offload to NVMe in ZeRO-3", "Stage 2 supports CPU offload.")
    assert not about_other_option("fp16 or bf16 for training?", "fp16 uses loss scaling.")  # both asked: no guard
    fp16 = Source(1, "Mixed precision", "FP16", "FP16 training keeps a dynamic loss scale to avoid gradient underflow in half precision.")
    bf16 = Source(2, "Mixed precision", "BF16", "Training with bfloat16 keeps full range, so no scaling of the loss is required.")
    sims = np.array([0.6, 0.5])  # the encoder alone would lead with the fp16 sentence
    answer = extractive_answer("does bf16 training need loss scaling", [fp16, bf16], sims)
    assert answer.startswith("Training with bfloat16") and "FP16 training" not in answer.split("[2]")[0]


def test_config_line_names_the_keys_with_type_and_default() -> None:
    facts = {"zero_optimization": ("dict", "{}"), "zero_optimization.stage": ("ZeroStageEnum", "0"),
             "zero_optimization.offload_optimizer.device": ("OffloadDeviceEnum", "'none'"),
             "zero_optimization.offload_param.device": ("OffloadDeviceEnum", "'none'"),
             "zero_optimization.offload_optimizer.pin_memory": ("bool", "False"),
             "gradient_accumulation_steps": ("int", "1")}
    assert keys_named("set offload_optimizer.device and gradient_accumulation_steps", facts) == [
        "zero_optimization.offload_optimizer.device", "gradient_accumulation_steps"]
    assert keys_named("what is zero_optimization and device", facts) == []  # a section and an ambiguous leaf
    line = config_line("how to pin memory with pin_memory", "Use `zero_optimization.stage` 3 [1]", facts)
    assert line == "Config: `zero_optimization.offload_optimizer.pin_memory` (bool, default False); `zero_optimization.stage` (ZeroStageEnum, default 0)."
    assert config_line("q", "`gradient_accumulation_steps` (int, default 1): steps [1]", facts) == ""  # already quoted
    # a key only the answer names is left out when the answer quotes its row, default and all; one the
    # question names always leads (the line a reader of a key question looks for)
    row = "`zero_optimization.offload_optimizer.pin_memory`: Pin the host memory (default `false`). [1]"
    assert config_line("how do I offload", row, facts) == ""
    assert config_line("what does pin_memory do", row, facts).startswith("Config: `zero_optimization.offload_optimizer.pin_memory`")
    # a bare leaf whose key's sections neither the question nor the answer names is another thing's name
    tuned = {**facts, "autotuning.mp_size": ("int", "1")}
    assert config_line("init_inference with mp_size=2 runs a full copy per GPU", "Tensor slicing splits each layer. [1]", tuned) == ""
    assert config_line("autotuning over mp_size", "Autotuning tries each degree. [1]", tuned) == "Config: `autotuning.mp_size` (int, default 1)."
    # a key whose type the catalogue could not tell: its default alone ("(any, default None)" said nothing more)
    assert config_line("train_batch_size", "", {"train_batch_size": ("any", "None")}) == "Config: `train_batch_size` (default None)."


def test_a_bare_catalogue_entry_gives_way_to_the_row_that_says_what_the_key_does() -> None:
    """"`gradient_clipping` (float, default 1.0). `gradient_clipping`: Enable gradient clipping with value
    (default `1.0`)." said the key and its default twice: the bare entry's score goes to the fuller row."""
    text = ("`gradient_clipping` (type float; default 1.0).\n\n"
            "Reference: Description; Default\ngradient_clipping; Enable gradient clipping with value; `1.0`\n\n"
            "Clipping runs inside the engine step on every rank.")
    src = Source(1, "DeepSpeed config: gradient_clipping", "gradient_clipping", text)
    sims = np.array([0.9, 0.5, 0.1])  # the encoder prefers the bare entry
    answer = extractive_answer("gradient clipping default", [src], sims)
    assert answer.startswith("`gradient_clipping`: Enable gradient clipping with value (default `1.0`).")
    assert "(float, default 1.0)" not in answer and answer.count("default") == 1


def test_a_row_another_row_on_the_key_holds_word_for_word_gives_way_to_it() -> None:
    """The catalogue's first sentence on `offload_param` and the docs' whole row on it were both quoted, the first
    inside the second: the shorter one's score goes to the fuller row, which alone is quoted."""
    text = ("`offload_param` (type bool; default None). Enable offloading of model parameters to CPU or NVMe.\n\n"
            "Reference: Description; Default\noffload_param; Enable offloading of model parameters to CPU or NVMe. "
            "This frees up GPU memory for larger models. Valid only with stage 3.; `False`\n\n"
            "Offloading runs beside the optimizer step.")
    src = Source(1, "DeepSpeed config: offload_param", "offload_param", text)
    answer = extractive_answer("can I offload parameters with stage 2", [src], np.array([0.9, 0.5, 0.45]))
    assert answer.startswith("`offload_param`: Enable offloading of model parameters to CPU or NVMe. This frees up GPU memory")
    assert answer.count("Enable offloading") == 1 and "Offloading runs beside" in answer


def test_what_the_reply_says_above_the_units_no_unit_says_again() -> None:
    """A key question's reply opens with the catalogue's description of the key; the docs' row on it, in other
    quotes (``save()`` and `save()`, a curly apostrophe), was quoted below it as well."""
    head = "`a.gather`: Gathers the weights before ``save()``, since they aren\u2019t in the state dict."
    text = ("Reference: Description; Default\ngather; Gathers the weights before `save()`, since they aren't in the state dict.; "
            "`false`\n\nSaving then writes one file per rank.")
    src = Source(1, "DeepSpeed config: gather", "gather", text)
    cands, scores = scored_candidates("what does gather do", [src], np.array([0.9, 0.4]))
    assert restated(head.split(": ", 1)[-1], compose(cands, scores))
    after = compose(cands, scores, said_before=head)
    assert "Gathers the weights" not in after and after.startswith("Saving then writes one file per rank.")
    assert not restated("Gathers the weights before saving", after)


def test_key_facts_read_back_what_the_catalogue_writes() -> None:
    from indexer.config_catalogue import ConfigKey
    from indexer.package_source import describe_key, key_facts

    keys = [ConfigKey("a.b_c", "int", "4", "doc text", aliases=("b_c",)), ConfigKey("a.d", "bool", "False", "")]
    text = "\n\n".join(describe_key(k, {}) for k in keys)
    assert key_facts(text) == {"a.b_c": ("int", "4"), "a.d": ("bool", "False")}


def test_key_descriptions_take_the_package_word_else_the_docs_row() -> None:
    from indexer.config_catalogue import ConfigKey
    from indexer.package_source import describe_key, key_descriptions

    keys = [ConfigKey("a.b_c", "int", "4", "Packs the buckets."), ConfigKey("a.d", "bool", "False", ""),
            ConfigKey("a.e", "str", "x", "")]
    text = "\n\n".join(describe_key(k, {}) for k in keys)
    text = text.replace("`a.d` (type bool; default False).", "`a.d` (type bool; default False).\nReference: Description; Default\n"
                        "Turns on d; for stage 3 only; `false`")
    assert key_descriptions(text) == {"a.b_c": "Packs the buckets.", "a.d": "Turns on d; for stage 3 only"}  # a.e: neither
    assert key_line(["a.e", "a.d", "a.b_c"], key_descriptions(text)) == "`a.d`: Turns on d; for stage 3 only. `a.b_c`: Packs the buckets."
    assert key_line(["a.e"], key_descriptions(text)) == ""
    cited = [Source(1, "t", "h", "Nothing here."), Source(2, "t", "h", "`a.b_c` (int, default 4): Packs the buckets.")]
    assert key_line(["a.b_c"], key_descriptions(text), sources=cited) == "`a.b_c`: Packs the buckets. [2]"


def test_a_question_asking_what_a_key_is_quotes_nothing_about_other_keys() -> None:
    """"What does overlap_comm do?": the entries of other keys (tensor_parallel's tp_overlap_comm, reduce_bucket_size)
    and the sentences after them, and prose about something else, are not quoted; a sentence naming the key is,
    and so is the rest of its paragraph."""
    catalogue = ("`zero_optimization.overlap_comm` (bool, default None): Overlaps the reduction with backward.\n"
                 "`zero_optimization.reduce_bucket_size` (int, default 5e8): Elements reduced at a time. It limits the memory of the allgather.")
    other = "`tensor_parallel.tp_overlap_comm` (bool, default False): Whether to overlap communication. Only allreduce supports the overlap for now."
    docs = ("ZeRO overlap_comm works with stage 2 only. It trades memory for speed.\n\n"
            "ZeRO-3 partitions the whole model state across the data parallel ranks of the job.")
    sources = [Source(1, "c", "h", catalogue), Source(2, "t", "h", other), Source(3, "d", "h", docs)]
    cands, _ = scored_candidates("what does overlap_comm do", sources)
    assert [o for o in owners(cands)] == ["zero_optimization.overlap_comm", "zero_optimization.reduce_bucket_size",
                                          "zero_optimization.reduce_bucket_size", "tensor_parallel.tp_overlap_comm",
                                          "tensor_parallel.tp_overlap_comm", None, None, None]
    left_out = about_other_keys(cands, ["zero_optimization.overlap_comm"])
    kept = [c.unit.text for c, out in zip(cands, left_out, strict=True) if not out]
    assert kept == ["`zero_optimization.overlap_comm` (bool, default None): Overlaps the reduction with backward.",
                    "ZeRO overlap_comm works with stage 2 only.", "It trades memory for speed."]
    assert not about_other_keys(cands, []).any()


def test_version_note_only_on_a_cited_page_whose_failing_code_the_question_names() -> None:
    bad = Snippet(id="s", language="json", kind="ds_config", code="{}", chunk_id="c", source_url="u", path="docs/a.md",
                  status="fails", reason="/: deepspeed's own config parser rejects it: 'zero_optimization.mics_shard_size' is no longer supported",
                  checked_with="0.19.8")
    chunk = Chunk(id="c", text="t", path="docs/a.md", url="u", title="T", heading="H", trail=(), source="docs")
    hits = [Hit(chunk=chunk, score=1.0, bm25=1.0, dense=0.5)]
    note = version_notes({"docs/a.md": bad}, hits, "Use MiCS. [1]", "how do I set mics_shard_size?")
    assert note.strip().startswith("Heads-up") and "/:" not in note and note.rstrip().endswith("[1]") and not is_cut(segments(note)[0])
    assert version_notes({"docs/a.md": bad}, hits, "Use MiCS. [2]", "how do I set mics_shard_size?") == ""  # not cited
    assert version_notes({"docs/a.md": bad}, hits, "Use ZeRO. [1]", "how does ZeRO stage 3 work?") == ""  # not asked
    # the choices a reason lists are not what failed: a question about Adam gets no note about OneBitAdam
    onebit = Snippet(id="o", language="json", kind="ds_config", code="{}", chunk_id="c", source_url="u", path="docs/a.md", status="fails",
                     reason="optimizer type 'OneBitAdam' is neither one of deepspeed's optimizers ['adam', 'lamb'] nor a torch.optim class",
                     checked_with="0.19.8")
    other = Chunk(id="d", text="t", path="docs/b.md", url="u", title="T", heading="H", trail=(), source="docs")
    two = hits + [Hit(chunk=other, score=0.9, bm25=1.0, dense=0.5)]
    stale = {"docs/a.md": onebit, "docs/b.md": replace(onebit, id="p", path="docs/b.md")}
    assert version_notes(stale, two, "Adam. [1] Lamb. [2]", "how do I use adam with offload?") == ""
    # two pages failing for the same reason share one note
    note = version_notes(stale, two, "1-bit. [1] More. [2]", "How do I set OneBitAdam's freeze_step?").strip()
    assert note.count("Heads-up") == 1 and note.endswith("[1][2]") and "no longer work with" in note
    # the optimizer's class name as users write it: 'OneBitAdam' is "1-bit Adam"
    assert "Heads-up" in version_notes(stale, two, "1-bit. [1]", "How do I use 1-bit Adam and what does freeze_step mean?")


def test_chinese_answers_name_the_terms_they_matched() -> None:
    g = Glossary({"梯度累积": "gradient accumulation gradient_accumulation_steps", "显存": "gpu memory"})
    line = terms_line(g, "梯度累积和显存怎么设置？")
    assert line.startswith("术语：") and "梯度累积 → gradient accumulation gradient_accumulation_steps" in line
    assert "显存" not in line  # everyday two-character words give way to the technical terms
    assert terms_line(g, "显存不够怎么办？") == "术语：显存 → gpu memory\n"  # unless there are none
    assert terms_line(g, "没有术语") == ""
    assert terms_line(g, "梯度累积要不要配合梯度累积步数一起改？").count("梯度累积 →") == 1  # asked twice, named once
    asked = Glossary({"意思": "meaning", "作用": "purpose what does it do", "显存": "gpu memory"})
    assert terms_line(asked, "overlap_comm 是什么意思？") == ""  # words that only shape the ask are not terms
    assert terms_line(asked, "显存参数的作用") == "术语：显存 → gpu memory\n"
    # a question's phrasing (why, cannot get, model...) is expanded for the search but never shown as a term
    phrasing = Glossary({"为什么": "why", "拿不到": "cannot get cannot access", "模型": "model", "梯度裁剪": "gradient clipping gradient_clipping"})
    assert terms_line(phrasing, "为什么模型的梯度裁剪拿不到？") == "术语：梯度裁剪 → gradient clipping gradient_clipping\n"
    assert terms_line(phrasing, "为什么模型拿不到？") == ""


def test_a_catalogue_entry_is_told_without_the_type_and_default_the_config_line_gives() -> None:
    body = "`zero_optimization.overlap_comm` (bool | None, default None): Attempts to overlap. [1] `tensor_parallel.tp_overlap_comm` (bool, default False): Whether to overlap. [2]"
    out = without_type_and_default(body, "zero_optimization.overlap_comm")
    assert out.startswith("`zero_optimization.overlap_comm`: Attempts to overlap. [1]")
    assert "`tensor_parallel.tp_overlap_comm` (bool, default False):" in out  # another key's entry keeps its facts
    assert without_type_and_default("`a.b` (int, default f(0)): x", "a.b") == "`a.b` (int, default f(0)): x"  # nested: left as is
