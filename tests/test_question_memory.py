"""The question memory (`app/question_memory.py`) on a hand-made index: what it stores, how it is
resolved against chunks, what a new question's `seen` scores are, what an evaluation leaves out, and
that the retriever's ranker reads it (real FAISS and BM25, the hash embedder)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.answer import UNIT_FEATURES, Candidate, Source, unit_features
from app.linear_model import LinearModel
from app.question_memory import (
    LEXICAL_FLOOR,
    SEEN_FLOOR,
    UNIT_SEEN_FLOOR,
    ChunkMemory,
    QuestionMemory,
    chunk_key,
    load_question_memory,
)
from app.ranking import FEATURES, candidate_features
from app.retriever import HybridRetriever, RetrievalOptions
from eval.memory_training import build_memory, held_out, resolve
from eval.metrics import Question
from eval.question_set import split_of
from indexer.embedder import HashEmbedder
from indexer.text_units import text_units
from tests.test_retriever_mechanics import CHUNKS, _index


def _unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def _memory() -> QuestionMemory:
    keys = [chunk_key(c.text) for c in CHUNKS]
    return QuestionMemory(
        vectors=np.vstack([_unit([1, 0, 0]), _unit([0, 1, 0]), _unit([1, 1, 0])]),
        answers=((keys[1], keys[2]), (keys[3],), (keys[1], "0123456789abcdef")),  # the last key names no chunk
        ids=("rq-1", "rq-2", "rq-3"),
        origins=("github-issue o/r#7", "github-issue o/r#7", "docs-reading"),
        encoder="toy",
        units=(("u-one", "u-two"), ("u-three",), ("u-one",)),
    )


def test_chunk_key_ignores_case_punctuation_and_spacing() -> None:
    assert chunk_key("Offload the  optimizer, to CPU.") == chunk_key("offload the optimizer to cpu")
    assert chunk_key("offload the optimizer") != chunk_key("offload the optimiser")
    assert len(chunk_key("x")) == 16


def test_seen_is_the_best_resemblance_over_the_floor_per_answering_chunk() -> None:
    resolved = ChunkMemory(_memory(), [chunk_key(c.text) for c in CHUNKS])
    assert resolved.resolved == 3 and len(resolved.chunk) == 4  # the unknown key drops, its entry stays
    seen = resolved.seen(resolved.cosines(_unit([1, 0, 0])))
    # chunk 1 is answered by entries 1 (cosine 1) and 3 (0.707): the best counts
    assert seen[1] == pytest.approx(1 - SEEN_FLOOR) and seen[2] == pytest.approx(1 - SEEN_FLOOR)
    assert seen[3] == 0.0  # entry 2 is orthogonal: no resemblance
    assert seen[0] == seen[4] == seen[5] == 0.0  # chunks no entry is answered by
    weak = resolved.seen(resolved.cosines(_unit([1, 0, 3])))  # cosine 0.32 with entry 1: under the floor
    assert not weak.any()


def test_seen_units_is_the_best_resemblance_over_the_floor_per_answering_unit() -> None:
    """The answer's `seen`: per unit key, the closest active entry it answered, less the unit floor."""
    resolved = ChunkMemory(_memory(), [chunk_key(c.text) for c in CHUNKS])
    seen = resolved.seen_units(resolved.cosines(_unit([1, 0, 0])))
    # u-one answers entries 1 (cosine 1) and 3 (0.707): the best counts; entry 2 is orthogonal
    assert seen == pytest.approx({"u-one": 1 - UNIT_SEEN_FLOOR, "u-two": 1 - UNIT_SEEN_FLOOR})
    assert resolved.seen_units(resolved.cosines(_unit([1, 0, 3]))) == {}  # cosine 0.32 at best: under the floor
    without = resolved.without([0]).seen_units(resolved.without([0]).cosines(_unit([1, 0, 0])))  # an evaluation of entry 1 leaves it out
    assert without == pytest.approx({"u-one": float(_unit([1, 1, 0])[0]) - UNIT_SEEN_FLOOR})
    no_units = ChunkMemory(QuestionMemory(_memory().vectors, _memory().answers, _memory().ids, _memory().origins, "toy"), [])
    assert no_units.seen_units(no_units.cosines(_unit([1, 0, 0]))) == {}


def test_best_is_the_closest_active_question_for_the_coverage_decision() -> None:
    resolved = ChunkMemory(_memory(), [chunk_key(c.text) for c in CHUNKS])
    assert resolved.best(resolved.cosines(_unit([1, 0, 0]))) == pytest.approx(1.0)
    assert resolved.best(resolved.cosines(_unit([0, 0, 1]))) == pytest.approx(0.0, abs=1e-6)  # orthogonal to all three
    assert resolved.without([0]).best(resolved.without([0]).cosines(_unit([1, 0, 0]))) == pytest.approx(float(_unit([1, 1, 0])[0]))
    assert resolved.without([0, 1, 2]).best(resolved.without([0, 1, 2]).cosines(_unit([1, 0, 0]))) == 0.0  # nothing left to resemble


def test_a_missing_feature_moves_a_linear_score_neither_way() -> None:
    model = LinearModel(("a", "b"), np.array([1.0, 2.0]), np.array([1.0, 1.0]), np.array([3.0, 5.0]), 0.5)
    assert model.score(np.array([[2.0, np.nan]]))[0] == pytest.approx(3.5)  # b at its mean
    assert model.score(np.array([[2.0, 3.0]]))[0] == pytest.approx(8.5)


def test_an_evaluation_leaves_out_the_question_and_its_thread() -> None:
    memory = _memory()
    assert memory.related("rq-1", "github-issue o/r#7") == [0, 1]
    assert memory.related("rq-3", "docs-reading") == [2]  # a kind of reading is not a thread
    assert memory.related("rq-9", "github-issue o/r#8") == []
    resolved = ChunkMemory(memory, [chunk_key(c.text) for c in CHUNKS])
    without = resolved.without(memory.related("rq-1", "github-issue o/r#7"))
    seen = without.seen(without.cosines(_unit([1, 0, 0])))
    assert seen[2] == 0.0 and seen[1] == pytest.approx(max(float(_unit([1, 1, 0])[0]) - SEEN_FLOOR, 0.0))
    assert resolved.seen(resolved.cosines(_unit([1, 0, 0])))[2] > 0  # the original is unchanged


def test_saved_and_loaded_the_same_and_never_half_written(tmp_path: Path) -> None:
    memory = _memory()
    path = memory.save(tmp_path / "m.npz")
    loaded = load_question_memory(path)
    assert loaded is not None and loaded.answers == memory.answers and loaded.ids == memory.ids
    assert loaded.origins == memory.origins and loaded.encoder == "toy" and loaded.units == memory.units
    assert np.allclose(loaded.vectors, memory.vectors, atol=1e-3)  # stored in float16
    assert not list(tmp_path.glob("*.tmp*"))
    assert load_question_memory(tmp_path / "absent.npz") is None
    np.savez(tmp_path / "bad.npz", vectors=np.zeros((2, 3)), answers=np.array(["a"]), ids=np.array(["q"]),
             origins=np.array([""]), encoder=np.array("toy"), trained_on=np.array(""))
    with pytest.raises(ValueError, match="retrain it"):
        load_question_memory(tmp_path / "bad.npz")
    # a memory written before units were kept loads with none (the answer's `seen` is then 0)
    np.savez(tmp_path / "old.npz", vectors=memory.vectors, answers=np.array([" ".join(a) for a in memory.answers]),
             ids=np.array(memory.ids), origins=np.array(memory.origins), encoder=np.array("toy"), trained_on=np.array(""))
    old = load_question_memory(tmp_path / "old.npz")
    assert old is not None and old.units == ((), (), ())


def _tune_question(text: str, evidence: str, origin: str = "") -> Question:
    n = 0
    while split_of(f"m-{n}") != "tune":
        n += 1
    return Question(id=f"m-{n}", question=text, lang="en", topic="", evidence=(evidence,), must_mention=(), origin=origin)


def test_built_from_tune_questions_and_read_by_the_ranker() -> None:
    index = replace(_index(CHUNKS), units=[text_units(c.text) for c in CHUNKS])  # each chunk's units, as indexed
    retriever = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(section_words=0))
    q = _tune_question("where do checkpoints get written", "saved with save_checkpoint", "github-issue o/r#1")
    memory = build_memory(retriever, [q], [])
    assert memory.ids == (q.id,) and memory.answers == ((chunk_key(CHUNKS[3].text),),)
    holding = [u.text for u in index.chunk_units(3)[0] if "saved with save_checkpoint" in u.text.lower()]
    assert holding and memory.units == ((chunk_key(holding[0]),),)  # the unit that holds the gold phrase
    test_id = next(f"t-{n}" for n in range(100) if split_of(f"t-{n}") == "test")
    with pytest.raises(ValueError, match="tune questions only"):
        build_memory(retriever, [Question(id=test_id, question="q", lang="en", topic="", evidence=("e",), must_mention=())], [])
    with_memory = retriever.with_options(question_memory=resolve(memory, retriever))
    _, signals = with_memory.signals(q.question)  # the remembered question itself: cosine 1
    assert signals.seen is not None and signals.seen[3] == pytest.approx(1 - SEEN_FLOOR, abs=1e-5)
    ids = np.arange(len(CHUNKS))
    rows = candidate_features(ids, signals, with_memory.feature_table)
    assert rows[3, FEATURES.index("seen")] > 0 and not rows[[0, 1, 2, 4, 5], FEATURES.index("seen")].any()
    # a ranker that reads only `seen` puts the remembered answer first
    n = len(FEATURES)
    weights = np.zeros(n)
    weights[FEATURES.index("seen")] = 1.0
    ranked = with_memory.with_options(ranker=LinearModel(FEATURES, np.zeros(n), np.ones(n), weights, 0.0))
    assert ranked.search(q.question, 3).hits[0].chunk.id == "c3"
    # an evaluation of the same question leaves its own entry out
    alone = held_out(with_memory, [q])[q.id]
    alone_signals = alone.signals(q.question)[1]
    assert alone.options.question_memory is not None and not alone_signals.seen.any()  # type: ignore[union-attr]
    assert alone_signals.seen_best == 0.0 and signals.seen_best == pytest.approx(1.0, abs=1e-5)
    assert retriever.signals(q.question)[1].seen_best is None  # no memory: the coverage feature is missing
    # the answer's unit scorer reads the remembered unit: `seen` on it, 0 on its neighbours
    result = with_memory.search(q.question, 3)
    assert result.seen_units == pytest.approx({chunk_key(holding[0]): 1 - UNIT_SEEN_FLOOR}, abs=1e-5)
    source = Source(1, "T", "H", CHUNKS[3].text, units=tuple(index.chunk_units(3)[0]))
    cands = [Candidate(source, u, i) for i, u in enumerate(source.units or ())]
    rows = unit_features("where are checkpoints written", cands, np.zeros(len(cands)), result.seen_units)
    column = rows[:, UNIT_FEATURES.index("seen")]
    assert [c.unit.text for c, v in zip(cands, column, strict=True) if v > 0] == [holding[0]]
    assert not held_out(with_memory, [q])[q.id].search(q.question, 3).seen_units



def test_the_lexical_side_remembers_the_questions_words(tmp_path: Path) -> None:
    """`seen_lex`: the best character n-gram TF-IDF cosine with a remembered question a chunk answers, less
    the floor (scikit-learn's cosines, re-done in numpy); left out with the question's entry; stored and
    read back; a damaged one says to retrain."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from app.char_tfidf import MIN_DF, char_ngrams

    index = replace(_index(CHUNKS), units=[text_units(c.text) for c in CHUNKS])
    retriever = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(section_words=0))
    first = _tune_question("where do ZeRO-3 checkpoints get written", "saved with save_checkpoint", "github-issue o/r#1")
    n = int(first.id.split("-")[1]) + 1
    while split_of(f"m-{n}") != "tune":
        n += 1
    second = Question(id=f"m-{n}", question="pipeline 并行 stages 怎么切", lang="zh", topic="", evidence=("pipeline",), must_mention=())
    memory = build_memory(retriever, [first, second], [])
    assert memory.lexical is not None
    asked = "where are my ZeRO-3 checkpoints written?"
    reference = TfidfVectorizer(analyzer=char_ngrams, min_df=MIN_DF, sublinear_tf=True).fit([first.question, second.question])
    expected = (reference.transform([first.question, second.question]) @ reference.transform([asked]).T).toarray()[:, 0]
    assert np.allclose(memory.lexical.cosines(asked, 2), expected, atol=1e-9)
    with_memory = retriever.with_options(question_memory=resolve(memory, retriever))
    seen_lex = with_memory.signals(asked)[1].seen_lex
    assert seen_lex is not None and seen_lex[3] == pytest.approx(expected[0] - LEXICAL_FLOOR, abs=1e-5) and seen_lex[3] > 0
    rows = candidate_features(np.arange(len(CHUNKS)), with_memory.signals(asked)[1], with_memory.feature_table)
    assert rows[3, FEATURES.index("seen_lex")] == pytest.approx(float(seen_lex[3]))
    assert not held_out(with_memory, [first])[first.id].signals(asked)[1].seen_lex[3]  # type: ignore[index]
    assert retriever.signals(asked)[1].seen_lex is None  # no memory
    loaded = load_question_memory(memory.save(tmp_path / "m.npz"))
    assert loaded is not None and loaded.lexical is not None
    assert np.allclose(loaded.lexical.cosines(asked, 2), expected, atol=1e-5)
    with np.load(tmp_path / "m.npz") as data:
        arrays = {k: data[k] for k in data.files}
    np.savez(tmp_path / "bad.npz", **{**arrays, "lexical_rows": arrays["lexical_rows"] + 5})  # entries it does not have
    with pytest.raises(ValueError, match="retrain it"):
        load_question_memory(tmp_path / "bad.npz")
