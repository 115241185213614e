"""`dsqa up` verifies in the background: a niced `dsqa verify` child runs the snippets for real
while the service serves, `/ask` shows `ran` badges as they land (no restart), `/readyz` and
`/metrics` show the progress, and shutting down ends the child."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.engine import load_engine
from indexer.embedder import HashEmbedder
from indexer.snippet_status import LEDGER, read_progress, write_progress
from tests.small_index import build_small_index, small_settings

pytestmark = pytest.mark.slow  # real deepspeed runs in the sandbox


def test_progress_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    assert read_progress(path) == {}
    write_progress(path, "running", 2, 5, last="abc")
    assert read_progress(path) == {"state": "running", "done": 2, "total": 5, "last": "abc"}
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # swapped in, no temp file left


def test_service_shows_ran_badges_as_the_background_verify_lands(tmp_path_factory: pytest.TempPathFactory) -> None:
    index = build_small_index(tmp_path_factory)
    settings = small_settings(index, verify_in_background=True, verify_timeout_s=120.0)
    app = create_app(settings, load_engine(settings, HashEmbedder()))
    question = {"question": "How do I configure ZeRO stage 2 overlap_comm?", "k": 3}
    with TestClient(app) as http:
        before = http.post("/ask", json=question).json()
        assert before["snippets"] and all(s["status"] != "ran" for s in before["snippets"])
        verifier = app.state.verifier
        assert verifier is not None and verifier.proc is not None and verifier.proc.poll() is None
        deadline = time.monotonic() + 420
        ran: list[dict] = []
        while not ran:
            assert time.monotonic() < deadline, (http.get("/readyz").json(), verifier.log_path.read_text()[-2000:])
            time.sleep(3)
            ran = [s for s in http.post("/ask", json=question).json()["snippets"] if s["status"] == "ran"]
        assert ran[0]["label"] == "ran" and ran[0]["stamp"].startswith("ran on cpu, deepspeed ")
        progress = http.get("/readyz").json()["verification"]
        assert progress["state"] in ("running", "done") and progress["done"] >= 1 and progress["total"] >= progress["done"]
        metrics = http.get("/metrics").text
        assert "dsqa_verify_snippets_done" in metrics and "dsqa_verify_snippets_total" in metrics
        assert (index / LEDGER).is_file()
        child = verifier.proc
    assert child.poll() is not None  # shutdown ended the child
