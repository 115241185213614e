"""The one `ask` core every front end calls: retrieve, compose the answer, attach snippets."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.answer import (
    ANSWER_DEPTH,
    ANSWER_WORDS,
    NOT_COVERED,
    Candidate,
    Source,
    answer_text,
    restated,
    scored_candidates,
)
from app.answer_keys import about_other_keys, config_line, keys_named
from app.answer_shapes import (
    ERROR_LINE,
    api_summary,
    asks_to_set,
    key_line,
    missing_sides,
    question_kind,
    setting_line,
    sides,
    snippet_line,
    status_line,
)
from app.coverage_overrides import (
    answered_anyway,
    api_line_first,
    asked_page_first,
    cited_failure_first,
    key_entry_first,
    pages_asked,
    raised_message_line,
    told_alone,
)
from app.engine import Engine
from app.errors import UpstreamFailed
from app.glossary import Glossary, has_cjk
from app.installed_mismatch import unaccepted_line, unknown_line, version_notes
from app.llm_client import Numbered, citation_problem, messages_for
from app.pasted_config import config_check_line, pasted_config
from app.query import QUESTION_WORDS_ZH, asks_only_what_key_is, split_question
from app.query_adapter import QueryAdapter
from app.retriever import SearchResult
from app.schemas import AskRequest, AskResponse, Passage, SnippetOut
from indexer.documents import Snippet
from indexer.snippet_status import CHECKED, LABELS, RAN, SHOW_ORDER, verdict
from indexer.store import LoadedIndex
from indexer.text_units import Unit, without_type_and_default

log = logging.getLogger(__name__)

LLM_PASSAGES = 5  # the passages a generated answer is given (and may cite)


def snippet_out(s: Snippet, run: dict[str, Any] | None = None) -> SnippetOut:
    """A snippet as every front end shows it: the one status vocabulary and words saying what was
    done to it (`indexer/snippet_status.verdict`)."""
    shown = verdict(s.status, s.reason, s.checked_with, run)
    return SnippetOut(
        id=s.id, language=s.language, kind=s.kind, code=s.code, source_url=s.source_url,
        status=shown.status, label=LABELS[shown.status], reason=s.reason, stamp=shown.words,
        requires=list(s.requires), chunk_id=s.chunk_id,
    )


def best_snippets(snippets: list[SnippetOut], n: int) -> list[SnippetOut]:
    """The n snippets most worth showing: ran, then checked, then the rest, in retrieval order."""
    return sorted(snippets, key=lambda s: SHOW_ORDER.get(s.status, 3))[:n]


def terms_line(glossary: Glossary, question: str, limit: int = 4) -> str:
    """For a Chinese question: the glossary terms it used and the English the docs use for them."""
    matched = [zh for zh in dict.fromkeys(glossary.matches(question)) if zh not in QUESTION_WORDS_ZH]  # a term asked twice is named once
    technical = [zh for zh in matched if len(zh) >= 3 or "_" in glossary.terms[zh]]  # not 参数, 版本, 打印...
    pairs = [f"{zh} → {glossary.terms[zh]}" for zh in (technical or matched[:2])[:limit]]
    return f"术语：{'；'.join(pairs)}\n" if pairs else ""


def source_units(index: LoadedIndex, result: SearchResult) -> tuple[list[Source], np.ndarray | None]:
    """The numbered sources of an answer, each with its text units as indexed, and the stacked vectors
    of every unit of the first ANSWER_DEPTH sources (None without unit vectors)."""
    sources: list[Source] = []
    vectors: list[np.ndarray] = []
    usable = result.query_vector is not None and index.unit_vectors is not None
    for n, hit in enumerate(result.hits, 1):
        units: list[Unit] = []
        for j in hit.span or (index.by_id.get(hit.chunk.id, -1),):
            if j < 0:
                continue
            offset = units[-1].block + 1 if units else 0  # a chunk's blocks never read on into the next
            chunk_units, chunk_vectors = index.chunk_units(j)
            units += [Unit(u.text, u.block + offset) for u in chunk_units]
            if n <= ANSWER_DEPTH and usable and chunk_vectors is not None:
                vectors.append(chunk_vectors)
        sources.append(Source(n=n, title=hit.chunk.title, heading=hit.chunk.heading, text=hit.chunk.text, units=tuple(units), score=hit.score))
    stacked = np.concatenate(vectors) if usable and vectors else None
    return sources, stacked


def answer_sources(index: LoadedIndex, result: SearchResult, adapter: QueryAdapter | None = None) -> tuple[list[Source], np.ndarray | None]:
    """The numbered sources of an answer and the cosine of the question with every unit of the first
    ANSWER_DEPTH sources (None without unit vectors); `adapter`: the answer's unit adapter, which moves
    the searched vector toward the units that answer."""
    sources, vectors = source_units(index, result)
    if vectors is None or result.query_vector is None:
        return sources, None
    query = result.query_vector if adapter is None else adapter.apply(result.query_vector)
    return sources, vectors @ query


@dataclass
class Prepared:
    """Everything of a reply but its final answer text: retrieval, passages, snippets, the draft."""

    result: SearchResult
    covered: bool
    passages: list[Passage]
    snippets: list[SnippetOut]
    sources: list[Source]
    draft: str  # the extractive answer (or NOT_COVERED): shown as is, or the generated answer's start
    started: float
    retrieved: float


def prepare(engine: Engine, request: AskRequest) -> Prepared:
    index, retriever = engine.require()
    settings = engine.settings
    index.refresh_verification()  # runs land while the service serves (background verify)
    t0 = time.perf_counter()
    searched = retriever.search(request.question, request.k, topic=request.topic, source=request.source)
    named = pages_asked(engine, request.question)
    result, named_first = asked_page_first(engine, searched, named, topic=request.topic, source=request.source)
    t1 = time.perf_counter()
    decided = result.covered if result.covered is not None else result.relevance >= settings.no_answer_threshold
    asked = keys_named(request.question, engine.config_facts)
    defined = asked if asks_only_what_key_is(request.question, asked) else []  # keys asked for nothing but what they are
    if defined and not named_first:
        result, named_first = key_entry_first(engine, result, defined, topic=request.topic, source=request.source)
    api_line = ""  # what an API function returns or takes (before what it is): its section first, the line the lead
    if not defined and not (named_first and not named.api):
        result, api_line = api_line_first(engine, result, request.question, topic=request.topic, source=request.source)
        named_first = named_first or bool(api_line)
    decided = decided or bool(api_line)
    if decided:  # a pasted message the installed deepspeed raises word for word: its raising line leads, covered or not
        raised = raised_message_line(engine, request.question, asked, pasted_only=True)
    else:
        rule, raised = answered_anyway(engine, request.question, result, asked, defined, named)
        decided = rule is not None
    pasted = pasted_config(request.question, engine.config_top_keys)
    version = str(index.manifest.get("deepspeed_version") or "")
    checked = config_check_line(pasted, request.question, version) if pasted else ""
    decided = decided or bool(checked and pasted and pasted.whole)  # the validator's word on a whole config answers
    alone = bool(raised) and told_alone(request.question, raised)  # a known failure's why and fix: the whole answer
    if alone:
        result = cited_failure_first(engine, result, raised, topic=request.topic, source=request.source)
    covered = bool(result.hits) and decided
    passages = [
        Passage(
            id=h.chunk.id, text=h.chunk.text, path=h.chunk.path, url=h.chunk.url, title=h.chunk.title,
            heading=h.chunk.heading, score=round(h.score, 4), source=h.chunk.source,
        )
        for h in result.hits
    ]
    snippets: list[SnippetOut] = []
    for h in result.hits:
        for sid in h.chunk.snippet_ids:
            s = index.snippets.get(sid)
            if s is None:
                continue
            shown = snippet_out(s, index.verification.get(sid))
            if not request.checked_only or shown.status in (RAN, CHECKED):
                snippets.append(shown)
    sources: list[Source] = []
    # an argument the installed function does not take is the answer's first fact, covered or not
    unaccepted = unaccepted_line(result.unaccepted_arguments, version)
    if not covered:  # (a block's findings only: `unknown_line` names a key nothing indexed has)
        draft = unknown_line(result.unknown_settings, engine.config_facts) + unaccepted + NOT_COVERED
    else:
        sources, similarities = answer_sources(index, result, engine.unit_adapter)
        ask_text = split_question(result.query).ask
        terms = terms_line(engine.glossary, request.question) if engine.glossary is not None and has_cjk(request.question) else ""
        terms = checked + unaccepted + terms + raised  # a raised message's line leads, after the Chinese terms
        cands, scores = scored_candidates(ask_text, sources, similarities, engine.unit_model, result.seen_units)
        if defined and len(cands):  # asked only what a key is: other keys' entries are not quoted
            scores = np.where(about_other_keys(cands, defined, asks_to_set(request.question)), -np.inf, scores)
        if alone:
            draft = terms + ERROR_LINE  # the known failure's why and fix, and where the whole log goes
        else:
            summary = api_line or (api_summary(sources[0]) if named_first and named.api and result.hits[0].chunk.path in named.api else "")
            draft = terms + shaped_answer(engine, request, result, sources, cands, scores, snippets, ANSWER_WORDS - len(terms.split()), defined,
                                          1 if named_first or _entry_first(result, defined) else None, summary)
    return Prepared(result, covered, passages, snippets, sources, draft, t0, t1)


def _entry_first(result: SearchResult, defined: list[str]) -> bool:
    """A question that asks only what config keys are, whose first passage is the catalogue's: the lead comes from
    it (the docs' table row on the key, with its short name, once outscored the catalogue's entry)."""
    return bool(defined and result.hits and result.hits[0].chunk.source == "config")


def shaped_answer(engine: Engine, request: AskRequest, result: SearchResult, sources: list[Source], cands: list[Candidate],
                  scores: np.ndarray, snippets: list[SnippetOut], budget: int, defined: list[str], lead_from: int | None = None,
                  summary: str = "") -> str:
    """The composed units in the shape of the question's kind (`app/answer_shapes.py`), with the Config
    line of the keys involved; everything within `budget` words. `defined`: the keys of a question that
    asks only what they are (their catalogue description leads); `lead_from`: the source the lead comes from;
    `summary`: for one that asks only what an API symbol is, its docstring's first sentence (`api_summary`), which leads."""
    facts = engine.config_facts
    named = keys_named(result.query, facts)
    kind = question_kind(request.question, named)
    first = {sid for h in result.hits[:ANSWER_DEPTH] for sid in h.chunk.snippet_ids}
    tail = snippet_line(snippets, first) if kind == "howto" else ERROR_LINE if kind == "error" else ""
    head = ""
    if kind == "version":  # the installed deepspeed's word first, unless the quoted units say it already
        said = answer_text(sources, cands, scores, budget - len(tail.split()), lead_from)
        head = status_line(result.query, named, engine.config_status, said)
    elif defined:
        head = key_line(defined, engine.config_docs)  # what the key does, in the catalogue's words, first
    elif summary:
        head = summary  # what the symbol is, in its docstring's words, first
    room = budget - len(head.split()) - len(tail.split())
    body = answer_text(sources, cands, scores, room, lead_from)
    before = ""  # what the head says, which the quoted units then leave out
    if head and kind != "version":
        if restated(head.split(": ", 1)[-1], body) and not summary:
            head = ""  # the quoted units say it already, with their citation
        else:
            before = head
            body = answer_text(sources, cands, scores, room, lead_from, before)
            if defined:  # said before the quoted units: cited with the passage that says it
                head = key_line(defined, engine.config_docs, sources=sources)
            elif summary and lead_from:
                head = f"{summary} [{lead_from}]"
    extra = missing_sides(body, cands, scores, sides(result.query)) if kind == "compare" else []
    if extra:  # the other side of a comparison joins: the units before it make room
        body = answer_text(sources, cands, scores, room - sum(len(c.unit.text.split()) for c in extra), lead_from, before)
        body += "".join(f" {c.unit.text} [{c.source.n}]" for c in extra)
    keys = config_line(result.query, "" if summary else f"{before} {body}", facts, sure=defined)
    if keys:  # the whole answer keeps to the budget: the quoted units make room for the Config line
        body = answer_text(sources, cands, scores, room - len(keys.split()) - sum(len(c.unit.text.split()) for c in extra), lead_from,
                           before)
        body += "".join(f" {c.unit.text} [{c.source.n}]" for c in extra)
        keys = config_line(result.query, "" if summary else f"{before} {body}", facts, sure=defined)
    for key in named if keys else []:  # the Config line gives the asked keys' type and default
        if f"`{key}` (" in keys:
            body = without_type_and_default(body, key)
    parts = [keys, head, body] if kind == "config" and keys else [head, body, keys]
    parts.append(setting_line(request.question, defined, facts) if defined else "")  # where the keys go in the config
    return "\n".join(p for p in [*parts, tail] if p)


def finish(engine: Engine, request: AskRequest, prepared: Prepared, answer: str) -> AskResponse:
    if prepared.covered:
        answer += version_notes(engine.stale_pages, prepared.result.hits, answer, request.question)
    t0, t1, t2 = prepared.started, prepared.retrieved, time.perf_counter()
    return AskResponse(
        answer=answer,
        covered=prepared.covered,
        passages=prepared.passages,
        snippets=prepared.snippets,
        index=engine.index.summary() if engine.index is not None else {},
        timings_ms={"retrieve": round((t1 - t0) * 1000, 1), "answer": round((t2 - t1) * 1000, 1), "total": round((t2 - t0) * 1000, 1)},
        query=prepared.result.query,
    )


def _llm_messages(request: AskRequest, prepared: Prepared) -> list[dict[str, str]]:
    shown = [Numbered(s.n, s.title, s.heading, s.text) for s in prepared.sources[:LLM_PASSAGES]]
    return messages_for(request.question, prepared.draft, shown)


def _checked(text: str, prepared: Prepared) -> str:
    """The generated text when its citations hold, else '' (and the reason logged)."""
    problem = citation_problem(text, [s.n for s in prepared.sources[:LLM_PASSAGES]])
    if problem:
        log.warning("generated answer not used: %s", problem)
        return ""
    return text


def ask(engine: Engine, request: AskRequest) -> AskResponse:
    """One reply: the extractive answer, or the generated one when an endpoint is configured and its
    reply cites only the passages it was given."""
    prepared = prepare(engine, request)
    answer = ""
    if prepared.covered and engine.llm is not None:
        try:
            answer = _checked(engine.llm.complete(_llm_messages(request, prepared)), prepared)
        except UpstreamFailed as exc:
            log.warning("%s; answering extractively", exc)
    return finish(engine, request, prepared, answer or prepared.draft)


def ask_events(engine: Engine, request: AskRequest) -> Iterator[tuple[str, dict[str, Any]]]:
    """The same reply as a sequence of events for streaming: `passages` first (passages, snippets,
    covered), then `delta` pieces of a generated answer as they arrive, `fallback` when it cannot be
    used (the extractive answer replaces it), and last `answer`, the whole AskResponse."""
    prepared = prepare(engine, request)
    yield "passages", {
        "covered": prepared.covered,
        "passages": [p.model_dump() for p in prepared.passages],
        "snippets": [s.model_dump() for s in prepared.snippets],
        "query": prepared.result.query,
    }
    answer = ""
    if prepared.covered and engine.llm is not None:
        parts: list[str] = []
        problem = ""
        try:
            for delta in engine.llm.stream(_llm_messages(request, prepared)):
                parts.append(delta)
                yield "delta", {"text": delta}
        except UpstreamFailed as exc:
            problem = str(exc)
        answer = "" if problem else _checked("".join(parts).strip(), prepared)
        if not answer:
            yield "fallback", {"reason": problem or "the generated answer's citations did not check out", "answer": prepared.draft}
    yield "answer", finish(engine, request, prepared, answer or prepared.draft).model_dump()
