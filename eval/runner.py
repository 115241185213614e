"""The `SnippetRunner` protocol and its three backends: local (sandboxed subprocess), HTTP (a
`dsqa runner serve` host, e.g. a GPU machine) and Ray (each snippet a task with `num_gpus`).

Every backend returns the same `RunResult`: status passed | failed | timeout | killed | skipped,
the reason, captured output, duration, device, the adaptations made and the versions used.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from eval.failure_blame import blame_failure
from eval.ops_cache import CPU_ENGINE_OPS, OpsCache
from eval.programs import RUNNABLE_KINDS, prepare
from eval.requirements import Capabilities, cpu_adaptable, detect_capabilities, detect_requirements, unmet
from eval.sandbox import PIDS_MAX, free_port, run_sandboxed, scrub_env
from indexer.documents import Snippet, content_hash

STATUSES = ("passed", "failed", "timeout", "killed", "skipped")
DEFAULT_TIMEOUT_S = 180.0
DEFAULT_MEMORY_MB = 6144


@dataclass
class RunRequest:
    kind: str
    code: str
    id: str = ""
    requires: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    context: str = ""  # import lines from earlier snippets of its page (only imports are ever used)

    def __post_init__(self) -> None:
        self.requires = tuple(self.requires)
        if not self.id:
            self.id = content_hash(self.code, length=12)  # the index's snippet id for the same code

    @classmethod
    def from_snippet(cls, s: Snippet, *, timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
                     context: str = "") -> RunRequest:
        return cls(kind=s.kind, code=s.code, id=s.id, requires=tuple(s.requires), timeout_s=timeout_s, memory_mb=memory_mb,
                   context=context)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["requires"] = list(self.requires)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunRequest:
        keys = {"kind", "code", "id", "requires", "timeout_s", "memory_mb", "context"}
        return cls(**{k: v for k, v in d.items() if k in keys})


@dataclass
class RunResult:
    status: str
    reason: str = ""
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    device: str = ""
    id: str = ""
    kind: str = ""
    adaptations: list[str] = field(default_factory=list)
    requirements: list[str] = field(default_factory=list)
    isolation: list[str] = field(default_factory=list)
    torch: str = ""
    deepspeed: str = ""
    runner: str = "local"
    blame: str = ""  # for a run that did not pass: snippet | harness | environment (eval/failure_blame.py)
    blame_why: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunResult:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


class SnippetRunner(Protocol):
    name: str

    def run(self, request: RunRequest) -> RunResult: ...

    def run_many(self, requests: Sequence[RunRequest], concurrency: int = 1) -> list[RunResult]: ...


@lru_cache(maxsize=1)
def versions() -> tuple[str, str]:
    import torch

    from indexer.config_catalogue import deepspeed_version

    return str(torch.__version__), deepspeed_version()


_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)|AssertionError|KeyError|StopIteration)\b.*")


_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")


def failure_reason(stderr: str, stdout: str = "") -> str:
    """The exception line of a traceback with the lines of its message, else the last line said."""
    lines = [_RANK_PREFIX.sub("", ln).strip() for ln in stderr.splitlines()]
    lines = [ln for ln in lines if ln]
    for i in range(len(lines) - 1, -1, -1):
        if _EXC_LINE.match(lines[i]):
            more = [ln for ln in lines[i + 1:i + 4] if not ln.startswith(("For further information", "File ", "["))]
            return " | ".join([lines[i], *more])[:400]
    tail = lines or [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    return tail[-1][:400] if tail else "exited with an error and said nothing"


def _thread_map(fn: Any, items: Sequence[Any], concurrency: int) -> list[Any]:
    if concurrency <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(fn, items))


def default_extensions_dir() -> str:
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path("var/cache/torch_extensions").resolve())


NATIVE_CRASHES = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT})


def native_crash(sig: int | None) -> signal.Signals | None:
    """The native crash a run ended by, if any: its own signal, or a rank's that deepspeed's launcher
    passed on as its exit status (it exits with the rank's negative return code: -6 is status 250,
    which the sandbox reads as signal 122)."""
    for s in (sig, 128 - sig if sig is not None and 64 < sig < 128 else None):
        if s in NATIVE_CRASHES:
            return signal.Signals(s)
    return None


class LocalRunner:
    """Runs each snippet in its own sandboxed subprocess on this machine."""

    name = "local"

    def __init__(self, *, extensions_dir: str | None = None, capabilities: Capabilities | None = None, isolate: bool = True,
                 minimal_root: bool = True) -> None:
        self.extensions_dir = extensions_dir or default_extensions_dir()
        self.ops = OpsCache(self.extensions_dir)  # snippets see it copy-on-write; only its build step writes it
        self._caps = capabilities
        self.isolate = isolate
        self.minimal_root = minimal_root  # False: namespaces over the machine's own read-only file system

    @property
    def capabilities(self) -> Capabilities:
        if self._caps is None:
            self._caps = detect_capabilities()
        return self._caps

    def build_env(self, accelerator: str) -> dict[str, str]:
        """The environment of the ops cache's trusted build step: scrubbed, this accelerator, this cache."""
        return scrub_env(os.environ, {"DS_ACCELERATOR": accelerator, "TORCH_EXTENSIONS_DIR": self.extensions_dir})

    def run(self, request: RunRequest, *, gpu_ids: Sequence[int] | None = None) -> RunResult:
        caps = self.capabilities
        if gpu_ids is not None and caps.cuda:
            caps = Capabilities(device="cuda", gpus=len(gpu_ids), aio=caps.aio, gds=caps.gds, label=caps.label)
        tv, dv = versions()
        base = RunResult(status="skipped", id=request.id, kind=request.kind, device=caps.label, torch=tv, deepspeed=dv, runner=self.name)
        if request.kind not in RUNNABLE_KINDS:
            base.reason = f"{request.kind} snippets are not run"
            return base
        reqs = detect_requirements(request.kind, request.code, request.requires)
        base.requirements = sorted({r.name for r in reqs})
        missing = [r for r in unmet(reqs, caps) if not (not caps.cuda and cpu_adaptable(request.kind, r))]
        if missing:
            base.reason = "needs " + "; ".join(f"{r.name} ({r.why})" for r in missing[:3]) + f"; this runner has {caps.label}"
            return base
        prepared = prepare(request.kind, request.code, caps, context=request.context)
        base.adaptations = prepared.adaptations
        if prepared.skip:
            base.reason = prepared.skip
            return base
        extra = {
            "DS_ACCELERATOR": "cuda" if caps.cuda else "cpu",
            "TORCH_EXTENSIONS_DIR": self.extensions_dir,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
            "WANDB_MODE": "offline", "WANDB_SILENT": "true",  # no network in the sandbox: the wandb monitor logs locally
        }
        if request.kind not in ("launcher", "hostfile"):
            extra.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_SIZE": "1",
                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
        if gpu_ids is not None:
            extra["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
        build_env = self.build_env(extra["DS_ACCELERATOR"])
        if not caps.cuda and request.kind in ("ds_config", "launcher") and self.isolate:
            # the ops every CPU engine loads, built once by the trusted step before any snippet needs them
            # (else the first run compiles them in its own copy and the build step compiles them again)
            self.ops.build(CPU_ENGINE_OPS, build_env)
        if caps.aio and self.isolate and any(r.name in ("libaio", "nvme") for r in reqs):
            self.ops.build(("async_io",), build_env)  # DeepNVMe's op: ~3 min to compile on two cores, once
        started = time.time()

        def run_once() -> Any:
            return run_sandboxed(
                # CUDA reserves far more address space than it uses, so RLIMIT_AS is not applied on a GPU
                prepared.argv, prepared.files, timeout_s=request.timeout_s, memory_mb=None if caps.cuda else request.memory_mb,
                env=scrub_env(os.environ, extra), keep_cow=self.extensions_dir, isolate=self.isolate,
                minimal_root=self.minimal_root,
            )

        box = run_once()
        crash = native_crash(box.signal)
        if crash is not None and not box.timed_out and not box.limits_hit:
            # a crash in native code (torch, gloo, a compiled op) that a second run does not repeat is the
            # environment's, not the snippet's: run once more and say so; a crash that repeats stays a crash
            base.adaptations = [*prepared.adaptations, f"the first run ended by {crash.name} (a crash in native code); run again"]
            self._drop_stale_locks(started)
            box = run_once()
        if "ops_cache_copy_on_write" in box.isolation:
            # an op the run had to compile into its own copy is built for real, from deepspeed's sources
            # (`build` does nothing when the cache already holds everything the run wrote)
            self.ops.build(box.cow_written, build_env, isolate=self.isolate)
        base.stdout, base.stderr, base.duration_s, base.isolation = box.stdout, box.stderr, box.duration_s, box.isolation
        if box.timed_out or box.signal:
            self._drop_stale_locks(started)
        if box.timed_out:
            base.status, base.reason = "timeout", f"no result within {request.timeout_s:g} s (killed)"
        elif box.limits_hit and box.returncode != 0:
            base.status = "killed"
            base.reason = f"the run as a whole hit its {' and '.join(box.limits_hit)} limit (memory {request.memory_mb} MB, {PIDS_MAX} processes and threads): " + failure_reason(box.stderr)
        elif "MemoryError" in box.stderr[-3000:] or "std::bad_alloc" in box.stderr[-3000:] or "Cannot allocate memory" in box.stderr[-3000:]:
            base.status, base.reason = "killed", f"memory limit ({request.memory_mb} MB address space): " + failure_reason(box.stderr)
        elif box.signal:
            name = signal.Signals(box.signal).name if box.signal in signal.valid_signals() else str(box.signal)
            base.status, base.reason = "killed", f"ended by {name}"
        elif box.returncode == 0:
            if prepared.expect_unknown_keys:
                base.status = "failed"
                base.reason = "runs, but deepspeed silently ignores " + "; ".join(prepared.expect_unknown_keys[:3])
            else:
                base.status = "passed"
                base.reason = "; ".join(base.adaptations)[:400]
        else:
            base.status, base.reason = "failed", failure_reason(box.stderr, box.stdout)
            if prepared.expect_unknown_keys:
                base.reason = (base.reason[:250] + " || static check: " + "; ".join(prepared.expect_unknown_keys[:2]))[:600]
        if base.status in ("failed", "timeout", "killed"):
            blame = blame_failure(request.kind, request.code, base.status, base.reason, base.stderr, base.adaptations)
            base.blame, base.blame_why = blame.party, blame.why
        return base

    def run_many(self, requests: Sequence[RunRequest], concurrency: int = 1) -> list[RunResult]:
        return _thread_map(self.run, list(requests), concurrency)

    def _drop_stale_locks(self, since: float) -> None:
        """A run killed while compiling an op leaves torch's build `lock` behind, and every later
        build would wait on it forever: remove the locks this run took."""
        for lock in [*Path(self.extensions_dir).glob("*/lock"), *Path(self.extensions_dir).glob("*/*/lock")]:
            try:
                if lock.stat().st_mtime >= since - 1:
                    lock.unlink()
            except OSError:
                pass


class HttpRunner:
    """Posts snippets to a `dsqa runner serve` host (bearer token from DSQA_RUNNER_TOKEN)."""

    name = "http"

    def __init__(self, url: str, token: str | None = None, *, retries_429: int = 30) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("DSQA_RUNNER_TOKEN", "")
        self.retries_429 = retries_429

    def run(self, request: RunRequest) -> RunResult:
        import httpx

        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        delay = 0.5
        for _ in range(self.retries_429 + 1):
            try:
                r = httpx.post(f"{self.url}/run", json=request.to_json(), headers=headers, timeout=request.timeout_s + 600)
            except httpx.HTTPError as exc:
                return RunResult(status="skipped", reason=f"runner at {self.url} unreachable: {exc}", id=request.id, kind=request.kind, runner=self.url)
            if r.status_code == 429:
                time.sleep(delay)
                delay = min(delay * 1.5, 10.0)
                continue
            if r.status_code != 200:
                try:
                    detail = r.json().get("detail", r.text)
                except ValueError:
                    detail = r.text
                return RunResult(status="skipped", reason=f"runner refused ({r.status_code}): {detail}"[:400], id=request.id, kind=request.kind, runner=self.url)
            result = RunResult.from_json(r.json())
            result.runner = self.url
            return result
        return RunResult(status="skipped", reason=f"runner at {self.url} stayed busy (429)", id=request.id, kind=request.kind, runner=self.url)

    def run_many(self, requests: Sequence[RunRequest], concurrency: int = 1) -> list[RunResult]:
        return _thread_map(self.run, list(requests), concurrency)


def _ray_task(request: dict[str, Any], extensions_dir: str) -> dict[str, Any]:
    result = LocalRunner(extensions_dir=extensions_dir).run(RunRequest.from_json(request))
    result.runner = "ray"
    return result.to_json()


class RayRunner:
    """Each snippet a Ray task (`num_gpus` 1 for snippets that need a GPU, when the cluster has GPUs).
    Connects to RAY_ADDRESS when set, else starts a local instance."""

    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int | None = None, extensions_dir: str | None = None) -> None:
        import ray

        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS") or None
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "ignore_reinit_error": True}
            if address is None and num_cpus is not None:
                kwargs["num_cpus"] = num_cpus
            ray.init(address=address, **kwargs)
        self._ray = ray
        self.extensions_dir = extensions_dir or default_extensions_dir()
        self._remote = ray.remote(max_retries=0)(_ray_task)

    def _submit(self, request: RunRequest) -> Any:
        gpus = self._ray.cluster_resources().get("GPU", 0)
        reqs = detect_requirements(request.kind, request.code, request.requires)
        wants_gpu = any(r.name in ("gpu", "cuda", "fp16", "nccl", "gds", "multi-gpu") for r in reqs)
        n = 1 if wants_gpu and gpus >= 1 else 0
        return self._remote.options(num_gpus=n, num_cpus=1).remote(request.to_json(), self.extensions_dir)

    def run(self, request: RunRequest) -> RunResult:
        return RunResult.from_json(self._ray.get(self._submit(request)))

    def run_many(self, requests: Sequence[RunRequest], concurrency: int = 1) -> list[RunResult]:
        refs = [self._submit(r) for r in requests]  # Ray schedules them by the resources asked
        return [RunResult.from_json(d) for d in self._ray.get(refs)]

    def shutdown(self) -> None:
        self._ray.shutdown()


def make_runner(spec: str) -> SnippetRunner:
    """'local', 'ray' (or ray://...), or an http(s) URL of a runner service."""
    if spec == "local":
        return LocalRunner()
    if spec == "ray" or spec.startswith("ray://"):
        return RayRunner(None if spec == "ray" else spec)
    if spec.startswith(("http://", "https://")):
        return HttpRunner(spec)
    raise ValueError(f"unknown runner {spec!r}: use local, ray or http://HOST:PORT")


def runnable(snippets: Iterable[Snippet]) -> list[Snippet]:
    return [s for s in snippets if s.kind in RUNNABLE_KINDS]
