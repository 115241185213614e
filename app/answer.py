"""Compose the extractive answer from the top passages, with [n] citations (a generated answer, when an
endpoint is configured, starts from it: `app/llm_client.py`)."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from app.query import identifiers
from app.question_memory import chunk_key
from app.tree_model import TreeModel, load_tree_model
from indexer.text_units import Unit, bare_entry_key, text_units
from indexer.tokenize import STOPWORDS, term_set, tokenize

log = logging.getLogger(__name__)

ANSWER_WORDS = 120  # before any links
LEAD_UNITS = 3
LEAD_WORDS = 80
MAX_SEGMENTS = 8
SEMANTIC_WEIGHT = 4.0  # cosine against term overlap when choosing units (chosen on the tune split)
REPEAT_OVERLAP = 0.8  # a unit sharing this share of its terms with one already quoted adds nothing
SUPPORT_SHARE = 0.2  # a further unit joins only when it scores at least this share of the lead's (chosen on tune)
# (after the lead, the units most likely together to hold the answer within the words, a knapsack over the scorer's
# probabilities, instead of the best first while they fit: tune CV 287 -> 289-290 of 374, under the margin; not kept)
MISMATCH_PENALTY = 0.5  # a unit about a sibling option of the one asked (bf16 asked, fp16 said)
# options a question picks one of, whose sentences look alike and say different things
OPTION_FAMILIES: tuple[dict[str, re.Pattern[str]], ...] = tuple(
    {name: re.compile(pattern, re.I) for name, pattern in family.items()}
    for family in (
        {"fp16": r"\bfp16\b|\bfloat16\b|half[- ]precision", "bf16": r"\bbf16\b|bfloat16"},
        {"stage 1": r"(?:stage|zero)[-_ ]?1\b", "stage 2": r"(?:stage|zero)[-_ ]?2\b", "stage 3": r"(?:stage|zero)[-_ ]?3\b|stage3_"},
        {"cpu": r"\bcpu\b", "nvme": r"\bnvme\b"},
    )
)
NOT_COVERED = (
    "The DeepSpeed docs and notes indexed here do not seem to cover this question. "
    "The passages below are only the closest matches; naming the feature or config key "
    "(e.g. `zero_optimization.stage` or `PipelineModule`) may find more."
)


@dataclass(frozen=True)
class Source:
    n: int  # citation number, 1-based
    title: str
    heading: str
    text: str
    units: tuple[Unit, ...] | None = None  # the passage's text units as indexed (None: split from `text`)
    score: float = 0.0  # the retriever's ranking score of the passage (comparable within one question)


@dataclass(frozen=True)
class Candidate:
    source: Source
    unit: Unit
    position: int  # index of the unit in its passage


ANSWER_DEPTH = 3  # the passages an answer quotes from


def candidates(sources: list[Source]) -> list[Candidate]:
    """The quotable units of the first passages (a source's own units when it brings them)."""
    return [Candidate(src, u, i) for src in sources[:ANSWER_DEPTH] for i, u in enumerate(text_units(src.text) if src.units is None else src.units)]


def unit_scores(ask: str, cands: list[Candidate], similarities: np.ndarray | None = None, *,
                semantic_weight: float = 1.0, lexical_weight: float = 1.0, rank_step: float = 0.05,
                mismatch_penalty: float = MISMATCH_PENALTY) -> np.ndarray:
    """How well each unit answers: cosine with the question (when the encoder gave one), the share
    of the ask's terms it holds (identifiers count double), and a small bonus for earlier passages."""
    terms = set(tokenize(ask)) - STOPWORDS
    idents = {t for t in terms if "_" in t or "." in t}
    weight = sum(2.0 if t in idents else 1.0 for t in terms) or 1.0
    scores = np.zeros(len(cands))
    for i, c in enumerate(cands):
        unit_terms = term_set(c.unit.text)
        lexical = sum(2.0 if t in idents else 1.0 for t in terms & unit_terms) / weight
        scores[i] = lexical_weight * lexical - rank_step * (c.source.n - 1)
    if similarities is not None:
        scores += semantic_weight * similarities
    for i, c in enumerate(cands):
        if about_other_option(ask, c.unit.text):
            scores[i] -= mismatch_penalty
    return scores


UNIT_MODEL_FILE = Path(__file__).resolve().parent / "answer_units.json"
UNIT_FEATURES: tuple[str, ...] = (
    "cos",  # cosine of the question and the unit
    "cos_gap",  # minus the best unit's cosine
    "lexical",  # share of the ask's terms the unit holds (identifiers count double)
    "passage_rank",  # 1 / the passage's number
    "position",  # 1 / (1 + the unit's place in its passage)
    "log_words",
    "other_option",  # about a sibling option of the one asked (bf16 asked, fp16 said)
    "ident",  # names one of the question's identifiers
    "block_start",  # opens its paragraph, list or table
    "cos_rank",  # 1 / (1 + rank by cosine among the candidates)
    "lexical_rank",  # 1 / (1 + rank by term share)
    "passage_gap",  # the passage's ranking score minus the best of the candidates' passages: how close a second one runs
    "seen",  # the best cosine with a remembered question this unit answered, less the floor (`ChunkMemory.seen_units`)
    "focus",  # share of the unit's words the ask holds (`focus`): how much of it is about what was asked
)


def _rank_share(values: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(values))
    ranks[np.argsort(-values, kind="stable")] = np.arange(len(values))
    return 1.0 / (1.0 + ranks)


def unit_features(ask: str, cands: list[Candidate], similarities: np.ndarray,
                  seen: Mapping[str, float] | None = None) -> np.ndarray:
    """One row of UNIT_FEATURES per candidate unit. `seen`: the question's `SearchResult.seen_units`."""
    lexical = unit_scores(ask, cands, None, rank_step=0.0, mismatch_penalty=0.0)
    idents = set(identifiers(ask))
    asked = frozenset(_WORD.findall(ask.lower())) - STOPWORDS
    rows = np.zeros((len(cands), len(UNIT_FEATURES)))
    if not cands:
        return rows
    sims = similarities.astype(np.float64)
    rows[:, 0] = sims
    rows[:, 1] = sims - sims.max()
    rows[:, 2] = lexical
    rows[:, 9] = _rank_share(sims)
    rows[:, 10] = _rank_share(lexical)
    top = max(c.source.score for c in cands)
    for i, c in enumerate(cands):
        text = c.unit.text
        rows[i, 3] = 1.0 / c.source.n
        rows[i, 4] = 1.0 / (1 + c.position)
        rows[i, 5] = math.log1p(len(text.split()))
        rows[i, 6] = about_other_option(ask, text)
        rows[i, 7] = any(x in text for x in idents)
        rows[i, 8] = i == 0 or cands[i - 1].source.n != c.source.n or cands[i - 1].unit.block != c.unit.block
        rows[i, 11] = c.source.score - top
        rows[i, 12] = seen.get(chunk_key(text), 0.0) if seen else 0.0
        rows[i, 13] = focus(asked, text)
    return rows


_WORD = re.compile(r"[a-z0-9_]+")


def focus(asked: frozenset[str], text: str) -> float:
    """The share of a text's words (lowercased, stopwords out, a repeated word counted each time) that are among
    `asked`, the ask's words: where `lexical` asks how much of the question a unit holds, this asks how much of
    the unit is about the question (a sentence on the asked key against a long one that names it in passing).
    Unstemmed words: the tokenizer's stemmed and expanded sets measured 6 tune answers less in cross-validation."""
    words = content_words(text)
    return sum(w in asked for w in words) / max(len(words), 1)


@lru_cache(maxsize=65536)
def content_words(text: str) -> tuple[str, ...]:
    """A text's words for `focus`, remembered (the same units are scored often)."""
    return tuple(w for w in _WORD.findall(text.lower()) if w not in STOPWORDS)


def load_unit_model(path: Path = UNIT_MODEL_FILE) -> TreeModel | None:
    """The learned unit scorer (`dsqa eval train-answer`, tune split only), or None without the file."""
    return load_tree_model(path, UNIT_FEATURES)


def about_other_option(question: str, text: str) -> bool:
    """The text speaks of a sibling of the option the question picked (fp16 for a bf16 question, stage
    2 for a stage 3 one, CPU for NVMe) and never of the one picked."""
    for asked, said in zip(options_named(question), options_named(text), strict=True):
        if len(asked) == 1 and said and not said & asked:
            return True
    return False


@lru_cache(maxsize=65536)
def options_named(text: str) -> tuple[frozenset[str], ...]:
    """Per option family, the options a text names (remembered: the same units are scored often)."""
    return tuple(frozenset(name for name, pattern in family.items() if pattern.search(text)) for family in OPTION_FAMILIES)


def warm_units(texts: Iterable[str]) -> None:
    """The term set, the options named and the words of each unit text, remembered now (a server's start-up)
    rather than on the first answers that quote them."""
    for text in texts:
        term_set(text)
        options_named(text)
        content_words(text)


def compose(cands: list[Candidate], scores: np.ndarray, max_words: int | None = None,
            support_share: float = SUPPORT_SHARE, lead_from: int | None = None, said_before: str = "") -> str:
    """A lead of one to three consecutive units from the best passage, then the next best units (of any
    of the passages) while the words last; each segment cited, no unit twice, nothing said twice.
    `lead_from`: the source the lead must come from, when it has units (a page the question names);
    `said_before`: what the reply says above the composed units (a key's catalogue description), which no
    unit says again."""
    if not cands:
        return ""
    max_words = ANSWER_WORDS if max_words is None else max_words
    scores = _unsaid(cands, _fuller_rows_stand_in(cands, scores), said_before)
    if not np.isfinite(scores).any():
        return ""
    order = [int(i) for i in np.argsort(-scores, kind="stable") if np.isfinite(scores[i])]
    best = next((cands[i] for i in order if cands[i].source.n == lead_from), cands[order[0]])
    same = [c for i, c in enumerate(cands) if c.source.n == best.source.n and np.isfinite(scores[i])]
    before = next((c for c in same if c.position == best.position - 1 and c.unit.block == best.unit.block), None)
    if (before is not None and _LEANS_BACK.match(best.unit.text)
            and len(before.unit.text.split()) + len(best.unit.text.split()) <= LEAD_WORDS):
        lead = [before.unit.text, best.unit.text]  # "This ..." reads after what it points back to
    else:
        lead = [best.unit.text]
    for c in same:  # the units after the best one in the same block read on (the "because ..." sentence)
        if c.position > best.position and c.unit.block == best.unit.block and len(lead) < LEAD_UNITS:
            if any(_overlap(c.unit.text, u, both=True) >= REPEAT_OVERLAP for u in lead) or _restates(c.unit.text, _said(lead)):
                continue  # the package's word and the docs' row on one key say the same: once is enough
            if sum(len(u.split()) for u in lead) + len(c.unit.text.split()) > LEAD_WORDS:
                break
            lead.append(c.unit.text)
    parts = [(" ".join(lead), best.source.n)]
    used = {*lead}
    said = _said(lead)  # what is said so far, in reading order
    words = sum(len(u.split()) for u in lead)
    floor = support_share * float(scores[order[0]])
    for i in order[1:]:
        c = cands[i]
        if len(parts) >= MAX_SEGMENTS or float(scores[i]) < floor:
            break
        if c.unit.text in used or any(_overlap(c.unit.text, u) >= REPEAT_OVERLAP for u in used) or _restates(c.unit.text, said):
            continue  # says again what is said
        if words + len(c.unit.text.split()) > max_words:
            continue  # a shorter one further down may still fit
        parts.append((c.unit.text, c.source.n))
        used.add(c.unit.text)
        said = f"{said} {_plain(c.unit.text)}"
        words += len(c.unit.text.split())
    return " ".join(f"{text} [{n}]" for text, n in parts)


def _unsaid(cands: list[Candidate], scores: np.ndarray, before: str) -> np.ndarray:
    """The units that say again what `before` says (a key's row after the catalogue's description of the same
    key, in other quotes or cut shorter) left out."""
    if not before:
        return scores
    said = _plain(before)
    out = scores.astype(np.float64, copy=True)
    for i, c in enumerate(cands):
        if _restates(c.unit.text, said) or _overlap(c.unit.text, before) >= REPEAT_OVERLAP:
            out[i] = -np.inf
    return out


def restated(text: str, body: str) -> bool:
    """Whether `body` says `text` again, word for word once quotes, backquotes and punctuation are set aside."""
    words = _plain(text)
    return bool(words) and _holds(_plain(body), words)


def _fuller_rows_stand_in(cands: list[Candidate], scores: np.ndarray) -> np.ndarray:
    """A unit on a config key gives way to a fuller one on the same key, which takes the better of the two
    scores: a bare catalogue entry (its type and default, nothing else) to a unit that also says what the key
    does (the docs' row, "`a.b`: ... (default `0`)"), and a row whose description another row on the key holds
    word for word (the catalogue's first sentence inside the docs' whole row): quoting both says it twice."""
    bare = {i: key for i, c in enumerate(cands) if (key := bare_entry_key(c.unit.text))}
    rows: dict[str, list[tuple[int, str]]] = {}  # key -> (candidate, description), shortest first
    for i, c in enumerate(cands):
        if i not in bare and (m := _KEY_LEAD.match(c.unit.text)) and (core := _row_core(c.unit.text)):
            rows.setdefault(m.group(0).split("`")[1], []).append((i, core))
    if not bare and all(len(same) < 2 for same in rows.values()):
        return scores
    out = scores.astype(np.float64, copy=True)

    def give_way(i: int, j: int) -> None:
        out[j] = max(out[j], out[i])
        out[i] = -np.inf

    for i, key in bare.items():
        if key in rows:
            give_way(i, rows[key][0][0])
    for same in rows.values():
        same.sort(key=lambda t: len(t[1]))
        for n, (i, core) in enumerate(same):
            if (j := next((j for j, other in same[n + 1:] if len(other) > len(core) and _holds(other, core)), None)) is not None:
                give_way(i, j)
    return out


# a sentence that opens by pointing back at the one before it ("This ...", "However, ...", "In that case ...")
_LEANS_BACK = re.compile(r"^(?:This|These|That|Those|It|Its|They|Their|Such|However|Therefore|Thus|Hence|So|Also|In this case|"
                         r"In that case|In addition|Moreover|Otherwise|Then|Here|Both)\b")
_KEY_LEAD = re.compile(r"^`[^`]+`(?: \([^)]*\))?:\s*")
_DEFAULT_TAIL = re.compile(r"\s*\(default [^)]*\)\.?$")


@lru_cache(maxsize=65536)
def _plain(text: str) -> str:
    """Lower-case words and numbers only, one space apart."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def _holds(words: str, part: str) -> bool:
    """Whether `part` is whole words of `words` (both `_plain`)."""
    return f" {part} " in f" {words} "


def _said(units: list[str]) -> str:
    return " ".join(_plain(u) for u in units)


@lru_cache(maxsize=65536)
def _row_core(unit: str) -> str:
    """A unit's words without a leading `key` (and its type) and a closing default; "" under four words."""
    core = _plain(_DEFAULT_TAIL.sub("", _KEY_LEAD.sub("", unit)))
    return core if len(core.split()) >= 4 else ""


def _restates(unit: str, said: str) -> bool:
    """A key's row whose description, without its key and default, is word for word in what is said (`_said`:
    the units quoted so far as one text, in reading order), as the docs' row after the package's sentences on
    the same key, which add only its type."""
    core = _row_core(unit)
    return bool(core) and _holds(said, core)


def _overlap(a: str, b: str, both: bool = False) -> float:
    """The share of the shorter text's terms the other holds (`both`: of the longer one's, so that a short
    unit inside a long one is no repeat of it)."""
    ta, tb = term_set(a), term_set(b)
    return len(ta & tb) / max((max if both else min)(len(ta), len(tb)), 1)


def scored_candidates(ask: str, sources: list[Source], similarities: np.ndarray | None = None,
                      model: TreeModel | None = None, seen: Mapping[str, float] | None = None) -> tuple[list[Candidate], np.ndarray]:
    """The quotable units of the first passages and how well each answers: the learned unit scorer's
    probability (with the similarities), else the hand-weighted `unit_scores`. `similarities`: cosine of
    the question with each candidate unit (in `candidates(sources)` order) when the caller embedded them;
    `seen`: the question's `SearchResult.seen_units`."""
    cands = candidates(sources)
    if model is not None and similarities is not None:
        return cands, 1.0 / (1.0 + np.exp(-model.score(unit_features(ask, cands, similarities, seen))))
    return cands, unit_scores(ask, cands, similarities, semantic_weight=SEMANTIC_WEIGHT)


def answer_text(sources: list[Source], cands: list[Candidate], scores: np.ndarray, max_words: int | None = None,
                lead_from: int | None = None, said_before: str = "") -> str:
    """The composed answer from scored candidates (a caller trying several budgets scores once)."""
    if not sources:
        return NOT_COVERED
    if not cands:
        return f"See [{sources[0].n}]: {sources[0].title}."
    return compose(cands, scores, max_words, lead_from=lead_from, said_before=said_before)


def extractive_answer(ask: str, sources: list[Source], similarities: np.ndarray | None = None,
                      model: TreeModel | None = None, max_words: int | None = None) -> str:
    """The composed extractive answer (`scored_candidates`, then `answer_text`)."""
    return answer_text(sources, *scored_candidates(ask, sources, similarities, model), max_words)
