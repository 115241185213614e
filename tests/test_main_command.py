"""The README's main command on a machine that cannot reach github.com (slow: real model)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

pytestmark = pytest.mark.slow


def test_up_without_docs_still_serves_and_says_what_is_missing(tmp_path: Path, index_cache: Path) -> None:
    # the suite's vector cache: the package and notes chunks the real index embedded are not embedded again
    port = free_port()
    env = {
        **os.environ,
        "DSQA_INDEX_DIR": str(tmp_path / "index"),
        "DSQA_CACHE_DIR": str(index_cache),
        "DSQA_DOCS_URL_TEMPLATE": "http://127.0.0.1:9/{ref}.tar.gz",  # nothing listens there
        "DSQA_FETCH_RETRIES": "1",
        "DSQA_FETCH_TIMEOUT_S": "2",
    }
    env.pop("DSQA_DOCS_DIR", None)
    log = (tmp_path / "up.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "up", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (tmp_path / "up.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "dsqa up did not become ready"
            time.sleep(1)
        output = (tmp_path / "up.log").read_text()
        assert "could not fetch DeepSpeed's docs" in output
        assert "DeepSpeed's docs are missing" in output and "DSQA_DOCS_DIR" in output
        body = httpx.post(f"http://127.0.0.1:{port}/ask", json={"question": "what does stage3_max_live_parameters do"}, timeout=60).json()
        assert any(p["source"] == "config" for p in body["passages"])
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz").json()
        assert ready["index"]["counts"]["by_source"].get("docs") is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_bad_setting_is_named_without_a_traceback(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main

    monkeypatch.setenv("DSQA_WORKERS", "two")
    monkeypatch.setenv("DSQA_BUILD_BF16", "maybe")
    assert main(["index", "--out", "/nonexistent/never-written"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsqa: bad setting: ") and "Traceback" not in err
    assert "DSQA_WORKERS='two'" in err and "valid integer" in err
    assert "DSQA_BUILD_BF16='maybe'" in err and "'auto' or 'off'" in err


def test_a_bad_ask_argument_names_its_field_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main

    assert main(["ask", "how do I enable ZeRO-3?", "--k", "0"]) == 2  # checked before any index or model loads
    err = capsys.readouterr().err
    assert "(field: k)" in err and "greater than or equal to 1" in err and "Traceback" not in err


def test_a_quiet_index_build_prints_its_summary_line_only(tiny_docs: Path, tmp_path: Path, index_cache: Path) -> None:
    """`dsqa index --quiet` on docs whose config snippet uses a deprecated key, with the encoder's ONNX
    export not cached: DeepSpeed's warnings about the configs the build feeds its parser, the tracer's
    and onnxruntime's export warnings, the model loader's bar and bm25s's debug lines stay off the terminal."""
    import shutil

    page = tiny_docs / "docs" / "_tutorials" / "offload.md"
    page.write_text('---\ntitle: "Offload"\n---\n\n## Old offload\n\nThe old way:\n\n```json\n'
                    '{"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": true}}\n```\n')
    cache = tmp_path / "cache"
    cache.mkdir()
    for vectors in index_cache.glob("vectors-*.npz"):  # the package's and notes' vectors, not the encoder export
        shutil.copy(vectors, cache / vectors.name)
    env = {**os.environ, "DSQA_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-m", "app.cli", "index", "--docs", str(tiny_docs), "--out", str(tmp_path / "index"), "--quiet"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "index" / "encoder" / "model.onnx").is_file()  # the export ran in this build
    assert done.stdout.startswith("indexed ") and len(done.stdout.strip().splitlines()) == 1, done.stdout[-2000:]
    assert done.stderr == "", done.stderr[-3000:]
