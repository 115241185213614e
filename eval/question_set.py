"""Our own labelled question set (`eval/questions/*.jsonl`) and its one split into `tune` and `test`.

The split is fixed by a hash of each question's id, so it never depends on file order, on which
questions were added later, or on anyone's choice: every retrieval choice (weights, priors,
expansions, models, the re-ranker) is made on `tune`; `test` only reports.

The training-only questions (`eval/training/*.jsonl`) and the second outside set hold no text of the
docs: each gold phrase is stored as the key of its normalised text, its length in characters and its
word count (`phrase_key`), and found again in the index's passages of the named page when the questions
are loaded (`keyed_question`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from eval.metrics import Question, load_questions, normalise
from indexer.documents import Chunk

log = logging.getLogger(__name__)
_WORD_START = re.compile(r"(?:^| )(?=\S)")

QUESTIONS_DIR = Path(__file__).resolve().parent / "questions"
# training-only questions (written from doc sections, in users' words): the query adapter learns from
# them beside tune; never scored, never split
TRAINING_DIR = Path(__file__).resolve().parent / "training"
# real-user questions no choice was made on and no model learned from (the "further set kept outside"):
# reported beside tune, test and dev; never split, never trained on
OUTSIDE_QUESTIONS = Path(__file__).resolve().parent / "heldout" / "outside.jsonl"
# a second such set, 326 real-user questions from threads no other set uses, each with one gold phrase (most
# of the split set's have two): written as training-only questions, measured not to help as training, kept
# to report only; its phrases are stored as keys, like the training-only questions' (`load_keyed_questions`).
# Scored with one phrase each, the test split falls from .718 / .920 / .802 (hit@1 / hit@5 / MRR@10) to .620 / .868 /
# .722 on its first phrases and .607 / .834 / .705 on its last (267 of its 326 questions have two or more; 38 of the
# 80 outside ones, 2 of these 326): most of the gap between test and this set is the number of phrases (stop 55)
OUTSIDE_B_QUESTIONS = Path(__file__).resolve().parent / "heldout" / "outside_b.jsonl"
# terse answerable questions ("bf16 or fp16?", "zero3 怎么导出权重？"; `app.query.coverage_group`), split
# by id like the others; apart from QUESTIONS_DIR, so they change none of the long questions' splits
TERSE_QUESTIONS = Path(__file__).resolve().parent / "terse" / "answerable.jsonl"
Split = Literal["tune", "test"]
SPLITS: tuple[Split, ...] = ("tune", "test")


def split_of(question_id: str) -> Split:
    """`tune` or `test` by the first 8 hex digits of sha256(id): about half each, never reassigned."""
    value = int(hashlib.sha256(question_id.encode("utf-8")).hexdigest()[:8], 16)
    return "tune" if value % 2 == 0 else "test"


def hash_fold(question_id: str, folds: int) -> int:
    """A tune question's cross-validation fold, by its own hash (independent of the tune/test split)."""
    return int(hashlib.sha256(f"fold:{question_id}".encode()).hexdigest()[:8], 16) % folds


def question_files(directory: Path = QUESTIONS_DIR) -> list[Path]:
    return sorted(directory.glob("*.jsonl"))


def load_question_set(directory: Path = QUESTIONS_DIR) -> list[Question]:
    """Every question of every JSONL file in the directory; ids must be unique across files."""
    questions: list[Question] = []
    seen: set[str] = set()
    for file in question_files(directory):
        for q in load_questions(file):
            if q.id in seen:
                raise ValueError(f"{file}: question id {q.id!r} appears twice in {directory}")
            seen.add(q.id)
            questions.append(q)
    return questions


def phrase_key(text: str) -> str:
    """What a training-only question stores for a gold phrase: 16 hex digits of the sha256 of its
    normalised text (with `len(normalise(text))`, its length)."""
    return hashlib.sha256(normalise(text).encode("utf-8")).hexdigest()[:16]


def find_phrase(texts: Iterable[str], key: str, chars: int) -> str | None:
    """The normalised phrase of `chars` characters, starting at a word of one of the normalised
    `texts`, whose key is `key`; None when none is."""
    for text in texts:
        for start in _WORD_START.finditer(text):
            piece = text[start.end():start.end() + chars]
            if len(piece) == chars and phrase_key(piece) == key:
                return piece
    return None


def page_texts(chunks: Iterable[Chunk]) -> dict[str, list[str]]:
    """Page path -> the normalised texts of its passages: where a keyed phrase is looked for."""
    texts: dict[str, list[str]] = {}
    for c in chunks:
        texts.setdefault(c.path, []).append(normalise(c.text))
    return texts


def keyed_question(row: dict[str, Any], texts: dict[str, list[str]]) -> tuple[Question, int]:
    """A question whose gold phrases are stored as keys, with the phrases found in `texts` (`page_texts`),
    and how many no passage of the named page holds (left out)."""
    found = [find_phrase(texts.get(g["path"], ()), str(g["phrase_key"]), int(g["chars"])) for g in row["gold"]]
    question = Question(str(row["id"]), str(row["question"]), str(row.get("lang", "en")), str(row.get("topic", "")),
                        tuple(p for p in found if p), tuple(str(m) for m in row.get("must_mention", [])),
                        str(row.get("origin", "")))
    return question, found.count(None)


def load_keyed_questions(path: Path, chunks: Iterable[Chunk]) -> list[Question]:
    """A held-out question file in the keyed form (`OUTSIDE_B_QUESTIONS`), its phrases found in `chunks`; a
    question none of whose phrases a passage holds (another docs version) is left out, with a warning."""
    texts = page_texts(chunks)
    questions: list[Question] = []
    lost = 0
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            question, missing = keyed_question(row, texts)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: not a keyed question ({exc})") from exc
        lost += missing
        if question.evidence:
            questions.append(question)
    if lost:
        log.warning("%d gold phrases of %s are in no passage of these docs: left out", lost, path.name)
    return questions


def load_question_file(path: Path, chunks: Iterable[Chunk]) -> list[Question]:
    """A further labelled question file in either form: gold phrases as text (`eval.metrics.load_questions`)
    or as keys (`load_keyed_questions`), told apart by its first question's first gold phrase."""
    first: dict[str, Any] = next((json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()), {})
    keyed = any("phrase_key" in g for g in first.get("gold", [])[:1])
    return load_keyed_questions(path, chunks) if keyed else load_questions(path)


THREAD_ORIGIN = re.compile(r"github-issue [\w.-]+/[\w.-]+#\d+")  # a question a user asked in a thread (issue or discussion)


def asked_in_thread(origin: str) -> bool:
    return THREAD_ORIGIN.fullmatch(origin) is not None


def asked_in_threads(questions: Iterable[Question]) -> list[Question]:
    """The questions a user asked in a thread (origin `github-issue owner/repo#N`), not those written
    from a doc section (origin `synthetic: <page>`)."""
    return [q for q in questions if asked_in_thread(q.origin)]


def load_training_questions(chunks: Iterable[Chunk], directory: Path = TRAINING_DIR) -> list[Question]:
    """The training-only questions, their gold phrases found in `chunks` (the index's passages) of the
    page each names. A phrase no passage holds any more (another docs version) is dropped, and so is a
    question left with none. Their ids must not be evaluation ids."""
    texts = page_texts(chunks)
    scored = {q.id for q in load_question_set()} if QUESTIONS_DIR.is_dir() else set()
    questions: list[Question] = []
    seen: set[str] = set()
    lost = 0
    for file in question_files(directory) if directory.is_dir() else []:
        for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                question, missing = keyed_question(json.loads(line), texts)
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{file}:{n}: not a training question ({exc})") from exc
            if question.id in scored or question.id in seen:
                raise ValueError(f"{file}:{n}: question id {question.id!r} is already used")
            seen.add(question.id)
            lost += missing
            if question.evidence:
                questions.append(question)
    if lost:
        log.warning("%d gold phrases of the training-only questions are in no passage of these docs: left out", lost)
    return questions


def load_split(split: Split, directory: Path = QUESTIONS_DIR) -> list[Question]:
    return [q for q in load_question_set(directory) if split_of(q.id) == split]
