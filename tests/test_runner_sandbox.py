"""Hostile snippets are contained by the local runner's sandbox, and the runner keeps serving."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from eval.runner import LocalRunner, RunRequest
from eval.sandbox import minimal_root_available, namespaces_available, run_sandboxed

REPO = Path(__file__).resolve().parents[1]

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
    private = Path.cwd().is_relative_to("/tmp")  # a checkout under /tmp: that path is inside the run's own /tmp
    wrote = [line for line in r.stdout.splitlines() if line.startswith("WROTE") and not (private and str(Path.cwd()) in line)]
    assert "NET OPEN" not in r.stdout and "HOST LOOPBACK OPEN" not in r.stdout and not wrote
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


def _cgroups_ours() -> bool:
    from eval.run_cgroup import RunCgroup

    group = RunCgroup.create(64, 16)
    if group is None:
        return False
    group.close()
    return True


@pytest.mark.skipif(not _cgroups_ours(), reason="no writable cgroup controllers here: the run is bounded per process only")
def test_a_fork_bomb_hits_the_runs_process_limit(runner: LocalRunner) -> None:
    code = (
        "import os, time\n"
        "made = 0\n"
        "try:\n"
        "    for _ in range(2000):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        made += 1\n"
        "except OSError as e:\n"
        "    print('refused after', made, e.errno)\n"
        "    raise SystemExit(3)\n"
        "print('MADE', made)\n"
    )
    r = run(runner, code, timeout_s=60)
    assert "MADE 2000" not in r.stdout and "refused after" in r.stdout
    assert r.status == "killed" and "pids" in r.reason and "cgroup_pids" in r.isolation


@pytest.mark.skipif(not _cgroups_ours(), reason="no writable cgroup controllers here: the run is bounded per process only")
def test_children_share_one_memory_limit(runner: LocalRunner) -> None:
    # 6 children of 200 MB each stay under a 512 MB address-space cap one by one, not together
    code = (
        "import os, time\n"
        "kids = []\n"
        "for _ in range(6):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        block = bytearray(200 * 1024 * 1024)\n"
        "        for i in range(0, len(block), 4096): block[i] = 1\n"
        "        time.sleep(20); os._exit(0)\n"
        "    kids.append(pid)\n"
        "bad = 0\n"
        "for pid in kids:\n"
        "    _, status = os.waitpid(pid, 0)\n"
        "    bad += status != 0\n"
        "print('children killed', bad)\n"
        "raise SystemExit(1 if bad else 0)\n"
    )
    r = run(runner, code, memory_mb=512, timeout_s=60)
    assert r.status == "killed" and "memory limit" in r.reason and "children killed 0" not in r.stdout, (r.status, r.stdout, r.reason)
    assert "cgroup_memory" in r.isolation


def test_a_run_cannot_write_a_file_past_the_size_limit(runner: LocalRunner) -> None:
    from eval.sandbox import FILE_MB

    code = (
        "block = b'x' * (64 * 1024 * 1024)\n"
        "with open('big.bin', 'wb') as f:\n"
        f"    for _ in range({FILE_MB // 64 + 2}):\n"
        "        f.write(block)\n"
    )
    r = run(runner, code, timeout_s=120)
    assert r.status == "failed" and "File too large" in r.stderr
    assert "rlimit_fsize" in r.isolation


def test_the_host_is_not_there_to_read(runner: LocalRunner) -> None:
    repo = Path(__file__).resolve().parents[1]
    code = (
        "import os\n"
        f"for p in ('/etc/shadow', '{repo}/.git/config', '{repo.parent}/shared', '/root/.bashrc', '/home'):\n"
        "    print(p, 'VISIBLE' if os.path.exists(p) else 'absent')\n"
        "import deepspeed, torch\n"
        "print('libraries load', torch.__version__)\n"
    )
    r = run(runner, code, timeout_s=120)
    assert r.status == "passed", r.stderr[-2000:]
    if "minimal_root" not in r.isolation:
        pytest.skip("no minimal root here: the host is read-only to a snippet, not hidden")
    assert "VISIBLE" not in r.stdout and "libraries load" in r.stdout


@pytest.mark.skipif(not minimal_root_available(), reason="no minimal root here")
def test_without_the_minimal_root_the_namespaces_still_hold() -> None:
    """The GPU check's fallback level: the machine's own file system, read-only, inside the same
    namespaces (no network, a private /tmp); the result says which level it ran at."""
    probe = "import os, socket\nprint('shadow', os.path.exists('/etc/shadow'))\nopen('/tmp/mine', 'w').write('x')\n" \
            "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); print('network')\nexcept OSError:\n    print('no network')\n"
    both = {flag: run_sandboxed([sys.executable, "-c", probe], memory_mb=None, minimal_root=flag) for flag in (True, False)}
    assert all(r.returncode == 0 and "no network" in r.stdout for r in both.values()), {k: v.stderr[-500:] for k, v in both.items()}
    assert "minimal_root" in both[True].isolation and "shadow False" in both[True].stdout
    assert "minimal_root" not in both[False].isolation and "pid_namespace" in both[False].isolation
    assert "shadow True" in both[False].stdout  # the host's files are there to read, read-only


@pytest.mark.skipif(not namespaces_available(), reason="no user/net namespaces here: the ops cache is plainly writable")
def test_snippet_code_cannot_plant_a_library_in_the_ops_cache(runner: LocalRunner) -> None:
    cache = Path(runner.extensions_dir)
    (cache / "cpu_adam").mkdir(exist_ok=True)
    (cache / "cpu_adam" / "cpu_adam.so").write_text("trusted build")
    code = (
        "import os, pathlib\n"
        "cache = pathlib.Path(os.environ['TORCH_EXTENSIONS_DIR'])\n"
        "print('SEES', sorted(p.name for p in cache.iterdir()))\n"
        "(cache / 'cpu_adam' / 'cpu_adam.so').write_text('planted')\n"
        "(cache / 'not_an_op').mkdir(); (cache / 'not_an_op' / 'x.so').write_text('planted')\n"
        "print('READS BACK', (cache / 'cpu_adam' / 'cpu_adam.so').read_text())\n"
    )
    r = run(runner, code)
    assert r.status == "passed", r.stderr
    assert "SEES ['cpu_adam']" in r.stdout and "READS BACK planted" in r.stdout  # its own copy is writable
    assert (cache / "cpu_adam" / "cpu_adam.so").read_text() == "trusted build"  # the host's is untouched
    assert not (cache / "not_an_op").exists()
    assert "ops_cache_copy_on_write" in r.isolation
    # the made-up name reached the trusted build step, which has no builder of that name: nothing built
    assert "not_an_op" in runner.ops._tried and not (cache / "not_an_op").exists()


def test_a_native_crash_is_run_again_once_and_a_repeated_one_stays_a_crash(runner: LocalRunner) -> None:
    """A SIGSEGV from native code that a second run does not repeat is the environment's (seen once in CI
    on a notes snippet that passes every other time); one that repeats is reported, with both runs said."""
    r = runner.run(RunRequest(kind="python", code="import ctypes\nctypes.string_at(0)\n", timeout_s=60))
    assert r.status == "killed" and r.reason == "ended by SIGSEGV"
    assert any("first run ended by SIGSEGV" in a and "run again" in a for a in r.adaptations)
    ok = runner.run(RunRequest(kind="python", code="print('fine')\n", timeout_s=60))
    assert ok.status == "passed" and not any("run again" in a for a in ok.adaptations)


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no scheduler autogroups here")
def test_a_niced_callers_runs_stay_niced_in_their_new_session() -> None:
    """A run starts a new session, so a new autogroup; it gets the caller's niceness (nice alone would count
    only inside the group, and a niced background verify or op build would take a full share of the CPU)."""
    probe = ("import subprocess; from eval.sandbox import _limits; "
             "print(subprocess.run(['cat', '/proc/self/autogroup'], preexec_fn=lambda: _limits(None, None), "
             "capture_output=True, text=True).stdout)")
    niced = subprocess.run(["nice", "-n", "7", sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert niced.stdout.strip().endswith("nice 7"), niced.stdout + niced.stderr
    plain = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert plain.stdout.strip().endswith("nice 0"), plain.stdout + plain.stderr
