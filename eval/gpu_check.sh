#!/usr/bin/env bash
# One prepared check for a lent GPU machine (no network): run the notes snippets and the docs'
# GPU-only snippets on the GPU within a time budget (default 470 s, under 8 minutes), and write
# the results as JSON under $OUT (env.json, notes.json, docs_gpu.json, summary.json).
#
# Needs a Python with torch (CUDA build) and deepspeed==0.19.8 importable: the repo's .venv when
# present, else $PYTHON, else python3. Nothing is downloaded. The docs part reads the index's
# snippets.jsonl (var/index, or $DSQA_INDEX_DIR); carry it along if you want it, else only the
# notes run. Ops compile into $TORCH_EXTENSIONS_DIR (default var/cache/torch_extensions).
#
#   OUT=/tmp/out bash eval/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-var/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export DS_ACCELERATOR=${DS_ACCELERATOR:-cuda} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/var/cache/torch_extensions}
mkdir -p "$TORCH_EXTENSIONS_DIR"
export GPU_CHECK_BUDGET_S=${GPU_CHECK_BUDGET_S:-470} GPU_CHECK_TIMEOUT_S=${GPU_CHECK_TIMEOUT_S:-240}
export GPU_CHECK_OUT=$OUT DSQA_INDEX_DIR=${DSQA_INDEX_DIR:-var/index}

timeout $((GPU_CHECK_BUDGET_S + 60)) "$PY" - <<'EOF'
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
from eval.requirements import detect_capabilities
from eval.runner import LocalRunner, RunRequest, RunResult
from eval.verify import GPU_REQUIREMENTS, select, summarise_runs
from indexer.chunker import chunk_document
from indexer.docs_source import read_notes_dir
from indexer.documents import Snippet

caps = detect_capabilities()
print("runner:", caps.label, flush=True)
runner = LocalRunner()
conc = max(1, min(4, caps.gpus or 1))

def run_all(snippets, name, share):
    deadline = t0 + budget * share
    reqs = [RunRequest.from_snippet(s, timeout_s=timeout) for s in snippets]
    results = []
    for i in range(0, len(reqs), conc):
        if time.monotonic() > deadline:
            results += [RunResult(status="skipped", reason="gpu_check time budget spent", id=r.id, kind=r.kind) for r in reqs[i:]]
            break
        results += runner.run_many(reqs[i:i + conc], concurrency=conc)
    by_id = {s.id: s for s in snippets}
    rows = [{**{k: v for k, v in r.to_json().items() if k not in ("stdout", "stderr")}, "path": by_id[r.id].path,
             "stderr_tail": r.stderr[-1500:] if r.status not in ("passed", "skipped") else ""} for r in results]
    report = {**summarise_runs(results), "results": rows}
    (out / f"{name}.json").write_text(json.dumps(report, indent=2))
    print(name, report["by_status"], flush=True)
    return report

notes = [s for d in read_notes_dir(NOTES_DIR) for s in chunk_document(d)[1]]
# GPU-tagged notes first (what only this machine can check), then the rest
notes = select(notes, "all")
notes.sort(key=lambda s: not any(t in GPU_REQUIREMENTS for t in s.requires))
summary = {"runner": caps.to_json(), "notes": run_all(notes, "notes", 0.6)["by_status"]}
ledger = Path(os.environ["DSQA_INDEX_DIR"]) / "snippets.jsonl"
if ledger.is_file():
    docs = [Snippet.from_json(json.loads(l)) for l in ledger.read_text().splitlines() if l.strip()]
    summary["docs_gpu"] = run_all(select(docs, "docs", gpu_only=True), "docs_gpu", 1.0)["by_status"]
else:
    summary["docs_gpu"] = f"no {ledger}: carry var/index to check the docs' GPU-only snippets"
summary["seconds"] = round(time.monotonic() - t0, 1)
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary))
EOF
rc=$?
echo "gpu_check exit $rc; results in $OUT"
exit $rc
