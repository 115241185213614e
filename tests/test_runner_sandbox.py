"""Hostile snippets are contained by the local runner's sandbox, and the runner keeps serving."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from eval.runner import LocalRunner, RunRequest
from eval.sandbox import namespaces_available

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox uses POSIX rlimits and Linux namespaces")


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> LocalRunner:
    return LocalRunner(extensions_dir=str(tmp_path_factory.mktemp("ext")))


def run(runner: LocalRunner, code: str, **kw) -> object:
    return runner.run(RunRequest(kind="python", code=code, **kw))


def test_secrets_are_not_in_the_environment(runner: LocalRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSQA_RUNNER_TOKEN", "runner-secret")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-secret")
    monkeypatch.setenv("DSQA_LLM_API_KEY", "llm-secret")
    code = (
        "import os, glob\n"
        "print(sorted(os.environ))\n"
        "leaks = [k for k, v in os.environ.items() if 'secret' in v]\n"
        "for p in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try:\n"
        "        if b'secret' in open(p, 'rb').read(): leaks.append(p)\n"
        "    except OSError: pass\n"
        "print('LEAKS', leaks)\n"
    )
    r = run(runner, code)
    assert r.status == "passed", r.stderr
    assert "LEAKS []" in r.stdout and "TOKEN" not in r.stdout and "secret" not in r.stdout


@pytest.mark.skipif(not namespaces_available(), reason="no user/net namespaces here: network is not blocked (see ARCHITECTURE.md)")
def test_no_network_and_no_writes_outside(runner: LocalRunner) -> None:
    name = f"dsqa-escape-{uuid.uuid4().hex}"
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=3); print('NET OPEN')\n"
        "except OSError as e: print('net blocked:', e)\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', 22), timeout=3); print('HOST LOOPBACK OPEN')\n"
        "except OSError as e: print('host loopback blocked:', e)\n"
        f"open('/tmp/{name}', 'w').write('x')\n"
        "print('wrote /tmp (private)')\n"
        f"for p in ('{Path.cwd()}/{name}', '/root/{name}', '/usr/{name}'):\n"
        "    try:\n"
        "        open(p, 'w').write('x'); print('WROTE', p)\n"
        "    except OSError as e: print('blocked', p, e.errno)\n"
    )
    r = run(runner, code)
    assert r.status == "passed", r.stderr
    assert "NET OPEN" not in r.stdout and "HOST LOOPBACK OPEN" not in r.stdout and "WROTE" not in r.stdout
    assert "wrote /tmp (private)" in r.stdout
    assert not Path("/tmp", name).exists() and not (Path.cwd() / name).exists()
    assert {"no_network", "read_only_fs", "private_tmp"} <= set(r.isolation)


def test_endless_loop_times_out(runner: LocalRunner) -> None:
    r = run(runner, "import os\nos.fork()\nwhile True:\n    pass\n", timeout_s=3)
    assert r.status == "timeout" and r.duration_s < 15


def test_memory_hog_is_killed(runner: LocalRunner) -> None:
    r = run(runner, "blocks = []\nwhile True:\n    blocks.append(bytearray(256 * 1024 * 1024))\n", memory_mb=1024, timeout_s=60)
    assert r.status == "killed" and "memory" in r.reason


def test_output_is_truncated_and_the_runner_keeps_serving(runner: LocalRunner) -> None:
    r = run(runner, "import sys\nfor i in range(200000):\n    print('x' * 50)\nsys.exit(3)\n", timeout_s=30)
    assert r.status == "failed" and len(r.stdout) < 30_000 and "characters cut" in r.stdout
    ok = run(runner, "print(sum(range(10)))")
    assert ok.status == "passed" and ok.stdout.strip() == "45"
