"""`dsqa runner serve`: the snippet runner as an HTTP service, for a GPU host.

POST /run with a bearer token (DSQA_RUNNER_TOKEN) and a `RunRequest` body returns a `RunResult`.
Only snippets whose hash (the index's snippet id of the same code) is in the host's index are run,
unless it was started with --allow-any. One job per GPU at a time (a semaphore sized by the GPU
count, 1 on CPU; each job sees its own GPU through CUDA_VISIBLE_DEVICES) and a bounded queue:
when `slots + queue` jobs are already in, the reply is 429.
"""

from __future__ import annotations

import asyncio
import hmac
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from eval.runner import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, LocalRunner, RunRequest
from indexer.documents import content_hash

MAX_CODE_CHARS = 100_000


class RunBody(BaseModel):
    kind: str = Field(pattern="^(ds_config|python|launcher|hostfile|shell|yaml|output|other)$")
    code: str = Field(min_length=1, max_length=MAX_CODE_CHARS)
    id: str = ""
    requires: list[str] = Field(default_factory=list, max_length=16)
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=3600)
    memory_mb: int = Field(default=DEFAULT_MEMORY_MB, ge=256, le=1_048_576)
    context: str = Field(default="", max_length=20_000, description="import lines from earlier on the page; only imports are used")


def _count(status: str) -> None:
    try:  # the service's Prometheus counter, when the app's metrics module is there
        from app.metrics import record_runner_result
    except ImportError:
        return
    record_runner_result(status)


def allowed_hashes(index_dir: Path | None) -> set[str]:
    if index_dir is None:
        return set()
    from indexer.store import load_index

    index = load_index(Path(index_dir), verify=False)
    return {content_hash(s.code, length=12) for s in index.snippets.values()}


def create_runner_app(
    *,
    token: str,
    allowed: set[str] | None,
    runner: LocalRunner | None = None,
    slots: int | None = None,
    queue_limit: int = 8,
    max_body_bytes: int = 1_000_000,
    max_timeout_s: float = 600.0,
    max_memory_mb: int = 16_384,
) -> FastAPI:
    """allowed=None means --allow-any; otherwise only these code hashes run. The token is checked
    before a byte of the body is read; a body over `max_body_bytes` is 413; a request's time and
    memory are capped by this host's limits (the result says so); the schema is behind the token."""
    if not token:
        raise ValueError("the runner service needs a token: set DSQA_RUNNER_TOKEN")
    local = runner or LocalRunner()
    caps = local.capabilities
    n_slots = slots or (caps.gpus if caps.cuda else 1)
    gpu_pool: list[int] = list(range(caps.gpus)) if caps.cuda else []
    state: dict[str, Any] = {"in": 0, "running": 0, "served": 0}
    app = FastAPI(title="dsqa snippet runner", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None)
    sem = asyncio.Semaphore(n_slots)

    def check_auth(request: Request) -> None:
        header = request.headers.get("authorization", "")
        given = header[7:] if header.lower().startswith("bearer ") else ""
        if not given or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "device": caps.label, "slots": n_slots, "running": state["running"],
                "queued": state["in"] - state["running"], "queue_limit": queue_limit, "allow_any": allowed is None}

    @app.get("/openapi.json", include_in_schema=False)
    async def schema(request: Request) -> dict[str, Any]:
        check_auth(request)
        return get_openapi(title=app.title, version=app.version, routes=app.routes)

    async def read_body(request: Request) -> RunBody:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise HTTPException(status_code=413, detail=f"body larger than {max_body_bytes} bytes")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > max_body_bytes:
                raise HTTPException(status_code=413, detail=f"body larger than {max_body_bytes} bytes")
        try:
            return RunBody.model_validate_json(bytes(raw))
        except ValidationError as exc:  # the reason, never the body echoed back
            errors = exc.errors()
            field = ".".join(str(p) for p in errors[0]["loc"]) if errors else "body"
            message = errors[0]["msg"] if errors else "invalid body"
            raise HTTPException(status_code=422, detail=f"{field or 'body'}: {message}") from None

    @app.post("/run", openapi_extra={"requestBody": {"content": {"application/json": {"schema": RunBody.model_json_schema()}}}})
    async def run(request: Request) -> dict[str, Any]:
        check_auth(request)
        body = await read_body(request)
        digest = content_hash(body.code, length=12)
        if allowed is not None and digest not in allowed:
            raise HTTPException(status_code=403, detail=f"snippet {digest} is not in this runner's index (start it with --allow-any to run any code)")
        if state["in"] >= n_slots + queue_limit:
            raise HTTPException(status_code=429, detail="runner queue is full, retry later", headers={"Retry-After": "2"})
        state["in"] += 1
        try:
            async with sem:
                state["running"] += 1
                gpu = gpu_pool.pop(0) if gpu_pool else None
                try:
                    req = RunRequest(kind=body.kind, code=body.code, id=body.id or digest, requires=tuple(body.requires),
                                     timeout_s=min(body.timeout_s, max_timeout_s), memory_mb=min(body.memory_mb, max_memory_mb),
                                     context=body.context)
                    result = await run_in_threadpool(local.run, req, gpu_ids=None if gpu is None else [gpu])
                finally:
                    if gpu is not None:
                        gpu_pool.append(gpu)
                    state["running"] -= 1
        finally:
            state["in"] -= 1
        state["served"] += 1
        _count(result.status)
        result.runner = "service"
        return result.to_json()

    return app
