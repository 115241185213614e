"""The answer text judged by the project's rule, in process over the `ask` core: does the answer
itself hold a gold evidence phrase, are its cited segments whole sentences, how long is it, and does
it say "not covered" exactly when it should (answerable sets vs `eval/unanswerable.jsonl`)."""

from __future__ import annotations

import copy
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.ask import ask
from app.engine import Engine
from app.schemas import AskRequest
from eval.metrics import Question, normalise, wilson_interval

UNANSWERABLE = Path(__file__).resolve().parent / "unanswerable.jsonl"
# questions nothing indexed answers, never trained or tuned on (beside eval/question_set.OUTSIDE_QUESTIONS)
UNANSWERABLE_OUTSIDE = Path(__file__).resolve().parent / "heldout" / "unanswerable_outside.jsonl"
# terse questions the docs do not answer ("H100 多少钱", "jax backend?"), split by id like the others
TERSE_UNANSWERABLE = Path(__file__).resolve().parent / "terse" / "unanswerable.jsonl"
# training-only questions nothing indexed answers (written apart from the two sets above, on other subjects):
# the coverage decision learns from them beside tune's; never split, never scored
TRAINING_UNANSWERABLE = Path(__file__).resolve().parent / "training" / "unanswerable"
_CITATION = re.compile(r"\s*\[\d+\]")
_LOWER_START = re.compile(r"^[a-z]")
_CLOSED = re.compile(r"""[.!?:;)\]"'`*。！？）]$""")


def segments(answer: str) -> list[str]:
    """The cited segments of an extractive answer: the text before each [n] marker."""
    parts = re.split(r"\[\d+\]", answer)
    return [p.strip() for p in parts[:-1] if p.strip()]


def is_cut(segment: str) -> bool:
    """A segment that starts inside a sentence (a lowercase word) or ends without closing it."""
    body = segment.strip()
    first = body.split()[0] if body.split() else ""
    starts_inside = bool(_LOWER_START.match(first)) and not first.startswith(("`", "--"))
    return starts_inside or not _CLOSED.search(body)


def answer_words(answer: str) -> int:
    return len(_CITATION.sub("", answer).split())


def has_evidence(answer: str, evidence: tuple[str, ...]) -> bool:
    text = normalise(answer)
    return any(normalise(e) and normalise(e) in text for e in evidence)


@dataclass(frozen=True)
class Unanswerable:
    id: str
    question: str
    lang: str
    kind: str


def load_unanswerable(path: Path = UNANSWERABLE) -> list[Unanswerable]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [Unanswerable(str(r["id"]), str(r["question"]), str(r.get("lang", "en")), str(r.get("kind", ""))) for r in rows]


def load_training_unanswerable(directory: Path = TRAINING_UNANSWERABLE) -> list[Unanswerable]:
    """The training-only unanswerable questions of every JSONL file in `directory` (none without it);
    their ids must be unique and must not be ids of the scored sets."""
    scored = {u.id for path in (UNANSWERABLE, UNANSWERABLE_OUTSIDE, TERSE_UNANSWERABLE) if path.is_file() for u in load_unanswerable(path)}
    out: list[Unanswerable] = []
    for file in sorted(directory.glob("*.jsonl")) if directory.is_dir() else []:
        for u in load_unanswerable(file):
            if u.id in scored:
                raise ValueError(f"{file}: unanswerable question id {u.id!r} is already used")
            scored.add(u.id)
            out.append(u)
    return out


def _held_out_engines(engine: Engine, questions: list[Question]) -> dict[str, Engine]:
    """Question id -> the engine whose question memory leaves out the question and its thread
    (`eval.memory_training.held_out`); empty without a memory."""
    from app.retriever import HybridRetriever
    from eval.memory_training import held_out

    if not isinstance(engine.retriever, HybridRetriever) or engine.retriever.options.question_memory is None:
        return {}
    out = {}
    for qid, retriever in held_out(engine.retriever, questions).items():
        other = copy.copy(engine)  # shares the loaded index and what the engine computed once
        other.retriever = retriever
        out[qid] = other
    return out


def answer_report(engine: Engine, answerable: list[Question], unanswerable: list[Unanswerable]) -> dict[str, Any]:
    """Evidence-in-answer rate, cut segments, answer length, abstention both ways."""
    rows: list[dict[str, Any]] = []
    own = _held_out_engines(engine, answerable)
    for q in answerable:
        reply = ask(own.get(q.id, engine), AskRequest(question=q.question))
        segs = segments(reply.answer) if reply.covered else []
        rows.append({
            "id": q.id, "lang": q.lang, "covered": reply.covered, "evidence": has_evidence(reply.answer, q.evidence),
            "segments": len(segs), "cut": sum(is_cut(s) for s in segs), "words": answer_words(reply.answer),
        })
    abstained = [not ask(engine, AskRequest(question=u.question)).covered for u in unanswerable]
    n = max(len(rows), 1)
    covered = [r for r in rows if r["covered"]]
    return {
        "answerable": len(rows),
        "evidence_in_answer": round(sum(r["evidence"] for r in rows) / n, 4),
        "evidence_in_answer_95ci": wilson_interval(sum(r["evidence"] for r in rows), len(rows)),
        "evidence_in_answer_zh": round(sum(r["evidence"] for r in rows if r["lang"] == "zh") / max(sum(r["lang"] == "zh" for r in rows), 1), 4),
        "segments": sum(r["segments"] for r in rows),
        "cut_segments": sum(r["cut"] for r in rows),
        "median_answer_words": statistics.median([r["words"] for r in covered]) if covered else 0,
        "false_abstention": round(1 - len(covered) / n, 4),
        "unanswerable": len(unanswerable),
        "abstention": round(sum(abstained) / max(len(abstained), 1), 4),
        "abstention_95ci": wilson_interval(sum(abstained), len(abstained)),
        "missed_abstention_ids": [u.id for u, a in zip(unanswerable, abstained, strict=True) if not a],
    }
