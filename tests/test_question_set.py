"""Our labelled question set: size and make-up, every gold phrase verbatim in the docs and reachable
in a passage, and the one split by id hash."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from eval.metrics import normalise
from eval.question_set import (
    OUTSIDE_B_QUESTIONS,
    OUTSIDE_QUESTIONS,
    QUESTIONS_DIR,
    TERSE_QUESTIONS,
    TRAINING_DIR,
    asked_in_thread,
    load_question_file,
    load_question_set,
    load_split,
    load_training_questions,
    phrase_key,
    question_files,
    split_of,
)
from indexer.build import chunk_all
from indexer.docs_source import read_docs_dir
from indexer.documents import Chunk


def _rows(directory: Path = QUESTIONS_DIR) -> list[dict]:
    return [json.loads(line) for f in question_files(directory) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]


def _heldout_rows() -> list[dict]:
    """The outside sets' and the terse set's answerable questions."""
    files = (OUTSIDE_QUESTIONS, OUTSIDE_B_QUESTIONS, TERSE_QUESTIONS)
    return [json.loads(line) for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_make_up_of_the_set() -> None:
    rows = _rows()
    assert len(rows) >= 240
    assert len({r["id"] for r in rows}) == len(rows)
    assert sum(r["origin"].startswith(("github-issue", "github-discussion")) for r in rows) >= 150
    assert sum(r["lang"] == "zh" for r in rows) >= 40
    plain = [r for r in rows if r.get("style") == "config-plain"]
    assert len(plain) >= 30
    for r in plain:  # the behaviour is described, the key never named
        for key in r["must_mention"]:
            leaf = key.split(".")[-1].lower()
            assert leaf not in r["question"].lower() and leaf.replace("_", " ") not in r["question"].lower(), r["id"]
    for r in rows:
        assert r["lang"] in ("en", "zh") and 1 <= len(r["gold"]) <= 3, r["id"]
        assert all(set(g) == {"path", "evidence"} for g in r["gold"]), r["id"]
        if r["lang"] == "zh":
            assert re.search(r"[\u4e00-\u9fff]", r["question"]), r["id"]


def test_split_is_by_id_hash_and_balanced() -> None:
    questions = load_question_set()
    tune, test = load_split("tune"), load_split("test")
    assert len(tune) + len(test) == len(questions)
    assert {q.id for q in tune}.isdisjoint({q.id for q in test})
    assert all(split_of(q.id) == "test" for q in test)
    assert split_of("rq-a-001") == split_of("rq-a-001")
    assert 0.4 <= len(tune) / len(questions) <= 0.6
    for part in (tune, test):
        assert Counter(q.lang for q in part)["zh"] >= 20


def test_the_terse_sets() -> None:
    """Every question terse by the coverage decision's own rule; ids unique across every set; each split
    holds enough answerable ones for a threshold of their own, in both languages."""
    from app.query import TERSE, coverage_group
    from eval.abstention_training import MIN_GROUP
    from eval.answer_quality import TERSE_UNANSWERABLE, UNANSWERABLE, load_unanswerable

    answerable = [json.loads(line) for line in TERSE_QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    unanswerable = load_unanswerable(TERSE_UNANSWERABLE)
    assert len(answerable) >= 150 and len(unanswerable) >= 120
    assert all(coverage_group(q) == TERSE for q in [r["question"] for r in answerable] + [u.question for u in unanswerable])
    ids = [r["id"] for r in answerable] + [u.id for u in unanswerable]
    others = {q.id for q in load_question_set()} | {u.id for u in load_unanswerable(UNANSWERABLE)}
    assert len(set(ids)) == len(ids) and others.isdisjoint(ids)
    for split in ("tune", "test"):
        part = [r for r in answerable if split_of(r["id"]) == split]
        assert len(part) >= MIN_GROUP and sum(r["lang"] == "zh" for r in part) >= 20
        assert sum(split_of(u.id) == split for u in unanswerable) >= 50
    assert not [q for q in load_question_set() if coverage_group(q.question) == TERSE]  # the long sets hold none


def test_duplicate_ids_across_files_are_refused(tmp_path: Path) -> None:
    line = '{"id": "x-1", "question": "q?", "lang": "en", "topic": "t", "gold": [], "must_mention": []}\n'
    (tmp_path / "a.jsonl").write_text(line)
    (tmp_path / "b.jsonl").write_text(line)
    with pytest.raises(ValueError, match="twice"):
        load_question_set(tmp_path)


def test_every_gold_phrase_is_verbatim_in_its_file_and_in_a_passage(real_docs: Path) -> None:
    """Verbatim in the named file (under the scoring rule's normalisation), and inside one passage of
    the parsed, chunked docs: a phrase no passage can hold would be a question nobody can hit."""
    chunks, _ = chunk_all(read_docs_dir(real_docs))
    passages = [normalise(c.text) for c in chunks]
    files: dict[str, str] = {}
    problems = []
    outside = [json.loads(line) for path in (OUTSIDE_QUESTIONS, TERSE_QUESTIONS)
               for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for r in _rows() + outside:
        for g in r["gold"]:
            path = real_docs / g["path"]
            assert path.is_file(), f"{r['id']}: no file {g['path']}"
            if g["path"] not in files:
                raw = path.read_text(encoding="utf-8")
                raw = re.sub(r"\]\([^)]*\)", "]", raw)  # link targets and inline HTML tags are not prose
                files[g["path"]] = normalise(re.sub(r"</?[A-Za-z][^<>\n]*>", " ", raw))
            phrase = normalise(g["evidence"])
            words = len(g["evidence"].split())
            assert 6 <= words <= 15, f"{r['id']}: evidence of {words} words"
            if phrase not in files[g["path"]]:
                problems.append(f"{r['id']}: not verbatim in {g['path']}: {g['evidence']!r}")
            elif not any(phrase in p for p in passages):
                problems.append(f"{r['id']}: in no passage: {g['evidence']!r}")
    assert not problems, "\n".join(problems)


def test_training_only_questions_hold_no_doc_text_and_find_their_phrases(real_docs: Path) -> None:
    """Each gold phrase is stored as a key, a length and a word count (6 to 15 words for a question
    written from a doc page, 5 to 40 for one asked in a thread), never as text, and is found in a passage
    of the page it names; the ids are outside the evaluation set (so no split holds them), each names its
    source page or thread, and no thread is one a scored set's question came from."""
    rows = _rows(TRAINING_DIR)
    assert len(rows) >= 200
    scored_threads = {r.get("origin", "") for r in _rows() + _heldout_rows()}
    for r in rows:
        written = r["origin"].startswith(("synthetic: docs/", "synthetic: blogs/"))
        asked = asked_in_thread(r["origin"])
        assert written or (asked and r["origin"] not in scored_threads), r["id"]
        for g in r["gold"]:
            assert set(g) == {"path", "phrase_key", "chars", "words"}, r["id"]
            assert 6 <= g["words"] <= 15 if written else 5 <= g["words"] <= 40, r["id"]
    chunks, _ = chunk_all(read_docs_dir(real_docs))
    training = load_training_questions(chunks)
    assert {q.id for q in training}.isdisjoint({q.id for q in load_question_set()})
    by_id = {q.id: q for q in training}
    missing = [r["id"] for r in rows if r["id"] not in by_id or len(by_id[r["id"]].evidence) != len(r["gold"])]
    assert not missing, missing
    assert all(phrase_key(p) == g["phrase_key"] for r in rows for p, g in zip(by_id[r["id"]].evidence, r["gold"], strict=True))


def test_the_second_outside_set_holds_no_doc_text_and_finds_its_phrases(real_docs: Path, tmp_path: Path) -> None:
    """`eval/heldout/outside_b.jsonl` stores each gold phrase (5 to 40 words: mostly a whole answering sentence)
    as a key, a length and a word count, never as text; every one is found in a passage of the page it names,
    and the set loads as keyed wherever a further question file is read (`load_question_file`)."""
    rows = [json.loads(line) for line in OUTSIDE_B_QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    for r in rows:
        for g in r["gold"]:
            assert set(g) == {"path", "phrase_key", "chars", "words"} and 5 <= g["words"] <= 40, r["id"]
    chunks, _ = chunk_all(read_docs_dir(real_docs))
    loaded = load_question_file(OUTSIDE_B_QUESTIONS, chunks)
    assert [q.id for q in loaded] == [r["id"] for r in rows]
    assert all(len(q.evidence) == len(r["gold"]) and q.origin == r["origin"] for q, r in zip(loaded, rows, strict=True))
    assert all(phrase_key(p) == g["phrase_key"] for q, r in zip(loaded, rows, strict=True) for p, g in zip(q.evidence, r["gold"], strict=True))
    # a file with the phrases as text still loads as text
    (tmp_path / "t.jsonl").write_text(json.dumps({"id": "x", "question": "q?", "gold": [{"path": "p.md", "evidence": "some words"}]}))
    assert load_question_file(tmp_path / "t.jsonl", chunks)[0].evidence == ("some words",)


def test_a_training_phrase_is_found_again_or_left_out(tmp_path: Path) -> None:
    """Found in the named page's passages by key and length; a phrase no passage holds is dropped, and a
    question left with none with it; an id the evaluation set uses is refused."""
    chunk = Chunk(id="c", text="Set `overlap_comm` to overlap the reduction with the backward pass.", path="docs/p.md",
                  url="u", title="T", heading="H", trail=("T",), source="docs")
    phrase = "overlap the reduction with the backward pass"

    def gold(text: str, path: str = "docs/p.md") -> dict:
        return {"path": path, "phrase_key": phrase_key(text), "chars": len(normalise(text)), "words": len(text.split())}

    rows = [{"id": "syn-1", "question": "q", "gold": [gold(phrase), gold(phrase, "docs/other.md")]},
            {"id": "syn-2", "question": "q", "gold": [gold("a sentence that is in none of the passages")]}]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    loaded = load_training_questions([chunk], tmp_path)
    assert [(q.id, q.evidence) for q in loaded] == [("syn-1", (normalise(phrase),))]
    (tmp_path / "t.jsonl").write_text(json.dumps({**rows[0], "id": load_question_set()[0].id}), encoding="utf-8")
    with pytest.raises(ValueError, match="already used"):
        load_training_questions([chunk], tmp_path)


def test_the_outside_set_shares_nothing_with_the_split_set() -> None:
    """`eval/heldout/outside.jsonl` is never split or trained on: its ids, threads and questions are its own."""
    outside = [json.loads(line) for line in OUTSIDE_QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = _rows()
    assert len(outside) >= 80 and len({r["id"] for r in outside}) == len(outside)
    assert {r["id"] for r in outside}.isdisjoint({r["id"] for r in rows})
    assert {r["origin"] for r in outside}.isdisjoint({r["origin"] for r in rows})
    assert Counter(r["lang"] for r in outside)["zh"] >= 20
    assert not any(q.id in {r["id"] for r in outside} for q in load_question_set())
    assert OUTSIDE_QUESTIONS.parent != QUESTIONS_DIR
    # and the second outside set: its own ids and threads, apart from the first one's and the split set's
    outside_b = [json.loads(line) for line in OUTSIDE_B_QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(outside_b) >= 300 and len({r["id"] for r in outside_b}) == len(outside_b)
    assert len({r["origin"] for r in outside_b}) == len(outside_b)  # one question a thread
    assert {r["id"] for r in outside_b}.isdisjoint({r["id"] for r in rows + outside})
    assert {r["origin"] for r in outside_b}.isdisjoint({r["origin"] for r in rows + outside})
    assert Counter(r["lang"] for r in outside_b)["zh"] >= 100


def test_questions_dir_holds_only_question_files() -> None:
    assert QUESTIONS_DIR.is_dir()
    assert all(p.suffix == ".jsonl" for p in QUESTIONS_DIR.iterdir() if p.is_file())
