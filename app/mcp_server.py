"""The MCP server for AI coding assistants: the official `mcp` SDK v2 (`MCPServer`), thin over `ask`.

Tools: `ask`, `search_docs`, `get_config_option`, `validate_config`, `plan_config`, `diagnose_error`,
`get_snippet`. Replies are
compact Markdown with `[n]` citations and links, cut to a word budget (`Settings.mcp_max_words`).
Transports: stdio (`dsqa mcp --index DIR`, see `serve_stdio`) and streamable HTTP at `/mcp` in the
FastAPI app (`app/mcp_mount.py` builds it there on the first request to `/mcp`).
"""

# no `from __future__ import annotations`: the SDK reads the tool signatures to build their schemas

import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field, ValidationError

from app.ask import ask, best_snippets, snippet_out
from app.config_option import docs_root, find_option
from app.doctor import diagnose_with
from app.engine import Engine, load_engine
from app.errors import DsqaError, InvalidInput, NotFound, as_text
from app.input_policy import check_json, parse_json
from app.passages import PART_HEADING
from app.planner import PlanRequest, plan
from app.schemas import MAX_K, AskRequest, AskResponse, SnippetOut
from app.settings import Settings, input_limits
from indexer.config_check import validate_config as check_config

log = logging.getLogger(__name__)

EngineGetter = Callable[[], Engine]
INSTRUCTIONS = (
    "Answers about the DeepSpeed training library from its docs, API docstrings and config catalogue, "
    "with cited passages and statically checked code snippets. Use `ask` for a question, `search_docs` "
    "for passages only, `get_config_option` for one ds_config key, `validate_config` for a whole config, "
    "and `get_snippet` to fetch a snippet by the id that other replies show."
)
SNIPPET_LINES = 40


# ---- Markdown within a word budget -------------------------------------------------------------

def clip_words(text: str, max_words: int) -> str:
    """Cut at a line boundary once `max_words` words are reached; a code fence left open is closed."""
    if len(text.split()) <= max_words:
        return text
    kept: list[str] = []
    count = 0
    for line in text.splitlines():
        n = len(line.split())
        if count + n > max_words:
            break
        kept.append(line)
        count += n
    out = "\n".join(kept).rstrip()
    if out.count("```") % 2:
        out += "\n```"
    return out + f"\n\n_(cut to {max_words} words: ask with a smaller k, or fetch a snippet with `get_snippet`)_"


def _link_text(text: str) -> str:
    return text.replace("[", "(").replace("]", ")").replace("\n", " ").strip()


def _where(title: str, heading: str) -> str:
    return _link_text(f"{title} › {heading}" if heading and heading != title else title)


def _code_block(s: SnippetOut, max_lines: int = SNIPPET_LINES) -> str:
    lines = s.code.rstrip().splitlines()
    code = "\n".join(lines[:max_lines]) + (f"\n# ... {len(lines) - max_lines} more lines" if len(lines) > max_lines else "")
    fence = "````" if "```" in code else "```"
    return f"{fence}{s.language or ''}\n{code}\n{fence}"


def _snippet_md(s: SnippetOut, max_lines: int = SNIPPET_LINES) -> str:
    why = f" — {s.reason}" if s.reason and s.status not in ("ran", "checked") and s.reason not in s.stamp else ""
    return f"**Snippet `{s.id}`** ({s.kind}; **{s.label or s.status}**: {s.stamp}{why}) from <{s.source_url}>\n{_code_block(s, max_lines)}"


def _footer(resp: AskResponse) -> str:
    idx = resp.index or {}
    return f"_index: deepspeed {idx.get('deepspeed_version') or '?'}, docs {idx.get('docs_ref') or 'none'}_"


def render_answer(resp: AskResponse, max_words: int) -> str:
    parts = [resp.answer.strip()]
    if resp.passages:
        parts.append("**Sources**\n" + "\n".join(f"[{n}] [{_where(p.title, p.heading)}]({p.url})" for n, p in enumerate(resp.passages, 1)))
    for s in best_snippets(resp.snippets, 2):
        parts.append(_snippet_md(s))
    if len(resp.snippets) > 2:
        parts.append("More snippets: " + ", ".join(f"`{s.id}`" for s in resp.snippets[2:8]))
    parts.append(_footer(resp))
    return clip_words("\n\n".join(parts), max_words)


def passage_excerpt(text: str, words: int = 70) -> str:
    """The passage's first words on one line; a part from a neighbouring section ("### heading") named in bold."""
    tokens = PART_HEADING.sub(lambda m: f"**{m.group(1).strip()}:**", text).split()
    return " ".join(tokens[:words]) + (" …" if len(tokens) > words else "")


def render_passages(resp: AskResponse, max_words: int, snippet_ids: dict[str, tuple[str, ...]] | None = None) -> str:
    """Ranked passages with links and excerpts; `snippet_ids` (passage id -> ids) names their snippets."""
    if not resp.passages:
        return "No passages found."
    parts = []
    for n, p in enumerate(resp.passages, 1):
        ids = (snippet_ids or {}).get(p.id, ())
        more = f"\nsnippets: {', '.join(f'`{i}`' for i in ids)}" if ids else ""
        parts.append(f"[{n}] [{_where(p.title, p.heading)}]({p.url}) — {p.source}, score {p.score}\n> {passage_excerpt(p.text)}{more}")
    parts.append(_footer(resp))
    return clip_words("\n\n".join(parts), max_words)


def render_plan(result: dict[str, Any]) -> str:
    c = result["choice"]
    lines = [f"**{'Plan' if result['fits'] else 'Nothing fits; nearest'}**: ZeRO stage {c['stage']}, optimizer offload {c['offload_optimizer']}, "
             f"parameter offload {c['offload_param']}, {c['precision']}, {c.get('method', 'full')} fine-tuning", "", "| stage | optimizer | parameters | GB/GPU | CPU GB/node | fits |", "|---|---|---|---|---|---|"]
    lines += [f"| {x['stage']} | {x['offload_optimizer']} | {x['offload_param']} | {x['per_gpu_gb']} | {x['per_node_cpu_gb']} | {'yes' if x['fits'] else 'no'} |"
              for x in result["candidates"]]
    lines += ["", "**Why**"] + [f"- {r['text']}" + (f" (<{r['url']}>)" if r["url"] else "") for r in result["reasons"]]
    lines += ["", f"Validated: {'valid' if result['validated']['valid'] else 'invalid'}", "```json", json.dumps(result["config"], indent=2), "```"]
    return "\n".join(lines)


def render_validation(result: dict[str, Any], max_words: int) -> str:
    errors, warnings = result.get("errors", []), result.get("warnings", [])
    head = "**valid**" if result.get("valid") else "**invalid**"
    lines = [f"{head} — {len(errors)} error(s), {len(warnings)} warning(s)"]
    for label, items in (("error", errors), ("warning", warnings)):
        for f in items:
            hint = f" ({f['suggestion']})" if f.get("suggestion") else ""
            doc = f" [docs]({f['doc_url']})" if f.get("doc_url") else ""
            lines.append(f"- {label} `{f.get('pointer') or '/'}`: {f['message']}{hint}{doc}")
    return clip_words("\n".join(lines), max_words)


# ---- the tools ---------------------------------------------------------------------------------

@contextmanager
def _tool_errors() -> Iterator[None]:
    """dsqa's own errors reach the model as their text (`as_text`), flagged as tool errors."""
    try:
        yield
    except DsqaError as exc:
        raise ToolError(as_text(exc)) from exc
    except ValidationError as exc:
        problems = exc.errors()
        field = ".".join(str(p) for p in problems[0]["loc"]) if problems else None
        message = str(problems[0]["msg"]) if problems else "invalid input"
        raise ToolError(as_text(InvalidInput(message, field_name=field or None))) from exc


def build_mcp_server(get_engine: EngineGetter, settings: Settings, lifespan: Any = None) -> MCPServer:
    server: MCPServer = MCPServer("dsqa", instructions=INSTRUCTIONS, version="0.1.0", lifespan=lifespan, log_level="WARNING")
    budget = settings.mcp_max_words

    @server.tool(name="ask", structured_output=False)  # the Python name keeps the core's `ask` in view
    def ask_tool(
        question: Annotated[str, Field(description="The question about DeepSpeed, English or Chinese.")],
        k: Annotated[int, Field(ge=1, le=MAX_K, description="How many passages to cite.")] = 5,
        topic: Annotated[str | None, Field(description="Only passages of this topic, e.g. zero, pipeline, config, api.")] = None,
    ) -> str:
        """Answer a DeepSpeed question with [n] citations to the docs, and checked code snippets."""
        with _tool_errors():
            resp = ask(get_engine(), AskRequest(question=question, k=k, topic=topic))
            return render_answer(resp, budget)

    @server.tool(structured_output=False)
    def search_docs(
        query: Annotated[str, Field(description="What to look for in DeepSpeed's docs, API and config reference.")],
        k: Annotated[int, Field(ge=1, le=MAX_K, description="How many passages.")] = 8,
        topic: Annotated[str | None, Field(description="Only passages of this topic.")] = None,
        source: Annotated[str | None, Field(description="Only passages from docs, api, config or notes.")] = None,
    ) -> str:
        """Search DeepSpeed's docs: ranked passages with links and excerpts, no composed answer."""
        with _tool_errors():
            engine = get_engine()
            resp = ask(engine, AskRequest(question=query, k=k, topic=topic, source=source))
            index, _ = engine.require()
            ids = {p.id: index.chunks[index.by_id[p.id]].snippet_ids for p in resp.passages if p.id in index.by_id}
            return render_passages(resp, budget, ids)

    @server.tool(structured_output=False)
    def get_config_option(
        path: Annotated[str, Field(description="A ds_config key as a JSON path, e.g. zero_optimization.offload_param.device.")],
    ) -> str:
        """One DeepSpeed config key: type, default, meaning and docs link, from the installed deepspeed."""
        with _tool_errors():
            info = find_option(path, docs_root(settings))
            lines = [f"### `{info.path}` (deepspeed {info.deepspeed_version})", info.description]
            if info.children:
                lines.append("Keys under it: " + ", ".join(f"`{c}`" for c in info.children))
            lines.append(f"Docs: {info.doc_url}")
            return clip_words("\n\n".join(lines), budget)

    @server.tool(structured_output=False)
    def validate_config(
        config: Annotated[dict[str, Any] | str, Field(description="The DeepSpeed config: a JSON object or its JSON text.")],
        world_size: Annotated[int, Field(ge=1, le=1_000_000, description="Data-parallel world size for the batch arithmetic.")] = 1,
    ) -> str:
        """Check a DeepSpeed config against the installed deepspeed: unknown keys, types, removed keys, batch maths."""
        with _tool_errors():
            limits = input_limits(settings)
            if isinstance(config, str):
                data: Any = parse_json(config.encode("utf-8", "surrogatepass"), limits, field_name="config")
            else:
                check_json(config, limits, field_name="config")
                data = config
            return render_validation(check_config(data, world_size).to_json(), budget)

    @server.tool(structured_output=False)
    def plan_config(
        gpus_per_node: Annotated[int, Field(ge=1, le=64)],
        gpu_mem_gb: Annotated[float, Field(gt=0, le=1024, description="Memory of one GPU in GB.")],
        params: Annotated[float | None, Field(gt=1e6, le=1e13, description="Parameter count, e.g. 7e9 (or hf_config).")] = None,
        nodes: Annotated[int, Field(ge=1, le=4096)] = 1,
        gpu_kind: Annotated[str, Field(max_length=32, description="a100, h100, v100... (bf16 on Ampere and newer)")] = "",
        cpu_mem_gb: Annotated[float | None, Field(gt=0, description="CPU memory of one node in GB.")] = None,
        nvme: Annotated[str | None, Field(max_length=256, description="An NVMe path for ZeRO-Infinity offload.")] = None,
        seq_len: Annotated[int, Field(ge=16, le=1_048_576)] = 2048,
        micro_batch: Annotated[int | None, Field(ge=1, le=4096)] = None,
        global_batch: Annotated[int | None, Field(ge=1)] = None,
        lora_share: Annotated[float | None, Field(gt=0, le=0.5, description="LoRA: the trainable share, e.g. 0.01; none: full fine-tuning.")] = None,
        hf_config: Annotated[dict[str, Any] | None, Field(description="A Hugging Face model's config.json (its sizes; the count without params).")] = None,
    ) -> str:
        """A ds_config that fits a model on given GPUs: each ZeRO stage/offload candidate's memory
        (DeepSpeed's estimators), the choice, the reasons with docs links, validated."""
        with _tool_errors():
            try:
                request = PlanRequest(params=params, gpus_per_node=gpus_per_node, gpu_mem_gb=gpu_mem_gb, nodes=nodes, gpu_kind=gpu_kind,
                                      cpu_mem_gb=cpu_mem_gb, nvme=nvme, seq_len=seq_len, micro_batch=micro_batch, global_batch=global_batch,
                                      lora_share=lora_share, hf_config=hf_config)
            except ValidationError as exc:
                first = exc.errors()[0]
                raise InvalidInput(str(first.get("msg")), field_name=".".join(str(p) for p in first.get("loc", ())) or "input") from exc
            return clip_words(render_plan(plan(request).to_json()), budget)

    @server.tool(structured_output=False)
    def diagnose_error(
        log: Annotated[str, Field(min_length=1, max_length=1_000_000, description="A DeepSpeed log or traceback (its tail is read).")],
    ) -> str:
        """Explain a DeepSpeed error: the message, the deepspeed lines that raise it and what they check."""
        with _tool_errors():
            engine = get_engine()
            result = diagnose_with(engine.index.path if engine.index is not None else None, engine.retriever, log, engine.settings.notes_dir)
            lines = [f"**{result.error['type'] or 'Error'}**: {result.error['message'][:300]} (matched: {result.matched})"]
            for n, cause in enumerate(result.causes, 1):
                lines += [f"{n}. {cause.title}", f"   {cause.explanation}", f"   fix: {cause.fix}"] + ([f"   source: <{cause.source_url}>"] if cause.source_url else [])
            return clip_words("\n".join(lines), budget)

    @server.tool(structured_output=False)
    def get_snippet(
        snippet_id: Annotated[str, Field(description="A snippet id as shown by ask or search_docs.")],
    ) -> str:
        """One code snippet from the index by id, whole, with its source and static-check status."""
        with _tool_errors():
            index, _ = get_engine().require()
            snippet = index.snippets.get(snippet_id.strip().strip("`"))
            if snippet is None:
                raise NotFound(f"no snippet with id '{snippet_id}' in the index", field_name="snippet_id")
            return clip_words(_snippet_md(snippet_out(snippet), max_lines=400), budget)

    return server


# ---- transports --------------------------------------------------------------------------------

class LazyEngine:
    """Loads the index and model once, on first use (or a warm-up thread), for the stdio server."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._error: DsqaError | None = None

    def __call__(self) -> Engine:
        with self._lock:
            if self._engine is None and self._error is None:
                try:
                    self._engine = load_engine(self.settings)
                except DsqaError as exc:
                    self._error = exc
            if self._error is not None:
                raise self._error
            assert self._engine is not None
            return self._engine

    def warm(self) -> None:
        try:
            self()
        except DsqaError as exc:
            log.error("dsqa MCP: %s", as_text(exc))


def jsonrpc_problem(raw: bytes) -> dict[str, Any] | None:
    """The JSON-RPC error reply for a line the SDK would drop without a word (not UTF-8, not JSON,
    a batch array, not a request), or None when the line is a message to pass on."""
    def error(code: int, message: str, msg_id: Any = None) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return error(-32700, f"Parse error: the line is not UTF-8 (byte {exc.start})")
    try:
        message = json.loads(text)
    except ValueError as exc:
        return error(-32700, f"Parse error: {exc}")
    if isinstance(message, list):
        return error(-32600, "Invalid Request: batch arrays are not supported; send one message per line")
    if not isinstance(message, dict):
        return error(-32600, "Invalid Request: a message must be a JSON object")
    if "method" not in message and "result" not in message and "error" not in message:
        return error(-32600, "Invalid Request: no method", message.get("id"))
    return None


def guard_stdin() -> None:
    """Put a filter between the real stdin and the SDK: well-formed messages pass through a pipe
    that becomes fd 0; every other line gets its JSON-RPC error on the real stdout at once."""
    real_in, real_out = os.dup(0), os.dup(1)
    read_end, write_end = os.pipe()
    os.dup2(read_end, 0)
    os.close(read_end)

    def pump() -> None:
        with os.fdopen(real_in, "rb") as source, os.fdopen(write_end, "wb", buffering=0) as sink:
            for raw in source:
                if not raw.strip():
                    continue
                problem = jsonrpc_problem(raw.strip())
                if problem is None:
                    sink.write(raw if raw.endswith(b"\n") else raw + b"\n")
                else:
                    os.write(real_out, (json.dumps(problem) + "\n").encode())

    threading.Thread(target=pump, name="dsqa-mcp-stdin", daemon=True).start()


def serve_stdio(settings: Settings) -> None:
    """Serve MCP over stdin/stdout; the SDK points fd 1 at stderr meanwhile, so stray prints miss the wire."""
    guard_stdin()
    engine = LazyEngine(settings)

    @asynccontextmanager
    async def warm_up(_: MCPServer) -> AsyncIterator[None]:
        threading.Thread(target=engine.warm, name="dsqa-engine-load", daemon=True).start()
        yield None

    build_mcp_server(engine, settings, lifespan=warm_up).run("stdio")
