"""The real service end to end: real index, real model, real uvicorn (slow)."""

from __future__ import annotations

import re
import statistics
import time

import httpx
import pytest

from tests.conftest import ServerThread

pytestmark = pytest.mark.slow


def test_ask_cites_real_docs_with_snippets(real_server: ServerThread) -> None:
    r = httpx.post(real_server.url + "/ask", json={"question": "How do I enable ZeRO-Offload of the optimizer to CPU?", "k": 5}, timeout=60)
    assert r.status_code == 200
    body = r.json()
    assert body["covered"] is True
    assert len(body["passages"]) == 5
    assert any("offload_optimizer" in p["text"] for p in body["passages"])
    assert all(p["url"].startswith("https://") or p["url"].startswith("dsqa://") for p in body["passages"])
    assert any(p["path"].startswith("docs/") for p in body["passages"])
    assert body["snippets"] and all(s["status"] in {"ran", "checked", "template", "fails", "not_checked"} for s in body["snippets"])
    assert all("0.19.8" in s["stamp"] or s["status"] == "not_checked" for s in body["snippets"])
    assert "[1]" in body["answer"] or "[2]" in body["answer"]
    assert body["index"]["deepspeed_version"] and body["index"]["counts"]["chunks"] > 1000


def test_off_topic_question_is_not_answered_from_noise(real_server: ServerThread) -> None:
    body = httpx.post(real_server.url + "/ask", json={"question": "What is a good recipe for vegetable soup?"}, timeout=60).json()
    assert body["covered"] is False
    assert "do not seem to cover" in body["answer"]


def test_chinese_question_is_answered(real_server: ServerThread) -> None:
    body = httpx.post(real_server.url + "/ask", json={"question": "流水线并行中如何使用 PipelineModule 切分模型？"}, timeout=60).json()
    assert body["covered"] is True
    assert any("PipelineModule" in p["text"] for p in body["passages"])


def test_latency_is_reported(real_server: ServerThread) -> None:
    times = []
    for q in ["zero stage 2 overlap_comm", "flops profiler output", "hostfile slots", "bf16 config", "pipeline RepeatingLoader"]:
        t = time.perf_counter()
        r = httpx.post(real_server.url + "/ask", json={"question": q}, timeout=60)
        times.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200 and r.json()["timings_ms"]["total"] > 0
    print(f"\n/ask p50 {statistics.median(times):.1f} ms over {len(times)} requests")


def test_answer_warns_about_docs_code_the_installed_version_rejects(real_server: ServerThread) -> None:
    body = httpx.post(real_server.url + "/ask", json={"question": "How do I configure the 1-bit Adam optimizer (OneBitAdam) freeze_step?"}, timeout=60).json()
    assert re.search(r"no longer works? with the installed deepspeed", body["answer"])
    assert "OneBitAdam" in body["answer"]


def test_a_refusal_still_lists_the_closest_matches(real_server: ServerThread) -> None:
    body = httpx.post(real_server.url + "/ask", json={"question": "What is a good recipe for vegetable soup?", "k": 3}, timeout=60).json()
    assert body["covered"] is False and "closest matches" in body["answer"]
    assert len(body["passages"]) == 3
