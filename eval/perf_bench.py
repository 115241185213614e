"""`dsqa bench`: the service's performance in one run on this machine, as ratios to peers measured in
the same run.

What is measured (each a subprocess or real HTTP, nothing simulated):
- index build from nothing (a fresh vector cache) and after one docs file changed (the cache kept),
  each with its wall time and peak RSS;
- `/ask` over real HTTP (a `dsqa serve` subprocess on loopback): p50/p99 at one client, req/s, p99
  and errors at 8, 16 and 32 clients, with one worker and with two; the server's peak RSS;
- cold start: `dsqa ask` from a shell to its printed answer, and `dsqa mcp` over stdio from spawn to
  the first `ask` tool answer;
- peers: the bare sentence-transformers encode of the same questions (the baseline every latency is
  divided by) and a LlamaIndex `VectorStoreIndex` over the same docs with the same model and its own
  defaults (when llama-index-core is installed; `pip install -e '.[bench]'`).

`--quick` skips the build from nothing and LlamaIndex, serves one worker only and measures each
concurrency level for 2 s: a shape check in minutes, not figures to quote.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
COLD_QUESTION = "How do I offload optimizer states to NVMe?"
CLIENT_LEVELS = (8, 16, 32)


@dataclass(frozen=True)
class BenchOptions:
    index: Path
    docs: Path | None  # the docs for the build rows (None: no build rows)
    cache: Path  # the vector cache the "one file changed" rebuild starts from
    quick: bool = False
    seconds: float = 15.0  # per concurrency level
    port: int = 8765
    workers: tuple[int, ...] = (1, 2)


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "DSQA_LOG_JSON": "false", **extra}


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else 0.0


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM) in MB; 0 when it is gone or /proc is not there."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_rss_mb(pid: int) -> float:
    """Peak RSS of a process plus the current peaks of its children (uvicorn workers)."""
    total = peak_rss_mb(pid)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return total + sum(peak_rss_mb(int(c)) for c in children)


def run_watched(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Run a command to its end: (wall seconds, peak RSS MB read while it ran, exit code)."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, peak_rss_mb(proc.pid))
        time.sleep(0.05)
    if proc.returncode:
        err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
        raise RuntimeError(f"{' '.join(argv[2:])} exited {proc.returncode}: {err}")
    return time.perf_counter() - t, peak, proc.returncode


def index_argv(docs: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "app.cli", "index", "--docs", str(docs), "--out", str(out), "--quiet"]


def build_rows(opts: BenchOptions, work: Path) -> dict[str, Any]:
    """Index builds on a private copy of the docs: from nothing (an empty cache) unless quick, then
    after one file changed with the vector cache of the first build (or of `opts.cache`)."""
    assert opts.docs is not None
    docs = work / "docs"
    shutil.copytree(opts.docs, docs)
    cache = work / "cache"
    rows: dict[str, Any] = {}
    if opts.quick:
        if opts.cache.is_dir():
            shutil.copytree(opts.cache, cache, ignore=shutil.ignore_patterns("torch_extensions"))
        run_watched(index_argv(docs, work / "index"), child_env(DSQA_CACHE_DIR=str(cache)))  # warm: nothing changed yet
    else:
        wall, rss, _ = run_watched(index_argv(docs, work / "index"), child_env(DSQA_CACHE_DIR=str(cache)))
        rows["build_from_nothing"] = {"s": round(wall, 1), "peak_rss_mb": round(rss)}
    pages = sorted(docs.rglob("*.md"), key=lambda p: ("_tutorials" not in p.parts, str(p)))  # a tutorial page first
    changed = next(p for p in pages if p.stat().st_size > 2000)
    with changed.open("a", encoding="utf-8") as fh:
        fh.write("\n\n## Bench section\n\nA paragraph the benchmark added so this file's chunks change.\n")
    wall, rss, _ = run_watched(index_argv(docs, work / "index"), child_env(DSQA_CACHE_DIR=str(cache)))
    rows["build_one_file_changed"] = {"s": round(wall, 1), "peak_rss_mb": round(rss), "file": str(changed.relative_to(docs))}
    return rows


def encode_ms(embed: Callable[[list[str]], Any], questions: list[str]) -> dict[str, float]:
    """p50/p99 of encoding one question at a time, after a warm-up."""
    embed(questions[:3])
    times = []
    for q in questions:
        t = time.perf_counter()
        embed([q])
        times.append((time.perf_counter() - t) * 1000)
    return {"p50": statistics.median(times), "p99": pct(times, 99)}


def bare_encode_ms(questions: list[str]) -> dict[str, float]:
    from indexer.embedder import SentenceTransformerEmbedder

    return encode_ms(SentenceTransformerEmbedder().embed, questions)


def llama_index_ms(docs: Path, questions: list[str]) -> dict[str, Any]:
    """A LlamaIndex VectorStoreIndex over the docs' Markdown with the same MiniLM and its defaults
    (SentenceSplitter, in-memory store, top-2): build seconds and p50/p99 of one retrieval."""
    try:
        from llama_index.core import Document, Settings, VectorStoreIndex
        from llama_index.core.embeddings import BaseEmbedding
    except ImportError:
        return {"skipped": "llama-index-core is not installed (pip install -e '.[bench]')"}
    from indexer.embedder import SentenceTransformerEmbedder

    model = SentenceTransformerEmbedder()

    class MiniLM(BaseEmbedding):  # type: ignore[misc]  # the same model, through LlamaIndex's interface
        def _get_query_embedding(self, query: str) -> list[float]:
            return [float(v) for v in model.embed([query])[0]]

        def _get_text_embedding(self, text: str) -> list[float]:
            return self._get_query_embedding(text)

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            return [[float(v) for v in row] for row in model.embed(texts)]

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

    Settings.embed_model = MiniLM()
    files = sorted(p for p in docs.rglob("*.md") if p.is_file())
    documents = [Document(text=p.read_text(encoding="utf-8", errors="replace"), metadata={"path": str(p)}) for p in files]
    t = time.perf_counter()
    retriever = VectorStoreIndex.from_documents(documents).as_retriever()
    build = time.perf_counter() - t
    return {"build_s": round(build, 1), **encode_ms(lambda qs: [retriever.retrieve(q) for q in qs], questions)}


def serve(index: Path, port: int, workers: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "app.cli", "serve", "--index", str(index), "--port", str(port), "--workers", str(workers)]
    # the query-vector cache off: the bench's questions repeat, and every request must pay its encode
    proc = subprocess.Popen(argv, env=child_env(DSQA_QUERY_CACHE_SIZE="0"), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("dsqa serve did not become ready within 180 s")


def one_client(url: str, questions: list[str], rounds: int) -> dict[str, float]:
    with httpx.Client(timeout=30) as http:
        for q in questions[:5]:
            http.post(url, json={"question": q})
        times = []
        for q in questions * rounds:
            t = time.perf_counter()
            http.post(url, json={"question": q}).raise_for_status()
            times.append((time.perf_counter() - t) * 1000)
    return {"p50": statistics.median(times), "p99": pct(times, 99)}


def many_clients(url: str, questions: list[str], clients: int, seconds: float) -> dict[str, float]:
    """`clients` threads asking in a loop for `seconds`, each at least once. The window opens when every
    client is built: building 32 httpx clients on a loaded machine once took longer than a 1 s window,
    and the row read 0 req/s with no request sent."""
    times: list[float] = []
    errors = [0]
    window: dict[str, float] = {}

    def open_window() -> None:
        window["start"] = time.monotonic()
        window["stop"] = window["start"] + seconds

    ready = threading.Barrier(clients, action=open_window)

    def worker(offset: int) -> None:
        with httpx.Client(timeout=30) as http:
            ready.wait()
            i = offset
            while True:
                t = time.perf_counter()
                try:
                    ok = http.post(url, json={"question": questions[i % len(questions)]}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                times.append((time.perf_counter() - t) * 1000)
                errors[0] += not ok
                i += 1
                if time.monotonic() >= window["stop"]:
                    break

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {"req_s": len(times) / (time.monotonic() - window["start"]), "p99": pct(times, 99), "errors": errors[0]}


def http_rows(opts: BenchOptions, questions: list[str]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for workers in (opts.workers[:1] if opts.quick else opts.workers):
        proc = serve(opts.index, opts.port, workers)
        tag = "1_worker" if workers == 1 else f"{workers}_workers"
        try:
            url = f"http://127.0.0.1:{opts.port}/ask"
            if "ask_1_client_ms" not in rows:  # on the first server started (one worker unless --workers says otherwise)
                rows["ask_1_client_ms"] = one_client(url, questions, 1 if opts.quick else 3)
            for n in CLIENT_LEVELS:
                rows[f"ask_{n}_clients_{tag}"] = many_clients(url, questions, n, opts.seconds)
            rows[f"server_peak_rss_mb_{tag}"] = round(tree_rss_mb(proc.pid))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return rows


def cold_ask_s(index: Path) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "app.cli", "ask", COLD_QUESTION], env=child_env(DSQA_INDEX_DIR=str(index)),
                   cwd=REPO, capture_output=True, check=True, timeout=120)
    return time.perf_counter() - t


def first_mcp_answer_s(index: Path) -> float:
    """From spawning `dsqa mcp` to the first `ask` tool answer on its stdout (JSON-RPC over stdio)."""
    calls = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "dsqa-bench", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "ask", "arguments": {"question": COLD_QUESTION}}},
    ]
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "mcp", "--index", str(index)], env=child_env(), cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"".join(json.dumps(c).encode() + b"\n" for c in calls))
        proc.stdin.flush()
        for line in proc.stdout:
            reply = json.loads(line)
            if reply.get("id") == 2:
                if "error" in reply or reply.get("result", {}).get("isError"):
                    raise RuntimeError(f"the MCP ask tool failed: {line[:500]!r}")
                return time.perf_counter() - t
        raise RuntimeError("dsqa mcp closed stdout before answering")
    finally:
        proc.kill()
        proc.wait(timeout=30)


def run_bench(opts: BenchOptions, questions: list[str], progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every row in one run; the ratios divide by the bare encode measured here."""
    report: dict[str, Any] = {"questions": len(questions), "quick": opts.quick, "cores": os.cpu_count()}
    progress("bare sentence-transformers encode (the baseline)")
    report["bare_encode_ms"] = bare = bare_encode_ms(questions)
    if opts.docs is not None:
        progress("index builds" + (" (one file changed)" if opts.quick else " (from nothing, then one file changed)"))
        with tempfile.TemporaryDirectory(prefix="dsqa-bench-") as work:
            report.update(build_rows(opts, Path(work)))
    progress("cold starts: dsqa ask, first MCP answer")
    report["cold_dsqa_ask_s"] = round(cold_ask_s(opts.index), 2)
    report["first_mcp_answer_s"] = round(first_mcp_answer_s(opts.index), 2)
    progress("/ask over HTTP")
    report.update(http_rows(opts, questions))
    if not opts.quick and opts.docs is not None:
        progress("LlamaIndex VectorStoreIndex (peer)")
        report["llama_index_retrieve_ms"] = llama_index_ms(opts.docs, questions)
    single = report["ask_1_client_ms"]
    report["ratios"] = {
        "ask_p50_over_bare_encode": round(single["p50"] / bare["p50"], 2),
        "ask_p99_over_p50": round(single["p99"] / single["p50"], 2),
    }
    peer = report.get("llama_index_retrieve_ms", {})
    if "p50" in peer:
        report["ratios"]["ask_p50_over_llama_index_retrieve"] = round(single["p50"] / peer["p50"], 2)
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [f"{'row':36} value"]
    for key, value in report.items():
        if isinstance(value, dict):
            places = 2 if key == "ratios" else 1  # a ratio's second place decides a 0.8 target
            shown = ", ".join(f"{k} {v:.{places}f}" if isinstance(v, float) else f"{k} {v}" for k, v in value.items())
        else:
            shown = json.dumps(value)
        lines.append(f"{key:36} {shown}")
    return "\n".join(lines)
