"""Latency benchmark, in one run on this machine: `/ask` over real HTTP (a `dsqa serve` subprocess on
loopback) at 1 client (p50/p99) and at 8/16/32 clients (req/s, p99, errors), against the bare
sentence-transformers encode of the same questions (the baseline) and the ONNX encode; and the cold
start of `dsqa ask` from a shell. Prints ratios against the baseline measured in the same run.

    .venv/bin/python bench/latency.py [--index var/index] [--seconds 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _questions() -> list[str]:
    from eval.question_set import load_split

    return [q.question for q in load_split("tune")][:60]


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def encode_ms(model: Any, questions: list[str]) -> dict[str, float]:
    """p50/p99 of encoding one question at a time, after a warm-up."""
    model.embed(questions[:3])
    times = []
    for q in questions:
        t = time.perf_counter()
        model.embed([q])
        times.append((time.perf_counter() - t) * 1000)
    return {"p50": statistics.median(times), "p99": _pct(times, 99)}


def bare_encode_ms(questions: list[str]) -> dict[str, float]:
    from indexer.embedder import SentenceTransformerEmbedder

    return encode_ms(SentenceTransformerEmbedder(), questions)


def onnx_encode_ms(index: Path, questions: list[str], model_file: str = "model.onnx") -> dict[str, float]:
    from indexer.onnx_encoder import ENCODER_DIR, OnnxEmbedder

    return encode_ms(OnnxEmbedder(index / ENCODER_DIR, threads=2, model_file=model_file), questions)  # 2 threads: the service default


def serve(index: Path, port: int, workers: int = 1) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DSQA_LOG_JSON": "false", "DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--index", str(index), "--port", str(port), "--workers", str(workers)],
                            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("dsqa serve did not become ready")


def one_client(url: str, questions: list[str]) -> dict[str, float]:
    with httpx.Client(timeout=30) as http:
        for q in questions[:5]:
            http.post(url, json={"question": q})
        times = []
        for q in questions * 3:  # 180 requests: a p99 that is not just the slowest one
            t = time.perf_counter()
            http.post(url, json={"question": q}).raise_for_status()
            times.append((time.perf_counter() - t) * 1000)
    return {"p50": statistics.median(times), "p99": _pct(times, 99)}


def many_clients(url: str, questions: list[str], clients: int, seconds: float) -> dict[str, float]:
    times: list[float] = []
    errors = [0]
    stop = time.monotonic() + seconds

    def worker(offset: int) -> None:
        with httpx.Client(timeout=30) as http:
            i = offset
            while time.monotonic() < stop:
                t = time.perf_counter()
                try:
                    ok = http.post(url, json={"question": questions[i % len(questions)]}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                times.append((time.perf_counter() - t) * 1000)
                errors[0] += not ok
                i += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    start = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {"req_s": len(times) / (time.monotonic() - start), "p99": _pct(times, 99), "errors": errors[0]}


def cold_ask_s(index: Path) -> float:
    env = {**os.environ, "DSQA_INDEX_DIR": str(index), "DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1"}
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "app.cli", "ask", "How do I offload optimizer states to NVMe?"], env=env, cwd=REPO,
                   capture_output=True, check=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--index", type=Path, default=REPO / "var/index")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2], help="worker counts to serve with (default 1,2)")
    args = ap.parse_args()
    questions = _questions()
    report: dict[str, object] = {"questions": len(questions)}
    report["bare_encode_ms"] = bare = bare_encode_ms(questions)
    report["onnx_encode_ms"] = onnx_encode_ms(args.index, questions)
    report["onnx_int8_encode_ms"] = onnx_encode_ms(args.index, questions, "model-int8.onnx")
    report["cold_dsqa_ask_s"] = round(cold_ask_s(args.index), 2)
    for workers in args.workers:
        proc = serve(args.index, args.port, workers)
        tag = "" if workers == 1 else f"_{workers}_workers"
        try:
            url = f"http://127.0.0.1:{args.port}/ask"
            if workers == 1:
                report["ask_1_client_ms"] = single = one_client(url, questions)
                report["ask_p50_over_bare_encode"] = round(single["p50"] / bare["p50"], 2)
                report["ask_p99_over_p50"] = round(single["p99"] / single["p50"], 2)
            for n in (8, 16, 32):
                report[f"clients_{n}{tag}"] = many_clients(url, questions, n, args.seconds)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for key, value in report.items():
        print(f"{key:28} {json.dumps(value) if not isinstance(value, dict) else ', '.join(f'{k} {v:.1f}' if isinstance(v, float) else f'{k} {v}' for k, v in value.items())}")


if __name__ == "__main__":
    main()
