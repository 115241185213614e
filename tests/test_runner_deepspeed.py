"""Snippets run for real against the installed deepspeed on CPU: configs, the Flops Profiler, the
launcher; the runner service and the Ray backend give the same results as the local runner;
`dsqa eval answers` over a small server; every untagged notes snippet passes.

Ops compile on first use into TORCH_EXTENSIONS_DIR (default var/cache/torch_extensions) and are
reused after that.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eval.runner import HttpRunner, LocalRunner, RunRequest, RunResult
from indexer.snippet_status import BLAME_SNIPPET
from tests.conftest import ServerThread

pytestmark = pytest.mark.slow

ZERO2_BF16 = json.dumps({
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True},
    "checkpoint": {"tag_validation": "Warn"},
})
MISSPELT = json.dumps({
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 1, "reduce_bucket_sise": 500000},
})
ZENFLOW_OVERLAP = json.dumps({  # ZenFlow's overlapped step starts its optimizer in a spawned process
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "zenflow": {"topk_ratio": 0.05, "update_interval": 4, "full_warm_up_rounds": 0, "overlap_step": True}},
})
FLOPS_CONFIG = json.dumps({
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "flops_profiler": {"enabled": True, "profile_step": 2, "module_depth": -1, "top_modules": 1, "detailed": False},
})
FLOPS_PYTHON = """\
import torch
from deepspeed.profiling.flops_profiler import get_model_profile

model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
flops, macs, params = get_model_profile(model, input_shape=(4, 64), print_profile=False, as_string=False)
assert macs == 4 * (64 * 128 + 128 * 8), macs
print("MACs", macs, "params", params)
"""


@pytest.fixture(scope="module")
def runner() -> LocalRunner:
    return LocalRunner()


def test_zero2_bf16_config_passes_with_checkpoint(runner: LocalRunner) -> None:
    r = runner.run(RunRequest(kind="ds_config", code=ZERO2_BF16, timeout_s=600))
    assert r.status == "passed", r.stderr[-2000:]
    result = json.loads(r.stdout.split("DSQA_RESULT ", 1)[1].splitlines()[0])
    assert result["zero_stage"] == 2 and result["dtype"] == "torch.bfloat16" and result["optimizer_steps"] >= 3
    assert result["checkpoint"].startswith("saved and loaded")
    assert r.adaptations == ["train_batch_size 16 -> 4 for world size 1 (micro 4 x accumulation 1)"]
    assert r.device == "cpu" and r.deepspeed and r.torch


def test_misspelt_key_fails_naming_it(runner: LocalRunner) -> None:
    r = runner.run(RunRequest(kind="ds_config", code=MISSPELT, timeout_s=600))
    assert r.status == "failed"
    assert "reduce_bucket_sise" in r.reason and "reduce_bucket_size" in r.reason


def test_a_config_whose_optimizer_spawns_a_process_runs(runner: LocalRunner) -> None:
    """The spawned child re-imports the driver: without its __main__ guard the child ran
    deepspeed.initialize again (EADDRINUSE) and the parent waited out the whole timeout."""
    r = runner.run(RunRequest(kind="ds_config", code=ZENFLOW_OVERLAP, timeout_s=120))
    assert r.status == "passed", (r.reason, r.stderr[-2000:])
    assert json.loads(r.stdout.split("DSQA_RESULT ", 1)[1].splitlines()[0])["optimizer_steps"] >= 1


def test_an_error_after_the_process_group_starts_is_a_failure_with_its_traceback(runner: LocalRunner) -> None:
    """init_process_group installs torch's own excepthook, which buffers what the hook before it prints:
    the drivers' hook (print, then leave without the teardown a NCCL group can hang in) must still
    get the traceback out, and the run ends at once as a failure naming the error."""
    code = ('import torch, deepspeed\ndeepspeed.init_distributed(dist_backend="gloo")\n'
            'x = torch.ones(2)\ntorch.distributed.all_reduce(x)\nraise RuntimeError("stops after the group started")\n')
    r = runner.run(RunRequest(kind="python", code=code, timeout_s=120))
    assert r.status == "failed" and "RuntimeError: stops after the group started" in r.reason, (r.reason, r.stderr[-2000:])
    assert 'raise RuntimeError("stops after the group started")' in r.stderr  # the traceback, not the message alone
    assert r.duration_s < 60 and not any("run again" in a for a in r.adaptations)


def test_a_fragment_reading_a_zero_checkpoint_runs_against_a_real_one(runner: LocalRunner) -> None:
    """The ZeRO-3 page's zero_to_fp32 fragments read a checkpoint an earlier step saved: the harness saves a real ZeRO
    stage 2 one first, so the conversion and the load into the model run for real, and a fragment's own bug (the
    page's `state_dict.item()`, for `.items()`) is a failure of the snippet, not of the harness."""
    head = "from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint\n"
    ok = runner.run(RunRequest(kind="python", timeout_s=300, code=head + "state_dict = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir)\n"
                               "model = model.cpu()\nmodel.load_state_dict(state_dict)\nassert sorted(state_dict) == sorted(model.state_dict())\n"))
    assert ok.status == "passed", (ok.reason, ok.stderr[-2000:])
    assert any(a.startswith("a real ZeRO stage 2 checkpoint") for a in ok.adaptations)
    bad = runner.run(RunRequest(kind="python", timeout_s=300, code=head + "state_dict = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, "
                                "lazy_mode=True)\nfor name, t in state_dict.item():\n    print(name, t.contiguous())\n"))
    assert bad.status == "failed" and "has no attribute 'item'" in bad.reason, (bad.reason, bad.stderr[-2000:])
    assert bad.blame == BLAME_SNIPPET, bad.blame_why


# fragments whose page state the harness builds, and the adaptation that says so:
# - a manual backward of the scaled loss (refused by a ZeRO stage 0 engine) and moving the optimizer's states off the
#   device and back, on the stage 1 engine the plan asks for;
# - the ALST page's activation-offload fragment, which calls its model Hugging Face style (`model(**batch).loss`)
#   inside deepspeed's offloading context, on dict batches and the tiny model's HF-style output;
# - the pipeline page's loop (`engine.train_batch`, `args.steps`) on a one-stage PipelineEngine; the custom model
#   parallelism page's mpu calls on deepspeed's own grid; a method body's excerpt that returns; the training page's
#   coalesced gradient reduction, cutting each batch with batch.split on a ZeRO stage 1 engine
PAGE_STATE_FRAGMENTS = [
    ("from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum\n"
     "for batch in data_loader:\n    loss = model_engine(batch)\n    model_engine.scale(loss).backward()\n    model_engine.step()\n"
     "model_engine.offload_states(include=[OffloadStateTypeEnum.hp_params, OffloadStateTypeEnum.optim_states])\n"
     "model_engine.reload_states()\n", "runs ZeRO stage 1"),
    ("from deepspeed.runtime.activation_checkpointing.offload_activations import (\n"
     "    get_checkpoint_hidden_states_offloading_ctx_manager,\n)\n\n"
     "ctx = get_checkpoint_hidden_states_offloading_ctx_manager()\nwith ctx:\n"
     "    loss = model(**batch).loss\n    loss.backward()\nassert loss.item() > 0 and model(**batch).logits.shape == batch['labels'].shape\n",
     "dicts of input_ids and labels"),
    ("train_loader = deepspeed.utils.RepeatingLoader(train_loader)\ntrain_iter = iter(train_loader)\n"
     "for step in range(args.steps):\n    loss = engine.train_batch(data_iter=train_iter)\n"
     "assert type(engine).__name__ == 'PipelineEngine' and engine.global_steps == 2\n", "deepspeed's PipelineEngine"),
    ("assert mpu.get_model_parallel_world_size() == 1 and mpu.get_data_parallel_rank() == 0\n"
     "print(mpu.get_data_parallel_group())\n", "PipelineParallelGrid"),
    ("y = self(x)\nassert y.shape == x.shape\nreturn y\n", "run as the body of a function"),
    ("for batch in data_loader:\n    chunks = batch.split(chunk_size)\n    with model_engine.coalesce_grad_reduction():\n"
     "        for chunk in chunks:\n            loss = model_engine(chunk)\n            model_engine.backward(loss)\n"
     "    model_engine.step()\nassert loss.dim() == 0 and model_engine.global_steps == len(data_loader)\n", "single tensors"),
]


@pytest.mark.parametrize(("code", "adaptation"), PAGE_STATE_FRAGMENTS, ids=["zero-engine-calls", "hugging-face-call", "pipeline-engine", "mpu-grid", "method-body", "coalesced-reduction"])
def test_a_fragment_runs_on_the_page_state_the_harness_builds(runner: LocalRunner, code: str, adaptation: str) -> None:
    r = runner.run(RunRequest(kind="python", code=code, timeout_s=300))
    assert r.status == "passed", (r.reason, r.stderr[-2000:])
    assert any(adaptation in a for a in r.adaptations)


def test_flops_profiler_snippets_pass(runner: LocalRunner) -> None:
    py = runner.run(RunRequest(kind="python", code=FLOPS_PYTHON, timeout_s=300))
    assert py.status == "passed", py.stderr[-2000:]
    cfg = runner.run(RunRequest(kind="ds_config", code=FLOPS_CONFIG, timeout_s=600))
    assert cfg.status == "passed", cfg.stderr[-2000:]
    assert "Flops Profiler" in cfg.stdout + cfg.stderr  # the profile printed at profile_step


def test_a_hub_model_is_stood_in_at_toy_size_and_init_inference_runs_on_cpu(runner: LocalRunner) -> None:
    """No network in the sandbox: a Hub id of a known family becomes a tiny local model of that
    architecture (random weights), said in the adaptations; init_inference itself runs on a CPU."""
    code = ('import torch, deepspeed\nfrom transformers import AutoModelForCausalLM\n'
            'model = AutoModelForCausalLM.from_pretrained("facebook/opt-1.3b")\n'
            'engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": 1}, dtype=torch.float)\n'
            'out = engine(torch.tensor([[1, 2, 3]]))\nprint("logits", tuple(out.logits.shape))\n')
    r = runner.run(RunRequest(kind="python", code=code, timeout_s=300))
    assert r.status == "passed", r.stderr[-2000:]
    assert "logits (1, 3, " in r.stdout
    assert any(a.startswith("'facebook/opt-1.3b' -> a tiny opt of random weights") for a in r.adaptations)
    unknown = runner.run(RunRequest(kind="python", code='from transformers import AutoModel\nm = AutoModel.from_pretrained("acme/widget-9b")'))
    assert unknown.status == "skipped" and "needs network (downloads acme/widget-9b" in unknown.reason


def test_launcher_snippet_runs_one_process(runner: LocalRunner) -> None:
    r = runner.run(RunRequest(kind="launcher", code="deepspeed train.py --deepspeed --deepspeed_config ds_config.json", timeout_s=600))
    assert r.status == "passed", r.stderr[-3000:]
    assert '"world_size": 1' in r.stdout and '"optimizer_steps": 3' in r.stdout


def test_tensor_parallel_config_and_launcher_run_several_cpu_processes(runner: LocalRunner) -> None:
    """AutoTP training for real: four CPU processes over gloo, each holding a quarter of q_proj."""
    tp = '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}, "tensor_parallel": {"autotp_size": 4, "preset_model": "llama"}}'
    r = runner.run(RunRequest(kind="ds_config", code=tp, timeout_s=600))
    assert r.status == "passed", r.stderr[-3000:]
    results = [json.loads(m) for m in re.findall(r"DSQA_RESULT (\{[^{}]*\})", r.stdout)]  # four ranks share one stdout
    assert len(results) == 4 and {x["world_size"] for x in results} == {4} and {x["q_proj_rows"] for x in results} == {8}
    assert all(x["optimizer_steps"] >= 3 and x["model"] == "tiny llama" for x in results)
    two = runner.run(RunRequest(kind="launcher", code="deepspeed --num_gpus 2 train.py", timeout_s=600))
    assert two.status == "passed", two.stderr[-3000:]
    assert two.stdout.count('"world_size": 2') == 2


# the same snippets through the local runner, the runner service and Ray
SAME = [
    RunRequest(kind="python", code="import deepspeed\nprint(deepspeed.__version__)", timeout_s=300),
    RunRequest(kind="ds_config", code=MISSPELT, timeout_s=600),
    RunRequest(kind="ds_config", code='{"train_batch_size": 8, "fp16": {"enabled": true}}'),
    RunRequest(kind="python", code="model.train()\nout = model(x)\nprint(tuple(out.shape))", timeout_s=300),
]


def _key(r: RunResult) -> tuple[str, str, str]:
    # a native crash the runner ran past once (said in the reason) is this machine's luck, not the snippet's
    return r.id, r.status, re.sub(r"; the first run ended by SIG\w+ \(a crash in native code\); run again", "", r.reason)


@pytest.fixture(scope="module")
def local_results(runner: LocalRunner) -> list[RunResult]:
    return runner.run_many(SAME)


def test_runner_service_gives_the_same_results(local_results: list[RunResult]) -> None:
    from eval.runner_service import create_runner_app

    app = create_runner_app(token="tok", allowed=None)
    with ServerThread(app) as server:
        remote = HttpRunner(server.url, token="tok").run_many(SAME, concurrency=2)
    assert [r.status for r in local_results] == ["passed", "failed", "passed", "passed"]  # fp16 runs on CPU as bf16
    assert [_key(r) for r in remote] == [_key(r) for r in local_results]
    assert all(r.runner == server.url for r in remote)


def test_ray_backend_gives_the_same_results(local_results: list[RunResult]) -> None:
    pytest.importorskip("ray")
    from eval.runner import RayRunner

    ray_runner = RayRunner(num_cpus=1)
    try:
        results = ray_runner.run_many(SAME)
    finally:
        ray_runner.shutdown()
    assert [_key(r) for r in results] == [_key(r) for r in local_results]
    assert all(r.runner == "ray" for r in results)


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    from tests.small_index import build_small_index, small_app

    with ServerThread(small_app(build_small_index(tmp_path_factory))) as server:
        yield server


def test_eval_answers_on_three_questions(small_server: ServerThread, tmp_path: Path) -> None:
    from app.cli import main

    questions = tmp_path / "q.jsonl"
    rows = [
        {"id": "q1", "question": "How do I set the ZeRO stage and overlap_comm?", "lang": "en", "topic": "zero",
         "gold": [{"evidence": "Set the stage in the config"}], "must_mention": ["overlap_comm"]},
        {"id": "q2", "question": "How do I launch training with deepspeed on 2 GPUs?", "lang": "en", "topic": "launcher",
         "gold": [{"evidence": "Run it"}], "must_mention": ["--num_gpus"]},
        {"id": "q3", "question": "流水线并行如何构建模型?", "lang": "zh", "topic": "pipeline",
         "gold": [{"evidence": "Use PipelineModule to build it"}], "must_mention": ["PipelineModule"]},
    ]
    questions.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["eval", "answers", "--questions", str(questions), "--url", small_server.url + "/ask", "--runner", "local",
               "--out", str(out), "--concurrency", "2", "--timeout", "600"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["questions"] == 3 and summary["errors"] == 0
    assert summary["retrieval"]["all"]["hit@10"] > 0 and set(summary["latency_ms"]) >= {"p50", "p90", "p99"}
    kinds = summary["snippets"]["by_kind"]
    assert kinds["ds_config"]["passed"] == 1 and kinds["launcher"]["passed"] == 1  # --num_gpus 2: two CPU processes
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all("snippet_runs" in json.loads(x) for x in lines)
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 4 and "<script" not in page


def _untagged_notes_snippets() -> list:
    from corpus import NOTES_DIR
    from indexer.chunker import chunk_document
    from indexer.docs_source import read_notes_dir

    snippets = [s for doc in read_notes_dir(NOTES_DIR) for s in chunk_document(doc)[1]]
    return [s for s in snippets if s.kind in ("ds_config", "python", "launcher") and not s.requires]


def test_every_untagged_notes_snippet_passes(runner: LocalRunner) -> None:
    snippets = _untagged_notes_snippets()
    assert len(snippets) >= 30
    requests = [RunRequest.from_snippet(s, timeout_s=600) for s in snippets]
    results = runner.run_many(requests, concurrency=int(os.environ.get("DSQA_TEST_RUN_CONCURRENCY", "2")))
    bad = [f"{s.path} [{s.kind} {s.id}]: {r.status}: {r.reason}" for s, r in zip(snippets, results, strict=True) if r.status != "passed"]
    assert not bad, "notes snippets that do not pass on CPU:\n" + "\n".join(bad)


def test_build_ops_names_an_op_it_cannot_build() -> None:
    """`dsqa runner build-ops` with a name no op builder has: that name is said, exit 1, no traceback."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    done = subprocess.run([sys.executable, "-m", "app.cli", "runner", "build-ops", "--ops", "not_an_op"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "could not build ['not_an_op']" in done.stdout, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
