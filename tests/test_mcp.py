"""The MCP server through the SDK's own client: streamable HTTP at /mcp on uvicorn, and stdio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from app.mcp_server import clip_words, passage_excerpt
from indexer.store import load_index
from tests.conftest import REPO, ServerThread
from tests.small_index import HASH_MODEL, build_small_index, small_app

TOOLS = {"ask", "search_docs", "get_config_option", "validate_config", "plan_config", "diagnose_error", "get_snippet"}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_index(tmp_path_factory)


@pytest.fixture(scope="module")
def http_server(index_dir: Path) -> Iterator[ServerThread]:
    with ServerThread(small_app(index_dir)) as server:
        yield server


def text_of(result: Any) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def calls(server: Any, *steps: tuple[str, dict[str, Any]]) -> tuple[set[str], list[Any]]:
    """Connect with the SDK client, list the tools, make the calls in order."""

    async def run() -> tuple[set[str], list[Any]]:
        async with Client(server) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            return names, [await client.call_tool(name, args) for name, args in steps]

    return anyio.run(run)


def test_http_transport_serves_all_tools(http_server: ServerThread, index_dir: Path) -> None:
    snippet_id = next(iter(load_index(index_dir).snippets))
    names, (answer, search, option, unknown, check, snippet, missing, blank) = calls(
        http_server.url + "/mcp",
        ("ask", {"question": "How do I configure ZeRO stage 2 overlap_comm?", "k": 3}),
        ("search_docs", {"query": "PipelineModule num_stages", "k": 3}),
        ("get_config_option", {"path": "zero_optimization.offload_param.device"}),
        ("get_config_option", {"path": "zero_optimization.offload_parm.device"}),
        ("validate_config", {"config": {"train_batch_size": 8, "fp16": {"enabld": True}}}),
        ("get_snippet", {"snippet_id": snippet_id}),
        ("get_snippet", {"snippet_id": "no-such-id"}),
        ("ask", {"question": "   "}),
    )
    assert names == TOOLS

    text = text_of(answer)
    assert not answer.is_error
    assert "[1]" in text and "**Sources**" in text
    assert "[1] [Tiny Tutorial](https://www.deepspeed.ai/tutorials/tiny/" in text
    assert "```json" in text and "**checked**: checked statically against deepspeed" in text  # a checked snippet, fenced
    assert len(text.split()) <= 1500 + 20

    text = text_of(search)
    assert not search.is_error and text.startswith("[1] [") and "> " in text

    text = text_of(option)
    assert not option.is_error
    assert "`zero_optimization.offload_param.device`" in text and "OffloadDeviceEnum" in text and "default 'none'" in text
    assert "Docs: https://www.deepspeed.ai/docs/config-json/#" in text

    assert unknown.is_error and "did you mean" in text_of(unknown) and "zero_optimization.offload_param.device" in text_of(unknown)

    text = text_of(check)
    assert not check.is_error and "**invalid**" in text and "`/fp16/enabld`" in text and "did you mean 'enabled'?" in text

    assert not snippet.is_error and f"`{snippet_id}`" in text_of(snippet) and "```" in text_of(snippet)
    assert missing.is_error and "Error: no snippet with id 'no-such-id'" in text_of(missing)
    assert blank.is_error and "question" in text_of(blank)


def test_validate_config_accepts_json_text(http_server: ServerThread) -> None:
    _, (ok, junk) = calls(
        http_server.url + "/mcp",
        ("validate_config", {"config": '{"train_batch_size": 8, "bf16": {"enabled": true}}'}),
        ("validate_config", {"config": "{nope"}),
    )
    assert not ok.is_error and text_of(ok).startswith("**valid**")
    assert junk.is_error and "body is not JSON" in text_of(junk) and "(field: config)" in text_of(junk)


def test_replies_keep_to_the_word_budget(index_dir: Path) -> None:
    with ServerThread(small_app(index_dir, mcp_max_words=40)) as server:
        _, (answer,) = calls(server.url + "/mcp", ("ask", {"question": "How do I configure ZeRO stage 2 overlap_comm?", "k": 5}))
    text = text_of(answer)
    assert "cut to 40 words" in text and len(text.split()) <= 40 + 20
    assert text.count("```") % 2 == 0


def test_clip_words_closes_an_open_code_fence() -> None:
    text = "intro words here\n```python\n" + "\n".join(f"x{i} = {i}" for i in range(50)) + "\n```\nafter"
    clipped = clip_words(text, 30)
    assert clipped.count("```") % 2 == 0 and "cut to 30 words" in clipped
    assert clip_words("short reply", 30) == "short reply"


def test_an_excerpt_names_a_neighbouring_section_in_bold() -> None:
    text = "Stage 2 partitions gradients.\n\n### Stage 3\n\nIt also partitions parameters."
    assert passage_excerpt(text) == "Stage 2 partitions gradients. **Stage 3:** It also partitions parameters."
    assert passage_excerpt("one two three", 2) == "one two …"


def test_tools_say_when_the_index_is_missing(tmp_path: Path) -> None:
    with ServerThread(small_app(tmp_path / "missing")) as server:
        _, (answer,) = calls(server.url + "/mcp", ("ask", {"question": "zero"}))
    assert answer.is_error and "no index at" in text_of(answer) and "dsqa index" in text_of(answer)


def test_stdio_transport_spawns_the_cli(index_dir: Path) -> None:
    env = dict(os.environ, DSQA_EMBEDDING_MODEL=HASH_MODEL, DSQA_NO_ANSWER_THRESHOLD="0", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1")
    params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--index", str(index_dir)], env=env, cwd=str(REPO))
    names, (answer, option) = calls(
        params,
        ("ask", {"question": "How do I launch deepspeed with --num_gpus?", "k": 3}),
        ("get_config_option", {"path": "/zero_optimization/stage"}),
    )
    assert names == TOOLS
    assert not answer.is_error and "**Sources**" in text_of(answer) and "https://www.deepspeed.ai/tutorials/tiny/" in text_of(answer)
    assert not option.is_error and "`zero_optimization.stage`" in text_of(option)


def test_stdio_answers_every_malformed_line_with_a_jsonrpc_error(index_dir: Path) -> None:
    env = dict(os.environ, DSQA_EMBEDDING_MODEL=HASH_MODEL, DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1")
    lines = b"not json\n" + b'[{"jsonrpc": "2.0", "id": 2, "method": "ping"}]\n' + b"\xff\xfe\n" + b'{"jsonrpc": "2.0", "id": 7}\n' + \
        b'{"jsonrpc": "2.0", "id": 1, "method": "nope"}\n'
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "mcp", "--index", str(index_dir)], env=env, cwd=str(REPO),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(lines)
    proc.stdin.flush()
    replies = [json.loads(proc.stdout.readline()) for _ in range(5)]
    proc.kill()
    proc.wait(timeout=10)
    codes = sorted((r["id"] if r["id"] is not None else 0, r["error"]["code"]) for r in replies)
    assert codes == [(0, -32700), (0, -32700), (0, -32600), (1, -32601), (7, -32600)]


def test_plan_config_tool_uses_the_planner(http_server: ServerThread) -> None:
    _, (good, bad) = calls(
        http_server.url + "/mcp",
        ("plan_config", {"params": 7e9, "gpus_per_node": 8, "gpu_mem_gb": 40, "gpu_kind": "a100"}),
        ("plan_config", {"params": 7e9, "gpus_per_node": 8, "gpu_mem_gb": 40, "micro_batch": 64, "global_batch": 32}),
    )
    assert not good.is_error and text_of(good).startswith("**Plan**: ZeRO stage 2") and '"zero_optimization"' in text_of(good)
    assert bad.is_error and "micro_batch" in text_of(bad)


def test_diagnose_error_tool_names_the_raising_line(http_server: ServerThread) -> None:
    _, (answer,) = calls(http_server.url + "/mcp", ("diagnose_error", {"log": "ValueError: Muon and reduce scatter cannot be used together"}))
    assert not answer.is_error and "(matched: exact)" in text_of(answer) and "deepspeed/runtime/zero/stage3.py" in text_of(answer)
