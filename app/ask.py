"""The one `ask` core every front end calls: retrieve, compose the answer, attach snippets."""

from __future__ import annotations

import logging
import time
from typing import Any

from app.answer import NOT_COVERED, Source, extractive_answer, generated_answer
from app.engine import Engine
from app.retriever import Hit
from app.schemas import AskRequest, AskResponse, Passage, SnippetOut
from indexer.documents import Snippet

log = logging.getLogger(__name__)


def run_stamp(run: dict[str, Any]) -> str:
    """A ledger row (`dsqa verify`) as words: 'ran ok on cpu, deepspeed 0.19.8, 2026-12-01'."""
    device = str(run.get("device") or "?").split(" (")[0]
    where = f"on {device}, deepspeed {run.get('deepspeed') or '?'}, {str(run.get('time') or '')[:10]}".rstrip(", ")
    status = run.get("status")
    if status == "passed":
        return f"ran ok {where}"
    if status == "skipped":
        return f"not run {where}: {run.get('reason', '')}"[:200]
    return f"run {status} {where}: {run.get('reason', '')}"[:200]


def stamp(snippet: Snippet, run: dict[str, Any] | None = None) -> str:
    if run and run.get("status") in ("passed", "failed", "timeout", "killed"):
        return run_stamp(run)
    if snippet.status == "ok" and snippet.checked_with:
        return f"checked ok against deepspeed {snippet.checked_with}"
    if snippet.status in {"failed", "fragment", "not_checkable"} and snippet.checked_with:
        return f"{snippet.status} against deepspeed {snippet.checked_with}"
    return "not checked"


def snippet_out(s: Snippet, run: dict[str, Any] | None = None) -> SnippetOut:
    return SnippetOut(
        id=s.id, language=s.language, kind=s.kind, code=s.code, source_url=s.source_url,
        status=s.status, reason=s.reason, stamp=stamp(s, run), requires=list(s.requires), chunk_id=s.chunk_id,
    )


def best_snippets(snippets: list[SnippetOut], n: int) -> list[SnippetOut]:
    """The n snippets most worth showing: checked ones first, then in retrieval order."""
    order = {"ok": 0, "passed": 0, "fragment": 1, "not_checkable": 2, "unchecked": 2, "failed": 3}
    return sorted(snippets, key=lambda s: order.get(s.status, 2))[:n]



def version_notes(stale: dict[str, Snippet], hits: list[Hit]) -> str:
    """Warn when a cited page shows code that the installed deepspeed no longer accepts."""
    notes: list[str] = []
    seen: set[str] = set()
    for n, hit in enumerate(hits, 1):
        bad = stale.get(hit.chunk.path)
        if bad is not None and hit.chunk.path not in seen:
            seen.add(hit.chunk.path)
            notes.append(f"Note: code on the page of [{n}] does not work with the installed deepspeed {bad.checked_with}: {bad.reason}")
    return ("\n\n" + "\n".join(notes)) if notes else ""


def ask(engine: Engine, request: AskRequest) -> AskResponse:
    index, retriever = engine.require()
    settings = engine.settings
    t0 = time.perf_counter()
    result = retriever.search(request.question, request.k, topic=request.topic, source=request.source)
    t1 = time.perf_counter()
    decided = result.covered if result.covered is not None else result.relevance >= settings.no_answer_threshold
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
            if s is None or (request.checked_only and s.status != "ok"):
                continue
            snippets.append(snippet_out(s, index.verification.get(sid)))
    sources = [Source(n=i + 1, title=p.title, heading=p.heading, text=p.text) for i, p in enumerate(passages)]
    if not covered:
        answer = NOT_COVERED
    else:
        answer = ""
        if settings.llm_url:
            try:
                answer = generated_answer(
                    request.question, sources[:5], url=settings.llm_url, model=settings.llm_model,
                    api_key=settings.llm_api_key, timeout_s=settings.llm_timeout_s,
                )
            except Exception as exc:  # noqa: BLE001 - any endpoint failure falls back to extractive
                log.warning("LLM endpoint failed, answering extractively: %s", exc)
        if not answer:
            answer = extractive_answer(result.query, sources)
    if covered:
        answer += version_notes(engine.stale_pages, result.hits)
    t2 = time.perf_counter()
    return AskResponse(
        answer=answer,
        covered=covered,
        passages=passages,
        snippets=snippets,
        index=index.summary(),
        timings_ms={"retrieve": round((t1 - t0) * 1000, 1), "answer": round((t2 - t1) * 1000, 1), "total": round((t2 - t0) * 1000, 1)},
        query=result.query,
    )
