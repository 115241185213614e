"""Retrieval scoring over labelled questions: pure functions, the project's one scoring rule.

A passage is relevant when its normalised text (lowercase, letters and digits only, single spaces)
contains a gold evidence phrase's normalised form, whichever file it came from.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_ALNUM = re.compile(r"[^\W_]+")


def normalise(text: str) -> str:
    return " ".join(_ALNUM.findall(text.lower()))


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a share (`successes` of `n`): how far a figure on a few hundred
    questions may sit from the rate it estimates (test hit@5 299 of 326 reads 0.88-0.94, so a target of
    0.92 is inside it either way); (0.0, 1.0) for no questions."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    lang: str
    topic: str
    evidence: tuple[str, ...]
    must_mention: tuple[str, ...]
    origin: str = ""  # where the question came from: a thread (`github-issue owner/repo#N`) or a kind of reading


def load_questions(path: Path) -> list[Question]:
    questions: list[Question] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            questions.append(
                Question(
                    id=str(d.get("id", n)),
                    question=str(d["question"]),
                    lang=str(d.get("lang", "en")),
                    topic=str(d.get("topic", "")),
                    evidence=tuple(str(g["evidence"]) for g in d.get("gold", [])),
                    must_mention=tuple(str(m) for m in d.get("must_mention", [])),
                    origin=str(d.get("origin", "")),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: not a labelled question ({exc})") from exc
    return questions


@dataclass
class Scored:
    id: str
    lang: str
    topic: str
    first_relevant: int | None  # 1-based rank of the first relevant passage in the top 10
    ndcg10: float
    mention_share: float
    top5_words: list[int] = field(default_factory=list)

    def hit(self, k: int) -> bool:
        return self.first_relevant is not None and self.first_relevant <= k

    @property
    def rr(self) -> float:
        return 1.0 / self.first_relevant if self.first_relevant else 0.0


def score_question(q: Question, passages: list[str], snippets: Iterable[str] = ()) -> Scored:
    """Score one question's ranked passages (best first) and returned snippet codes."""
    evid = [normalise(e) for e in q.evidence if normalise(e)]
    rels = [any(e in normalise(p) for e in evid) for p in passages[:10]]
    first = next((i + 1 for i, r in enumerate(rels) if r), None)
    dcg = sum(1.0 / math.log2(i + 2) for i, r in enumerate(rels) if r)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(max(len(set(evid)), 1), 10)))
    top5 = " ".join(passages[:5]) + " " + " ".join(snippets)
    low = top5.lower()
    share = sum(1 for m in q.must_mention if m.lower() in low) / len(q.must_mention) if q.must_mention else 1.0
    return Scored(
        id=q.id,
        lang=q.lang,
        topic=q.topic,
        first_relevant=first,
        ndcg10=min(dcg / ideal, 1.0) if ideal else 0.0,
        mention_share=share,
        top5_words=[len(p.split()) for p in passages[:5]],
    )


def summarise(scored: list[Scored]) -> dict[str, Any]:
    def block(rows: list[Scored]) -> dict[str, Any]:
        if not rows:
            return {"n": 0}
        words = [w for r in rows for w in r.top5_words]
        return {
            "n": len(rows),
            "hit@1": round(sum(r.hit(1) for r in rows) / len(rows), 4),
            "hit@5": round(sum(r.hit(5) for r in rows) / len(rows), 4),
            "hit@5_95ci": wilson_interval(sum(r.hit(5) for r in rows), len(rows)),
            "hit@10": round(sum(r.hit(10) for r in rows) / len(rows), 4),
            "mrr@10": round(sum(r.rr for r in rows) / len(rows), 4),
            "ndcg@10": round(sum(r.ndcg10 for r in rows) / len(rows), 4),
            "mention_share": round(sum(r.mention_share for r in rows) / len(rows), 4),
            "median_top5_words": statistics.median(words) if words else 0,
        }

    out: dict[str, Any] = {"all": block(scored)}
    for lang in sorted({r.lang for r in scored}):
        out[lang] = block([r for r in scored if r.lang == lang])
    out["misses@5"] = [r.id for r in scored if not r.hit(5)]
    return out


SearchFn = Callable[[str], tuple[list[str], list[str]]]  # question -> (passage texts, snippet codes)


def evaluate(questions: list[Question], search: SearchFn) -> tuple[list[Scored], dict[str, Any]]:
    scored = []
    for q in questions:
        passages, snippets = search(q.question)
        scored.append(score_question(q, passages, snippets))
    return scored, summarise(scored)
