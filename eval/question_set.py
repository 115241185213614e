"""Our own labelled question set (`eval/questions/*.jsonl`) and its one split into `tune` and `test`.

The split is fixed by a hash of each question's id, so it never depends on file order, on which
questions were added later, or on anyone's choice: every retrieval choice (weights, priors,
expansions, models, the re-ranker) is made on `tune`; `test` only reports.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from eval.metrics import Question, load_questions

QUESTIONS_DIR = Path(__file__).resolve().parent / "questions"
# training-only questions (written from doc sections, in users' words): the query adapter learns from
# them beside tune; never scored, never split
TRAINING_DIR = Path(__file__).resolve().parent / "training"
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


def load_training_questions(directory: Path = TRAINING_DIR) -> list[Question]:
    """The training-only questions; their ids must not be evaluation ids."""
    questions = load_question_set(directory) if directory.is_dir() else []
    scored = {q.id for q in load_question_set()} if QUESTIONS_DIR.is_dir() else set()
    clash = [q.id for q in questions if q.id in scored]
    if clash:
        raise ValueError(f"training question ids that are also evaluation ids: {clash[:5]}")
    return questions


def load_split(split: Split, directory: Path = QUESTIONS_DIR) -> list[Question]:
    return [q for q in load_question_set(directory) if split_of(q.id) == split]
