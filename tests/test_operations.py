"""Operations: Prometheus /metrics, the JSON access log, and the compose file (with the GPU runner)."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from app.logs import JsonFormatter, configure_logging
from app.metrics import record_runner_result
from tests.conftest import REPO, ServerThread
from tests.small_index import build_small_index, small_app


@pytest.fixture(scope="module")
def ops_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(small_app(build_small_index(tmp_path_factory))) as server:
        yield server


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one series in the Prometheus text format (labels in any order)."""
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if not m:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(2))
    raise AssertionError(f"no sample {name} {labels}")


def test_metrics_count_requests_by_route_and_status(ops_server: ServerThread) -> None:
    before = httpx.get(ops_server.url + "/metrics").text
    n_health = sample(before, "dsqa_http_requests_total", route="/healthz", status="200") if 'route="/healthz"' in before else 0.0
    httpx.get(ops_server.url + "/healthz")
    httpx.get(ops_server.url + "/healthz")
    httpx.post(ops_server.url + "/ask", json={"question": "zero stage 2", "k": 2}, timeout=30)
    httpx.post(ops_server.url + "/ask", json={"question": ""})
    httpx.get(ops_server.url + "/no/such/page")
    r = httpx.get(ops_server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert sample(text, "dsqa_http_requests_total", route="/healthz", method="GET", status="200") == n_health + 2
    assert sample(text, "dsqa_http_requests_total", route="/ask", status="200") >= 1
    assert sample(text, "dsqa_http_requests_total", route="/ask", status="422") >= 1
    assert sample(text, "dsqa_http_requests_total", route="unmatched", status="404") >= 1  # no raw paths as labels
    assert 'path="/no/such/page"' not in text and "/no/such/page" not in text
    assert sample(text, "dsqa_http_request_duration_seconds_count", route="/ask") >= 2
    assert sample(text, "dsqa_http_request_duration_seconds_bucket", route="/ask", le="+Inf") >= 2
    assert sample(text, "dsqa_index_chunks") > 10


def test_runner_results_counter_is_exported_and_counts(ops_server: ServerThread) -> None:
    text = httpx.get(ops_server.url + "/metrics").text
    before = sample(text, "dsqa_runner_results_total", status="passed")  # exported at 0 before any run
    record_runner_result("passed")
    record_runner_result("surprise")
    text = httpx.get(ops_server.url + "/metrics").text
    assert sample(text, "dsqa_runner_results_total", status="passed") == before + 1
    assert sample(text, "dsqa_runner_results_total", status="other") >= 1
    for status in ("failed", "timeout", "killed", "skipped"):
        sample(text, "dsqa_runner_results_total", status=status)


def test_one_access_record_per_request(ops_server: ServerThread, caplog: pytest.LogCaptureFixture) -> None:
    def asks() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "dsqa.access" and r.fields["route"] == "/ask"]  # type: ignore[attr-defined]

    with caplog.at_level(logging.INFO, logger="dsqa.access"):
        httpx.post(ops_server.url + "/ask", json={"question": "pipeline", "k": 1}, timeout=30)
        deadline = time.monotonic() + 5  # the server thread writes its record once the reply is sent: it may trail the client
        while not asks() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # and a second record, were there one, would have come by now
    records = asks()
    assert len(records) == 1
    fields = records[0].fields  # type: ignore[attr-defined]
    assert fields["status"] == 200 and fields["method"] == "POST" and fields["duration_ms"] > 0


def test_json_lines_formatter_and_setup(capsys: pytest.CaptureFixture[str]) -> None:
    record = logging.LogRecord("dsqa.access", logging.INFO, __file__, 1, "GET %s %s", ("/healthz", 200), None)
    record.fields = {"route": "/healthz", "status": 200, "duration_ms": 1.5}
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "GET /healthz 200" and line["route"] == "/healthz" and line["status"] == 200
    assert line["level"] == "info" and line["logger"] == "dsqa.access" and line["ts"].endswith("+00:00")

    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).propagate, logging.getLogger(n).level) for n in ("dsqa", "app", "indexer")}
    try:
        configure_logging(json_lines=True)
        logging.getLogger("dsqa.access").info("POST /ask 200", extra={"fields": {"route": "/ask", "status": 200, "duration_ms": 3.0}})
        logging.getLogger("app.api").warning("plain message")
        lines = [json.loads(x) for x in capsys.readouterr().err.strip().splitlines()]
    finally:
        for n, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(n)
            logger.handlers, logger.propagate = handlers, propagate
            logger.setLevel(level)
    assert lines[0]["route"] == "/ask" and lines[0]["duration_ms"] == 3.0
    assert lines[1]["level"] == "warning" and lines[1]["message"] == "plain message"


def test_compose_file_has_a_gpu_runner() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    runner = compose["services"]["runner"]
    assert runner["command"] == ["dsqa", "runner", "serve", "--index", "/data/index", "--host", "0.0.0.0", "--port", "8100"]
    assert "index:/data:ro" in runner["volumes"]
    devices = runner["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert "DSQA_RUNNER_TOKEN" in runner["environment"]
    assert (REPO / runner["build"]["dockerfile"]).is_file()
    assert {"api", "indexer", "runner"} <= set(compose["services"])


def test_compose_llm_profile_is_optional_and_wired_to_the_api() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert compose["services"]["llm"]["profiles"] == ["llm"]  # not started by a plain `up`
    assert any(str(e).startswith("DSQA_LLM_URL=") for e in compose["services"]["api"]["environment"])


def test_docker_compose_config_validates() -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose not installed: scripts/test.sh installs it with `apt-get install -y docker-compose`")
    r = subprocess.run([binary, "-f", "docker-compose.yml", "config", "-q"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_openapi_lists_the_front_end_routes(ops_server: ServerThread) -> None:
    paths = httpx.get(ops_server.url + "/openapi.json").json()["paths"]
    assert {"/ask", "/validate-config", "/slack/commands", "/slack/events"} <= set(paths)
    assert Path(REPO / "app" / "static" / "index.html").is_file()


def test_several_workers_serve_one_port_and_refuse_a_partial_reload(tmp_path_factory: pytest.TempPathFactory) -> None:
    import os
    import subprocess
    import sys
    import time

    import httpx

    from tests.conftest import free_port
    from tests.small_index import HASH_MODEL

    index = build_small_index(tmp_path_factory)
    port = free_port()
    env = {**os.environ, "DSQA_EMBEDDING_MODEL": HASH_MODEL, "DSQA_NO_ANSWER_THRESHOLD": "0", "DSQA_ADMIN_TOKEN": "adm",
           "DSQA_LOG_JSON": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--index", str(index), "--port", str(port), "--workers", "2"],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the workers did not start"
            time.sleep(0.3)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            codes = [http.post("/ask", json={"question": "How do I enable ZeRO stage 2?"}).status_code for _ in range(12)]
            assert codes == [200] * 12
            r = http.post("/admin/reload", headers={"Authorization": "Bearer adm"})
            assert r.status_code == 409 and r.json()["error"] == "reload_needs_restart"
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert out.count("Started server process") == 2, out[-2000:]


def test_several_workers_refuse_a_damaged_index_with_one_line(tmp_path_factory: pytest.TempPathFactory) -> None:
    """With workers the index is checked in a process of its own before any worker starts (the
    supervisor keeps no engine): a damaged one still stops the start with one line, exit 3."""
    import os
    import shutil
    import subprocess
    import sys

    from tests.conftest import free_port
    from tests.small_index import HASH_MODEL

    index = tmp_path_factory.mktemp("damaged") / "index"
    shutil.copytree(build_small_index(tmp_path_factory), index)
    with (index / "chunks.jsonl").open("a", encoding="utf-8") as fh:
        fh.write("not json\n")
    env = {**os.environ, "DSQA_EMBEDDING_MODEL": HASH_MODEL, "DSQA_LOG_JSON": "false"}
    done = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--index", str(index), "--port", str(free_port()), "--workers", "2"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"dsqa: index at {index} is damaged: chunks.jsonl")
    assert "Traceback" not in done.stderr and "Started server process" not in done.stdout + done.stderr
