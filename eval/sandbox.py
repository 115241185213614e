"""Run one program in a sandbox: a subprocess with a wall-clock timeout, a memory cap, its own
temporary directory, no network, a read-only view of the rest of the machine where the kernel
allows it, a scrubbed environment, and captured, truncated output.

Where `unshare` works (Linux user namespaces; as root in a container it usually does), the
program runs in new user, network, mount and PID namespaces: only a loopback interface (no route
out), its temporary directory mounted over /tmp (so `/tmp/anything` lands in its own dir), a fresh
/dev/shm, every other mount remounted read-only, the torch extensions cache seen copy-on-write (an
overlay whose writes stay in the run's own dir: `eval/ops_cache.py` alone writes the real one), and a
/proc that shows only its own processes. Where it does not, the fallback
still applies the timeout, RLIMIT_AS, cwd/HOME/TMPDIR in the temp dir and the environment
allowlist, but network and writes elsewhere are not blocked: `isolation` in the result says which.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from eval.run_cgroup import RunCgroup

MAX_OUTPUT_CHARS = 20_000

# Environment variables a snippet may see (exact names), plus the prefixes below; nothing else.
ENV_ALLOWLIST = frozenset(
    {
        "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR",
        "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
        "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "PYTHONPATH", "VIRTUAL_ENV",
    }
)
_SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")
_SECRET_PREFIXES = ("SLACK_", "DSQA_LLM_", "AWS_", "GOOGLE_", "AZURE_", "OPENAI_", "ANTHROPIC_", "GITHUB_", "HF_TOKEN")


def is_secret_name(name: str) -> bool:
    up = name.upper()
    return any(m in up for m in _SECRET_MARKERS) or up.startswith(_SECRET_PREFIXES)


def scrub_env(source: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Only allowlisted, non-secret variables of `source`, then `extra` (also filtered for secrets)."""
    env = {k: v for k, v in source.items() if k in ENV_ALLOWLIST and not is_secret_name(k)}
    for k, v in (extra or {}).items():
        if not is_secret_name(k):
            env[k] = v
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env


@dataclass
class SandboxResult:
    returncode: int | None  # None on timeout
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    signal: int | None = None  # the signal that ended it, if any
    isolation: list[str] = field(default_factory=list)
    limits_hit: list[str] = field(default_factory=list)  # cgroup limits the run ran into (memory, pids)
    cow_written: list[str] = field(default_factory=list)  # top-level entries the program wrote in the copy-on-write dir


def _truncate(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = limit // 4
    return text[:head] + f"\n... [{len(text) - limit} characters cut] ...\n" + text[-(limit - head):]


def _read(path: Path) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(8 * MAX_OUTPUT_CHARS + 1)
            if len(data) > 8 * MAX_OUTPUT_CHARS:  # keep the head and the tail of a flood
                f.seek(-4 * MAX_OUTPUT_CHARS, os.SEEK_END)
                data = data[: 4 * MAX_OUTPUT_CHARS] + b"\n...\n" + f.read()
        return _truncate(data.decode("utf-8", "replace"))
    except OSError:
        return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The namespace set-up, run by `sh` inside the new namespaces before the program is exec'd.
_SETUP = r"""
set -e
SBX="$1"; KEEP_RW="$2"; KEEP_RO="$3"; KEEP_COW="$4"; shift 4
ip link set lo up 2>/dev/null || true
mount --make-rprivate / 2>/dev/null || true
if [ -n "$KEEP_RW" ] && [ -d "$KEEP_RW" ]; then mount --bind "$KEEP_RW" "$KEEP_RW"; fi
# the copy-on-write dir (the ops cache): the program reads it and may write, but its writes land in
# its own upper dir (gone with the sandbox dir); the host's copy is never touched
if [ -n "$KEEP_COW" ] && [ -d "$KEEP_COW" ]; then mkdir -p "$SBX/.cow/up" "$SBX/.cow/work"
  case "$KEEP_COW" in /tmp/*) T="$SBX/${KEEP_COW#/tmp/}"; mkdir -p "$T" ;; *) T="$KEEP_COW" ;; esac
  if mount -t overlay overlay -o "lowerdir=$KEEP_COW,upperdir=$SBX/.cow/up,workdir=$SBX/.cow/work" "$T" 2>/dev/null; then
    touch "$SBX/.cow/mounted"; else mount --bind "$KEEP_COW" "$T"; mount -o remount,bind,ro "$T" 2>/dev/null || true; fi; fi
# paths under /tmp that must stay visible (the venv, the repo, the ops cache) are bound into the
# sandbox dir at the same relative place before the sandbox dir is mounted over /tmp
for p in $(echo "$KEEP_RO:$KEEP_RW" | tr ':' ' '); do
  case "$p" in
    /tmp/*) if [ -d "$p" ]; then mkdir -p "$SBX/${p#/tmp/}"; mount --rbind "$p" "$SBX/${p#/tmp/}"; fi ;;
  esac
done
mount --rbind "$SBX" /tmp
mount -t tmpfs -o size=512m,mode=1777 tmpfs /dev/shm 2>/dev/null || true
mount -t proc proc /proc 2>/dev/null || true
awk '{print $2}' /proc/self/mounts | sort -u | while read -r mp; do
  case "$mp" in
    /proc|/proc/*|/sys|/sys/*|/dev|/dev/*|/tmp) ;;
    *) if [ "$mp" != "$KEEP_RW" ] && [ "$mp" != "$KEEP_COW" ]; then mount -o remount,bind,ro "$mp" 2>/dev/null || true; fi ;;
  esac
done
cd /tmp
exec "$@"
"""


# The minimal root: a tmpfs holding read-only binds of only what a snippet needs (the system's /usr,
# the Python install and the venv, a few /etc files, the ops cache) and the sandbox dir as /tmp;
# the rest of the machine (home folders, /work, /etc/shadow, the repo's .git) is not there at all.
_MINIMAL_ROOT = r"""
set -e
SBX="$1"; KEEP_RW="$2"; KEEP_RO="$3"; KEEP_COW="$4"; shift 4
ip link set lo up 2>/dev/null || true
mount --make-rprivate / 2>/dev/null || true
R="$SBX/.root"; mkdir -p "$R"; mount -t tmpfs -o size=64m,mode=755 tmpfs "$R"
mkdir -p "$R/tmp"; mount --bind "$SBX" "$R/tmp"  # first: a venv under /tmp is then bound inside it
bind_ro() { if [ -e "$1" ]; then
  if [ -d "$1" ]; then mkdir -p "$R$1"; else mkdir -p "$(dirname "$R$1")"; touch "$R$1"; fi
  mount --rbind "$1" "$R$1"; mount -o remount,bind,ro "$R$1" 2>/dev/null || true; fi; }
bind_ro /usr
for l in bin sbin lib lib64 lib32; do if [ -L "/$l" ]; then ln -s "$(readlink "/$l")" "$R/$l"; elif [ -d "/$l" ]; then bind_ro "/$l"; fi; done
for p in $(echo "$KEEP_RO" | tr ':' ' '); do bind_ro "$p"; done
for f in /etc/ld.so.cache /etc/ld.so.conf /etc/ld.so.conf.d /etc/alternatives /etc/localtime /etc/ssl /etc/nsswitch.conf /etc/hosts; do bind_ro "$f"; done
printf 'root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n' > "$R/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$R/etc/group"
mkdir -p "$R/dev" "$R/proc" "$R/dev/shm"
for n in null zero full random urandom tty; do touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"; done
for n in /dev/nvidia*; do  # the GPU's nodes; /dev/nvidia-caps is a folder of them
  if [ -d "$n" ]; then mkdir -p "$R$n"; mount --rbind "$n" "$R$n"; elif [ -e "$n" ]; then touch "$R$n"; mount --bind "$n" "$R$n"; fi; done
mount -t tmpfs -o size=512m,mode=1777 tmpfs "$R/dev/shm"
mount -t proc proc "$R/proc"
if [ -n "$KEEP_RW" ] && [ -d "$KEEP_RW" ]; then mkdir -p "$R$KEEP_RW"; mount --bind "$KEEP_RW" "$R$KEEP_RW"; fi
if [ -n "$KEEP_COW" ] && [ -d "$KEEP_COW" ]; then mkdir -p "$R$KEEP_COW" "$SBX/.cow/up" "$SBX/.cow/work"
  if mount -t overlay overlay -o "lowerdir=$KEEP_COW,upperdir=$SBX/.cow/up,workdir=$SBX/.cow/work" "$R$KEEP_COW" 2>/dev/null; then
    touch "$SBX/.cow/mounted"; else mount --rbind "$KEEP_COW" "$R$KEEP_COW"; mount -o remount,bind,ro "$R$KEEP_COW" 2>/dev/null || true; fi; fi
mount -o remount,bind,ro,nosuid "$R" 2>/dev/null || true
cd "$R/tmp"
exec chroot "$R" /bin/sh -c 'cd /tmp && exec "$@"' sh "$@"
"""


@lru_cache(maxsize=1)
def minimal_root_available() -> bool:
    """True when the minimal root can be built here and a program in it sees none of the host."""
    if not namespaces_available():
        return False
    return _probe(_MINIMAL_ROOT, _keep_visible({}), [sys.executable, "-c",
                  "import os, pathlib; pathlib.Path('/tmp/ok').write_text('1'); assert not os.path.exists('/etc/shadow')"], timeout_s=30)


def _probe(setup: str, keep_ro: str, command: list[str], timeout_s: float) -> bool:
    """Whether `command`, run under a set-up script in new namespaces, could write /tmp/ok there."""
    probe = tempfile.mkdtemp(prefix="dsqa-probe-")
    try:
        r = subprocess.run(["unshare", "-rnmpf", "--kill-child", "sh", "-c", setup, "sh", probe, "", keep_ro, "", *command],
                           capture_output=True, timeout=timeout_s)
        return r.returncode == 0 and (Path(probe) / "ok").exists()
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)


@lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """True when `unshare` can make user+net+mount+pid namespaces and mount over /tmp here."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return False
    return _probe(_SETUP, "", ["sh", "-c", "touch /tmp/ok && ! touch /usr/.dsqa_probe 2>/dev/null"], timeout_s=20)


def _keep_visible(env: Mapping[str, str]) -> str:
    """Read-only paths the program needs: the venv and the Python install it links to, PYTHONPATH entries."""
    paths = [sys.prefix, sys.base_prefix, *env.get("PYTHONPATH", "").split(os.pathsep)]
    return ":".join(dict.fromkeys(p for p in paths if p and ":" not in p and " " not in p))


FILE_MB = 1024  # the largest file a run may write (RLIMIT_FSIZE): a flood of output cannot fill the disk
PIDS_MAX = 512  # processes and threads of one run together (its cgroup)


def _limits(memory_mb: int | None, group: RunCgroup | None) -> None:  # runs in the child between fork and exec
    os.setsid()
    # a new session is a new scheduler autogroup, where the niceness inherited from a niced caller (the
    # background verify, the ops build beside the tests) counts only against the group's own processes:
    # give the group that niceness, so a niced caller's runs stay behind everything else
    niceness = os.nice(0)
    if niceness > 0:
        try:
            with open("/proc/self/autogroup", "w") as autogroup:
                autogroup.write(str(niceness))
        except OSError:
            pass  # no autogroups (a kernel without them, or they are off): nice alone applies
    if group is not None:
        group.join()  # everything this program starts stays inside the run's memory and pids bounds
    if memory_mb:
        cap = int(memory_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_MB * 1024 * 1024, FILE_MB * 1024 * 1024))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_sandboxed(
    argv: list[str],
    files: Mapping[str, str] | None = None,
    *,
    timeout_s: float = 120.0,
    memory_mb: int | None = 4096,
    env: Mapping[str, str] | None = None,
    keep_rw: str | None = None,
    keep_cow: str | None = None,
    isolate: bool = True,
    minimal_root: bool = True,
    workdir_parent: str | None = None,
) -> SandboxResult:
    """Run argv with cwd in a fresh temp dir holding `files`. Inside, refer to that dir as `.`:
    with namespaces it is mounted at /tmp, without them it is the real temp dir (cwd). `keep_rw`: a
    dir the program may write for real (trusted build steps only); `keep_cow`: a dir it sees
    writable whose writes stay in the sandbox (an overlay; without namespaces it is simply writable).
    `minimal_root` False keeps the namespaces but shows the machine's own (read-only) file system instead
    of the minimal root: for a device the minimal root lacks something for (the GPU check tries both)."""
    sbx = Path(tempfile.mkdtemp(prefix="dsqa-sbx-", dir=workdir_parent))
    try:
        for name, text in (files or {}).items():
            target = sbx / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        out_path, err_path = sbx / ".stdout", sbx / ".stderr"
        use_ns = isolate and namespaces_available()
        inner_dir = "/tmp" if use_ns else str(sbx)
        child_env = dict(env or {})
        child_env.update({"HOME": inner_dir, "TMPDIR": inner_dir, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"})
        if use_ns and minimal_root and minimal_root_available():
            cmd = ["unshare", "-rnmpf", "--kill-child", "sh", "-c", _MINIMAL_ROOT, "sh", str(sbx), keep_rw or "", _keep_visible(child_env), keep_cow or "", *argv]
            isolation = ["timeout", "env_allowlist", "temp_cwd", "no_network", "private_tmp", "read_only_fs", "pid_namespace", "minimal_root"]
        elif use_ns:
            cmd = ["unshare", "-rnmpf", "--kill-child", "sh", "-c", _SETUP, "sh", str(sbx), keep_rw or "", _keep_visible(child_env), keep_cow or "", *argv]
            isolation = ["timeout", "env_allowlist", "temp_cwd", "no_network", "private_tmp", "read_only_fs", "pid_namespace"]
        else:
            cmd = list(argv)
            isolation = ["timeout", "env_allowlist", "temp_cwd"]
        if memory_mb:
            isolation.insert(1, "rlimit_as")
        isolation.append("rlimit_fsize")
        group = RunCgroup.create(memory_mb, PIDS_MAX)  # the run as a whole; None where cgroups are not ours
        isolation += group.bounds if group is not None else []
        t0 = time.monotonic()
        timed_out = False
        try:
            with out_path.open("wb") as out, err_path.open("wb") as err:
                proc = subprocess.Popen(
                    cmd, cwd=sbx, env=child_env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    preexec_fn=lambda: _limits(memory_mb, group), close_fds=True,
                )
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                finally:
                    try:  # the whole group: the program and anything it started
                        os.killpg(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    proc.wait()
            hit = group.hit() if group is not None else []
            if use_ns and keep_cow:  # which view of the ops cache the program had
                isolation.append("ops_cache_copy_on_write" if (sbx / ".cow" / "mounted").exists() else "ops_cache_read_only")
        finally:
            if group is not None:
                group.close()
        duration = time.monotonic() - t0
        rc = proc.returncode
        return SandboxResult(
            returncode=None if timed_out else rc,
            stdout=_read(out_path),
            stderr=_read(err_path),
            duration_s=round(duration, 3),
            timed_out=timed_out,
            signal=-rc if (rc is not None and rc < 0) else (rc - 128 if rc is not None and rc > 128 and use_ns else None),
            isolation=isolation,
            limits_hit=hit,
            cow_written=sorted(p.name for p in (sbx / ".cow" / "up").iterdir()) if (sbx / ".cow" / "up").is_dir() else [],
        )
    finally:
        shutil.rmtree(sbx, ignore_errors=True)
