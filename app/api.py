"""The FastAPI service: POST /ask, health and readiness, and the front ends mounted on it (MCP at /mcp,
Slack, the web page, /metrics). Heavy parts load once, in the lifespan."""

from __future__ import annotations

import asyncio
import gc
import hmac
import json
import logging
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api_keys import ApiKeys, parse_keys
from app.ask import ask, ask_events
from app.background_verify import BackgroundVerify
from app.doctor import diagnose_with
from app.engine import Engine, load_engine
from app.errors import DsqaError, IndexNotReady, NotConfigured, to_reply
from app.input_policy import BodyLimit, parse_json
from app.mcp_mount import mount_mcp
from app.metrics import mount_metrics, set_index_chunks, set_verify_progress
from app.planner import PlanRequest, plan
from app.schemas import AskRequest, AskResponse, DiagnoseRequest
from app.settings import Settings, input_limits
from app.slack_bot import mount_slack
from app.web import mount_web
from indexer.config_check import validate_config

log = logging.getLogger(__name__)


def _field_of(error: dict[str, Any]) -> str:
    if error.get("type") == "json_invalid":
        return "body"
    loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path")]
    return ".".join(loc) or "body"


_ERROR_REPLIES: dict[int | str, dict[str, Any]] = {
    413: {"description": "body larger than the limit (DSQA_MAX_BODY_BYTES)"},
    422: {"description": "invalid input: {error: invalid_input, message, field}"},
    503: {"description": "index not loaded yet, or too many questions in flight (Retry-After)"},
}


_CONFIG_BODY: dict[str, Any] = {"requestBody": {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "description": "A DeepSpeed config (a JSON object; its JSON text as a string is accepted too); at most 64 levels deep"}}}}}
_VALIDATE_REPLIES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the validation result: {valid, errors, warnings}"},
    413: _ERROR_REPLIES[413],
    422: _ERROR_REPLIES[422],
}
_STREAM_REPLY: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {"schema": {"type": "object", "description":
          "with \"stream\": true: events passages, delta, fallback, answer (each `event: NAME` + `data: JSON`)"}}}},
}


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _freeze_loaded() -> None:
    """Keep the loaded engine out of the garbage collector's full collections: its index is ~150k
    long-lived objects that a full collection walked (~70 ms, a request's p99) though none is garbage.
    What an earlier freeze kept (a replaced engine) is collectable again first."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def create_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    # /ask runs in threads of its own, handed over with the event loop's executor call: anyio's
    # run_in_threadpool (cancel scope, capacity limiter) was a quarter of the loop's work per question.
    # At most max_inflight_asks run at once (more are shed with a 503 below), so as many threads.
    ask_threads = ThreadPoolExecutor(max_workers=max(min(settings.ask_threads, settings.max_inflight_asks), 1), thread_name_prefix="dsqa-ask")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if engine is None:
            app.state.engine = await run_in_threadpool(load_engine, settings)
        else:
            app.state.engine = engine
        await run_in_threadpool(app.state.engine.warm)  # before /readyz says ready: the first questions cost no more than later ones
        _freeze_loaded()
        set_index_chunks(len(app.state.engine.index.chunks) if app.state.engine.index is not None else 0)
        verifier = None
        if settings.verify_in_background and app.state.engine.index is not None:
            verifier = BackgroundVerify(app.state.engine.index.path, timeout_s=settings.verify_timeout_s)
            verifier.start()
        app.state.verifier = verifier
        try:
            yield
        finally:
            await app.state.mcp.aclose()  # the MCP transport's session manager, if a request started it
        if verifier is not None:
            verifier.stop()
        ask_threads.shutdown(wait=False, cancel_futures=True)
        if app.state.engine.llm is not None:
            app.state.engine.llm.close()

    app = FastAPI(
        title="dsqa",
        summary="Answers about DeepSpeed with cited passages and checked code snippets.",
        version="0.1.0",
        lifespan=lifespan,
    )

    @app.exception_handler(DsqaError)
    async def _dsqa_error(request: Request, exc: DsqaError) -> JSONResponse:
        reply = to_reply(exc)
        return JSONResponse(status_code=reply.status_code, content=reply.body)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and "parsing the body" in str(exc.detail):  # not UTF-8, or too deep for json
            return JSONResponse(status_code=422, content={"error": "invalid_input", "field": "body",
                                                          "message": f"body: not valid JSON (UTF-8, nested under {settings.max_json_depth} levels)"})
        return JSONResponse(status_code=exc.status_code, content={"detail": exc.detail}, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        field = _field_of(first)
        problems = [{"field": _field_of(e), "message": str(e.get("msg", ""))} for e in errors[:10]]
        message = f"{field}: {first.get('msg', 'invalid value')}"
        return JSONResponse(status_code=422, content={"error": "invalid_input", "message": message, "field": field, "details": problems})

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"])
    async def readyz(request: Request) -> JSONResponse:
        eng: Engine | None = getattr(request.app.state, "engine", None)
        if eng is None or eng.index is None:
            return JSONResponse(status_code=503, content={"status": "not ready", "reason": "index not loaded"})
        body: dict[str, Any] = {"status": "ready", "index": eng.index.summary()}
        verifier: BackgroundVerify | None = getattr(request.app.state, "verifier", None)
        if verifier is not None:
            body["verification"] = progress = verifier.progress()
            set_verify_progress(int(progress.get("done", 0)), int(progress.get("total", 0)))
        return JSONResponse(status_code=200, content=body)

    inflight = {"n": 0}

    @app.post("/ask", response_model=AskResponse, tags=["ask"], responses={**_ERROR_REPLIES, **_STREAM_REPLY})
    async def ask_route(body: AskRequest, request: Request) -> AskResponse | Response:
        if inflight["n"] >= settings.max_inflight_asks:  # shed load instead of queueing for seconds
            return JSONResponse(status_code=503, headers={"Retry-After": "1"},
                                content={"error": "overloaded", "message": f"more than {settings.max_inflight_asks} questions in flight; retry shortly"})
        if not body.stream:
            inflight["n"] += 1
            try:
                return await asyncio.get_running_loop().run_in_executor(ask_threads, ask, request.app.state.engine, body)
            finally:
                inflight["n"] -= 1
        events = ask_events(request.app.state.engine, body)
        first = await run_in_threadpool(next, events)  # retrieval errors (index not ready) answer as JSON

        def sse() -> Iterator[str]:
            yield _sse(*first)
            for event in events:
                yield _sse(*event)

        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/validate-config", tags=["config"], responses=_VALIDATE_REPLIES, openapi_extra=_CONFIG_BODY)
    async def validate_config_route(
        request: Request,
        world_size: Annotated[int, Query(ge=1, le=1_000_000, description="Data-parallel world size for the batch arithmetic.")] = 1,
    ) -> JSONResponse:
        raw = await request.body()
        limits = input_limits(settings)
        data = parse_json(raw, limits) if raw.strip() else None
        if isinstance(data, str):  # a config sent as a JSON string
            data = parse_json(data.encode("utf-8"), limits)
        result = await run_in_threadpool(validate_config, data, world_size)
        return JSONResponse(status_code=200, content=result.to_json())

    @app.post("/admin/reload", tags=["operations"], responses={401: {"description": "missing or wrong admin token"}})
    async def reload_index(request: Request) -> JSONResponse:
        """Load the index folder again (a rebuilt one) and swap it in; questions already running finish
        on the old one, none fails. Needs `Authorization: Bearer $DSQA_ADMIN_TOKEN`."""
        if not settings.admin_token:
            raise NotConfigured("set DSQA_ADMIN_TOKEN to enable /admin/reload")
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header.lower().startswith("bearer ") else ""
        if not given or not hmac.compare_digest(given.encode(), settings.admin_token.encode()):
            return JSONResponse(status_code=401, content={"error": "unauthorised", "message": "missing or wrong admin token"})
        if settings.workers > 1:  # a request reaches one worker: the others would keep the old index
            return JSONResponse(status_code=409, content={"error": "reload_needs_restart",
                                                          "message": f"{settings.workers} workers serve: restart the service to load a rebuilt index"})
        old: Engine = request.app.state.engine
        embedder = getattr(old.retriever, "embedder", None)  # the model stays loaded
        fresh = await run_in_threadpool(load_engine, settings, embedder)
        if fresh.index is None:  # a broken rebuild never replaces a working index
            return JSONResponse(status_code=409, content={"error": "index_unusable", "message": f"not reloaded: {fresh.problem}"})
        await run_in_threadpool(fresh.warm)
        request.app.state.engine = fresh
        _freeze_loaded()
        set_index_chunks(len(fresh.index.chunks))
        return JSONResponse(status_code=200, content={"status": "reloaded", "index": fresh.index.summary()})

    @app.post("/diagnose", tags=["config"], responses={413: _ERROR_REPLIES[413], 422: _ERROR_REPLIES[422]})
    async def diagnose_route(body: DiagnoseRequest, request: Request) -> JSONResponse:
        """Explain a DeepSpeed error: the message, the deepspeed lines that raise it and what they
        check, ranked, with docs passages (matched exact, nearest or by retrieval)."""
        eng: Engine | None = getattr(request.app.state, "engine", None)
        index_dir = eng.index.path if eng is not None and eng.index is not None else None
        notes = eng.settings.notes_dir if eng is not None else None
        result = await run_in_threadpool(diagnose_with, index_dir, eng.retriever if eng is not None else None, body.log, notes)
        return JSONResponse(status_code=200, content=result.to_json())

    @app.post("/plan", tags=["config"], responses={422: _ERROR_REPLIES[422]})
    async def plan_route(body: PlanRequest) -> JSONResponse:
        """A ds_config that fits the model on the hardware: every candidate's memory (DeepSpeed's
        estimators), the choice, the reasons with their docs links, and the validator's verdict."""
        result = await run_in_threadpool(plan, body)
        return JSONResponse(status_code=200, content=result.to_json())

    def current_engine() -> Engine:
        eng: Engine | None = getattr(app.state, "engine", None)
        if eng is None:
            raise IndexNotReady("the service is still starting; try again in a moment")
        return eng

    app.add_middleware(ApiKeys, keys=parse_keys(settings.api_keys), per_minute=settings.api_rate_per_minute)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    mount_metrics(app)
    app.state.mcp = mount_mcp(app, settings, current_engine)
    mount_slack(app, settings, current_engine)
    mount_web(app)
    return app


def app_from_env() -> FastAPI:
    """The app of one of several uvicorn worker processes (`dsqa serve --workers N`): settings from the
    environment the parent exported, the index loaded in this worker's lifespan."""
    from app.http_protocol import HeaderDeadlineProtocol

    settings = Settings()
    HeaderDeadlineProtocol.header_timeout_s = settings.header_timeout_s
    return create_app(settings)
