#!/usr/bin/env bash
# One prepared check for a lent GPU machine (no network): check CUDA and NCCL at each sandbox level
# (the snippets run at the strongest that works, none if neither does), build the ops a GPU engine loads, then run
# the notes' GPU snippets, the docs' GPU-only snippets and the rest of the notes on the GPU within a
# time budget (GPU_CHECK_BUDGET_S, default 300 s; each run at most GPU_CHECK_TIMEOUT_S, 120 s; the whole
# check under 8 minutes), GPU_CHECK_CONCURRENCY (4) at a time, and write the
# results as JSON under $OUT (env.json, preflight.json, notes_gpu.json, docs_gpu.json, notes_rest.json, summary.json).
#
# Needs a Python with torch (CUDA build): the repo's .venv when present, else $PYTHON, else python3.
# Nothing is downloaded there. The lent machine's image has torch but not deepspeed nor what the
# repo's modules import beyond it: `bash eval/gpu_check.sh prepare` (here, with network) puts those
# wheels, for that image's Python 3.12, in .whl/ (git-ignored); carry `.whl` and the check installs
# them first where deepspeed is missing. The docs part reads the index's snippets.jsonl (var/index,
# or $DSQA_INDEX_DIR); carry `var/index/snippets.jsonl`, else only the notes run. Ops compile into
# $TORCH_EXTENSIONS_DIR (default var/cache/torch_extensions).
#
#   bash eval/gpu_check.sh prepare    # here, once
#   OUT=/tmp/out bash eval/gpu_check.sh    # there; carry .whl and var/index/snippets.jsonl
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "prepare" ]]; then
  mkdir -p .whl && rm -f .whl/*.whl
  PYHERE=${PYTHON:-.venv/bin/python}
  "$PYHERE" -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8 || exit
  plat=(); for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do plat+=(--platform "$p"); done
  "$PYHERE" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d .whl \
    hjson==3.1.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    faiss-cpu==1.15.1 bm25s==0.3.16 PyStemmer==3.1.0 || exit
  ls -la .whl; exit 0
fi
OUT=${OUT:-var/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c "import deepspeed" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit
fi
export DS_ACCELERATOR=${DS_ACCELERATOR:-cuda} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/var/cache/torch_extensions}
mkdir -p "$TORCH_EXTENSIONS_DIR"
export GPU_CHECK_BUDGET_S=${GPU_CHECK_BUDGET_S:-300} GPU_CHECK_TIMEOUT_S=${GPU_CHECK_TIMEOUT_S:-120}
export GPU_CHECK_OUT=$OUT DSQA_INDEX_DIR=${DSQA_INDEX_DIR:-var/index}

timeout $((GPU_CHECK_BUDGET_S + GPU_CHECK_TIMEOUT_S + 30)) "$PY" - <<'EOF'
import json, os, sys, time
from pathlib import Path

t0 = time.monotonic()
out = Path(os.environ["GPU_CHECK_OUT"])
budget = float(os.environ["GPU_CHECK_BUDGET_S"])
timeout = float(os.environ["GPU_CHECK_TIMEOUT_S"])
env = {"python": sys.version.split()[0]}
try:
    import torch
    env.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
               gpus=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
    import deepspeed
    env["deepspeed"] = deepspeed.__version__
except Exception as exc:  # still write what we know
    env["error"] = f"{type(exc).__name__}: {exc}"
(out / "env.json").write_text(json.dumps(env, indent=2))
if "error" in env:
    print("environment problem:", env["error"]); sys.exit(1)

from corpus import NOTES_DIR
from eval.ops_cache import CUDA_ENGINE_OPS
from eval.requirements import detect_capabilities
from eval.runner import LocalRunner, RunRequest, RunResult
from eval.verify import page_imports, select, summarise_runs
from indexer.chunker import chunk_document
from indexer.docs_source import read_notes_dir
from indexer.documents import Snippet

caps = detect_capabilities()
print("runner:", caps.label, flush=True)
runner = LocalRunner()
# toy models: several runs share one GPU (each its own process, port and sandbox)
conc = int(os.environ.get("GPU_CHECK_CONCURRENCY", "4"))
summary = {"runner": caps.to_json(), "concurrency": conc}

def head_tail(text, n=2500):
    return text if len(text) <= 2 * n else text[:n] + "\n[...]\n" + text[-n:]

# Preflight: CUDA and a one-rank NCCL group, outside and inside the sandbox, with every thread's
# stack dumped at 45 s. (The first check, 2026-12-04, saw every sandboxed GPU run end in a C++
# error and hang until its timeout.) Snippets run only when the sandboxed program passes.
PREFLIGHT = """
import faulthandler, os, sys, time
faulthandler.dump_traceback_later(45, exit=False)
import torch
t = time.time(); x = torch.randn(1024, 1024, device="cuda"); print("cuda ok", float((x @ x).sum()), round(time.time() - t, 1), flush=True)
import torch.distributed as dist
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
y = torch.ones(4, device="cuda"); dist.all_reduce(y); torch.cuda.synchronize(); print("nccl ok", y.tolist(), flush=True)
dist.destroy_process_group(); print("done", flush=True)
"""
if caps.cuda:
    from concurrent.futures import ThreadPoolExecutor
    from eval.sandbox import free_port, run_sandboxed, scrub_env

    LEVELS = {"plain": dict(isolate=False), "namespaces": dict(minimal_root=False), "minimal_root": dict()}

    def preflight(level):
        env = scrub_env(os.environ, {"DS_ACCELERATOR": "cuda", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "2"})
        r = run_sandboxed([sys.executable, "-c", PREFLIGHT, str(free_port())], timeout_s=75, memory_mb=None, env=env, **LEVELS[level])
        return {"level": level, "isolation": r.isolation, "returncode": r.returncode, "timed_out": r.timed_out,
                "seconds": r.duration_s, "stdout": head_tail(r.stdout), "stderr": head_tail(r.stderr)}

    # and a snippet that fails after its NCCL group started must read as a failure, at once (the drivers
    # leave without the teardown a NCCL group can hang in), not as a timeout
    BOOM = RunRequest(kind="python", timeout_s=60, code='import torch, deepspeed\ndeepspeed.init_distributed()\n'
                      'x = torch.ones(2, device="cuda")\ntorch.distributed.all_reduce(x)\nraise RuntimeError("stops after the group started")\n')
    with ThreadPoolExecutor(4) as pool:
        pending = pool.submit(runner.run, BOOM)
        checks = list(pool.map(preflight, LEVELS))
        boom = pending.result()
    summary["preflight"] = {c["level"]: ("passed" if c["returncode"] == 0 else "timeout" if c["timed_out"] else f"exit {c['returncode']}") for c in checks}
    summary["preflight"]["error_after_group"] = f"{boom.status} in {boom.duration_s} s: {boom.reason[:200]}"
    checks.append({"error_after_group": boom.status, "isolation": boom.isolation, "reason": boom.reason, "stderr": head_tail(boom.stderr)})
    (out / "preflight.json").write_text(json.dumps(checks, indent=2))
    # the snippets run at the strongest isolation where CUDA and NCCL work (each result names it)
    if summary["preflight"]["minimal_root"] != "passed":
        if summary["preflight"]["namespaces"] != "passed":
            summary["sandbox"] = "none works"
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
            print("preflight:", summary["preflight"], flush=True)
            print("CUDA/NCCL does not work in the sandbox here: no snippet is run (preflight.json says why)")
            sys.exit(2)
        runner = LocalRunner(minimal_root=False)
    strongest = next(c for c in checks if c.get("level") == ("minimal_root" if runner.minimal_root else "namespaces"))
    summary["sandbox"] = " + ".join(strongest["isolation"])  # what the runs get (no minimal root where it cannot be built)
    print("preflight:", summary["preflight"], "-> runs in", summary["sandbox"], flush=True)
    # the ops a GPU engine loads, built once by the trusted step before any run needs them
    b0 = time.monotonic()
    summary["ops_built"] = runner.ops.build(CUDA_ENGINE_OPS, runner.build_env("cuda"))
    summary["ops_build_s"] = round(time.monotonic() - b0, 1)
    print("ops built:", summary["ops_built"], summary["ops_build_s"], "s", flush=True)

runs_start = time.monotonic()  # the phases share what the build left of the budget

def run_all(snippets, name, share, contexts):
    deadline = runs_start + (t0 + budget - runs_start) * share  # a batch started by then ends within one run timeout
    reqs = [RunRequest.from_snippet(s, timeout_s=timeout, context=contexts.get(s.id, "")) for s in snippets]
    by_id = {s.id: s for s in snippets}
    results = []

    def write():  # after every batch: a check cut short keeps what it ran
        rows = [{**{k: v for k, v in r.to_json().items() if k not in ("stdout", "stderr")}, "path": by_id[r.id].path,
                 "stderr": head_tail(r.stderr, 1500) if r.status not in ("passed", "skipped") else ""} for r in results]
        report = {**summarise_runs(results), "results": rows}
        (out / f"{name}.json").write_text(json.dumps(report, indent=2))
        return report

    for i in range(0, len(reqs), conc):
        if time.monotonic() > deadline:
            results += [RunResult(status="skipped", reason="gpu_check time budget spent", id=r.id, kind=r.kind) for r in reqs[i:]]
            break
        results += runner.run_many(reqs[i:i + conc], concurrency=conc)
        write()
    report = write()
    print(name, report["by_status"], round(time.monotonic() - t0), "s", flush=True)
    return report

# what only this machine can check comes first: the notes' GPU snippets, then the docs', then the
# rest of the notes (those also run on a CPU, in the tests)
notes = select([s for d in read_notes_dir(NOTES_DIR) for s in chunk_document(d)[1]], "all")
note_ctx = page_imports(notes)
notes_gpu = select(notes, "all", gpu_only=True)
summary["notes_gpu"] = run_all(notes_gpu, "notes_gpu", 0.25, note_ctx)["by_status"]
ledger = Path(os.environ["DSQA_INDEX_DIR"]) / "snippets.jsonl"
if ledger.is_file():
    docs = [Snippet.from_json(json.loads(l)) for l in ledger.read_text().splitlines() if l.strip()]
    summary["docs_gpu"] = run_all(select(docs, "docs", gpu_only=True), "docs_gpu", 0.85, page_imports(docs))["by_status"]
else:
    summary["docs_gpu"] = f"no {ledger}: carry var/index to check the docs' GPU-only snippets"
gpu_ids = {g.id for g in notes_gpu}
summary["notes_rest"] = run_all([s for s in notes if s.id not in gpu_ids], "notes_rest", 1.0, note_ctx)["by_status"]
summary["seconds"] = round(time.monotonic() - t0, 1)
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary))
EOF
rc=$?
echo "gpu_check exit $rc; results in $OUT"
exit $rc
