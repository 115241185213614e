"""The snippet runner's pure parts, the ledger and stamps, the CLI's usage errors, the runner
service's auth, hash check and queue bound (with a stub runner: no deepspeed runs here)."""

from __future__ import annotations

import ast
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from eval.answers_eval import percentiles, render_report, svg_bars, svg_histogram
from eval.config_program import adapt_config
from eval.programs import prepare
from eval.python_program import free_names
from eval.requirements import CPU_RANKS, Capabilities, Requirement, cpu_adaptable, detect_requirements, unmet
from eval.runner import LocalRunner, RunRequest, RunResult, failure_reason
from eval.sandbox import is_secret_name, scrub_env
from eval.verify import write_ledger
from indexer.documents import Snippet, content_hash
from indexer.launcher_line import include_slots
from indexer.snippet_status import read_ledger, verdict
from tests.conftest import ServerThread

CPU = Capabilities(device="cpu")
GPU8 = Capabilities(device="cuda", gpus=8, aio=True, label="cuda (8x H200)")


def names(reqs) -> set[str]:
    return {r.name for r in reqs}


@pytest.mark.parametrize(
    ("kind", "code", "expected"),
    [
        ("ds_config", '{"train_batch_size": 8, "fp16": {"enabled": true}}', {"fp16"}),
        ("ds_config", '{"train_batch_size": 8, "bf16": {"enabled": true}}', set()),
        ("ds_config", '{"train_batch_size": "auto"}', {"hf-auto"}),
        ("ds_config", '{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}}', {"nvme"}),
        ("ds_config", '{"train_batch_size": 8, "optimizer": {"type": "Lamb"}}', {"cuda"}),
        ("python", "import torch\nx = torch.ones(2).cuda()", {"cuda"}),
        ("python", "from deepspeed.ops.adam import FusedAdam\nopt = FusedAdam(params)", {"cuda"}),
        ("python", "import torch\nif torch.cuda.is_available():\n    print(1)", set()),
        ("python", "model = model.half()", {"fp16"}),
        ("python", "import deepspeed\ndeepspeed.init_distributed(dist_backend='nccl')", {"nccl"}),
        ("python", "from deepspeed.ops.op_builder import AsyncIOBuilder\nh = AsyncIOBuilder().load().aio_handle()", {"libaio"}),
        ("python", "from deepspeed.io import gds_handle", {"gds"}),
        ("python", "net = PipelineModule(layers=layers, num_stages=4)", {"multi-gpu"}),
        ("python", "import transformers_not_here_xyz", {"package:transformers_not_here_xyz"}),
        ("python", "cfg = {'fp16': {'enabled': True}}\nDeepSpeedConfig(cfg)", set()),  # parsed, not trained
        ("python", "from transformers import AutoModel\nm = AutoModel.from_pretrained('bert-base-uncased')", {"network"}),
        ("python", "m = AutoModel.from_pretrained('./local_dir')", set()),
        ("python", "with get_accelerator().device(0):\n    pass", {"cuda"}),
        ("ds_config", '{"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_quantized_weights": true}}', {"cuda"}),
        ("ds_config", '{"train_batch_size": 8, "wandb": {"enabled": true}}', {"package:wandb", "network"}),
        ("launcher", "deepspeed --num_gpus 8 train.py --deepspeed", {"multi-gpu"}),
        ("launcher", "deepspeed --num_nodes 2 --num_gpus 8 train.py", {"multi-node", "multi-gpu"}),
        ("launcher", "deepspeed --hostfile=myhosts train.py", {"multi-node"}),
        ("launcher", "deepspeed train.py --deepspeed_config ds.json", set()),
        ("hostfile", "worker-1 slots=4\nworker-2 slots=4", {"multi-node"}),
        ("hostfile", "worker-1 slots=4", set()),
    ],
)
def test_requirements_are_detected(kind: str, code: str, expected: set[str]) -> None:
    assert names(detect_requirements(kind, code)) == expected


def test_tags_and_capabilities() -> None:
    reqs = detect_requirements("python", "print(1)", ("gpu", "cpu"))
    assert names(reqs) == {"gpu"}
    assert names(unmet(reqs, CPU)) == {"gpu"} and unmet(reqs, GPU8) == []
    multi = detect_requirements("launcher", "deepspeed --num_gpus 4 train.py")
    assert unmet(multi, GPU8) == [] and names(unmet(multi, Capabilities(device="cuda", gpus=1))) == {"multi-gpu"}
    assert names(unmet(detect_requirements("python", "x", ("multi-node",)), GPU8)) == {"multi-node"}


def test_skipped_on_cpu_with_reason_and_no_process() -> None:
    r = LocalRunner(capabilities=CPU).run(RunRequest(kind="python", code="import torch\nx = torch.ones(2).half().cuda()"))
    assert r.status == "skipped" and "cuda" in r.reason and "cpu" in r.reason and r.duration_s == 0
    r = LocalRunner(capabilities=CPU).run(RunRequest(kind="shell", code="ls"))
    assert r.status == "skipped"


def test_only_world_size_values_are_adapted() -> None:
    cfg, notes = adapt_config({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
                               "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "gradient_clipping": 1.0,
                               "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}})
    assert cfg["train_batch_size"] == 8 and cfg["zero_optimization"]["zero_hpz_partition_size"] == 1
    assert cfg["gradient_clipping"] == 1.0 and cfg["optimizer"]["params"] == {"lr": 1e-4}
    assert any("train_batch_size 64 -> 8" in n for n in notes) and any("zero_hpz_partition_size 8 -> 1" in n for n in notes)
    frag, notes = adapt_config({"zero_optimization": {"stage": 2}})
    assert frag["train_micro_batch_size_per_gpu"] == 2 and frag["optimizer"]["params"]["torch_adam"] is True
    assert len(notes) == 2
    same, notes = adapt_config({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW"}})
    assert same["train_batch_size"] == 32 and notes == []  # accumulation 8 at world size 1: nothing to change


def test_nvme_offload_runs_in_a_folder_of_the_run_and_says_so() -> None:
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
           "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}, "offload_optimizer": {"device": "cpu"}}}
    p = prepare("ds_config", json.dumps(cfg), CPU)
    run_cfg = json.loads(p.files["ds_config.json"])["zero_optimization"]
    assert run_cfg["offload_param"]["nvme_path"] == "nvme_swap" and run_cfg["offload_param"]["buffer_size"] == 100_000
    assert run_cfg["offload_optimizer"] == {"device": "cpu"}  # only NVMe blocks are touched
    assert any("/local_nvme -> a folder of the run" in a and "not an NVMe drive" in a for a in p.adaptations)
    assert any("none is swapped out" in a for a in p.adaptations)  # what the tiny run does not exercise, said


def test_misspelt_key_is_named_before_running() -> None:
    p = prepare("ds_config", '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2, "overlap_comms": true}}', CPU)
    assert p.expect_unknown_keys and "overlap_comms" in p.expect_unknown_keys[0] and "overlap_comm'" in p.expect_unknown_keys[0]


def test_free_names_and_prelude() -> None:
    code = "import torch\nfor batch in data_loader:\n    loss = model_engine(batch)\n    model_engine.backward(loss)\ndef f(a):\n    return a + b\n"
    assert free_names(ast.parse(code)) == ["data_loader", "model_engine", "b"]
    p = prepare("python", "engine.train()\nprint(args.local_rank)", CPU)
    assert not p.skip and p.adaptations == ["prelude supplied: engine, args"]
    assert json.loads(p.files["plan.json"])["names"] == ["engine", "args"]
    p = prepare("python", "out = my_model(tokens)", CPU)
    assert p.skip.startswith("fragment") and "my_model" in p.skip and "tokens" in p.skip
    assert prepare("python", "engine.step(\n", CPU).skip.startswith("fragment: not complete Python")
    assert prepare("python", "import torch\ntorch.distributed.init_process_group(...)", CPU).skip == "fragment: '...' placeholders in a call"
    assert not prepare("python", ">>> import torch\n>>> print(torch.ones(1))", CPU).skip


def test_a_fragment_reading_a_zero_checkpoint_back_gets_one_saved_first() -> None:
    """zero_to_fp32's readers on the prelude's checkpoint folder find a real checkpoint there (the state an earlier
    step of the page writes), said in the adaptations; a fragment that saves its own, or names its own path, does not."""
    reader = ("from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint\n"
              "state_dict = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir)\nmodel.load_state_dict(state_dict)\n")
    p = prepare("python", reader, CPU)
    assert json.loads(p.files["plan.json"])["saved_checkpoint"] is True
    assert any(a.startswith("a real ZeRO stage 2 checkpoint") and "'checkpoints'" in a for a in p.adaptations)
    for other in ("engine.save_checkpoint(save_dir)\n" + reader,  # saves its own first
                  reader.replace("(checkpoint_dir)", "('/path/to/ckpt')"),  # a path of its own: the prelude names no folder
                  "engine.train()\n"):
        p = prepare("python", other, CPU)
        assert not p.skip and json.loads(p.files["plan.json"])["saved_checkpoint"] is False, other
        assert not any("ZeRO stage 2 checkpoint" in a for a in p.adaptations)


def test_a_fragment_calling_what_only_a_zero_optimizer_has_gets_a_zero_engine() -> None:
    """The prelude's engine runs ZeRO stage 0 with torch's AdamW; a fragment moving the engine's states off the device
    (`offload_states`) or scaling a loss for a manual backward asks the plan for stage 1, and says so."""
    p = prepare("python", "loss = model_engine(batch)\nscaled = model_engine.scale(loss)\nscaled.backward()\nmodel_engine.step()\n", CPU)
    assert json.loads(p.files["plan.json"])["zero_stage"] == 1
    assert "the prelude's engine runs ZeRO stage 1 (its default is stage 0): `scale` needs a ZeRO optimizer" in p.adaptations
    p = prepare("python", "ds_engine.offload_states()\nds_engine.reload_states()\n", CPU)
    assert any("`offload_states`, `reload_states` need a ZeRO optimizer" in a for a in p.adaptations)
    for other in ("engine.train()\n", "x = torch.ones(2)\ny = x.scale(2)\n"):  # no such call, or `scale` of something else
        p = prepare("python", other, CPU)
        assert json.loads(p.files["plan.json"])["zero_stage"] == 0 and not any("ZeRO stage 1" in a for a in p.adaptations)


def test_a_fragment_calling_a_model_hugging_face_style_gets_dict_batches() -> None:
    """`model(**batch).loss` on the prelude's batch: the plan asks for dict batches and says so; a fragment that builds
    its own batch, or calls the model positionally, keeps the tuple batches."""
    p = prepare("python", "loss = model(**batch).loss\nloss.backward()\n", CPU)
    assert json.loads(p.files["plan.json"])["hf_batches"] is True
    assert any("dicts of input_ids and labels" in a and "model(**batch)" in a for a in p.adaptations)
    for other in ("batch = {'input_ids': torch.ones(2, 16)}\nout = model(**batch)\n", "loss = model(batch)\n"):
        p = prepare("python", other, CPU)
        assert json.loads(p.files["plan.json"])["hf_batches"] is False and not any("dicts of input_ids" in a for a in p.adaptations)


def test_a_fragment_calling_the_pipeline_engine_gets_one() -> None:
    """`engine.train_batch()` (or a model built into one) is the pipeline engine's: the plan asks for a PipelineModule
    and says so; a flag of the page's own script read as a count (`range(args.steps)`) is set to 2 and said; an
    engine call of every engine, or `args` read otherwise, changes nothing."""
    p = prepare("python", "train_iter = iter(train_loader)\nfor step in range(args.steps):\n    loss = engine.train_batch(data_iter=train_iter)\n", CPU)
    plan = json.loads(p.files["plan.json"])
    assert plan["pipeline"] is True and plan["arg_counts"] == ["steps"]
    assert any("PipelineModule" in a and "`train_batch` is the pipeline engine's" in a for a in p.adaptations)
    assert "args.steps (its page's own command-line flag, read as a count) set to 2" in p.adaptations
    for other in ("engine.train()\nprint(args.local_rank)\n", "for i in range(3):\n    loss = engine(batch)\n"):
        plan = json.loads(prepare("python", other, CPU).files["plan.json"])
        assert plan["pipeline"] is False and plan["arg_counts"] == [], other


def test_a_fragment_cutting_its_batch_gets_tensor_batches() -> None:
    """`batch.split(chunk_size)` on the prelude's batch: one tensor per batch (the tiny model answers it with the loss),
    said; `coalesce_grad_reduction` asks for a ZeRO engine; a fragment that only iterates its batches keeps tuples."""
    code = ("for batch in data_loader:\n    chunks = batch.split(chunk_size)\n    with model_engine.coalesce_grad_reduction():\n"
            "        for chunk in chunks:\n            model_engine.backward(model_engine(chunk))\n    model_engine.step()\n")
    p = prepare("python", code, CPU)
    plan = json.loads(p.files["plan.json"])
    assert plan["tensor_batches"] is True and plan["zero_stage"] == 1
    assert any("single tensors (inputs and targets side by side)" in a for a in p.adaptations)
    for other in ("for batch in data_loader:\n    loss = model_engine(batch)\n", "x = torch.ones(4)\nparts = x.split(2)\n"):
        plan = json.loads(prepare("python", other, CPU).files["plan.json"])
        assert plan["tensor_batches"] is False, other


def test_mpu_is_deepspeeds_grid_only_when_its_methods_are_called() -> None:
    p = prepare("python", "mpu.get_model_parallel_rank()\nmpu.get_data_parallel_group()\n", CPU)
    assert json.loads(p.files["plan.json"])["mpu_grid"] is True and any("PipelineParallelGrid" in a for a in p.adaptations)
    p = prepare("python", "engine, _, _, _ = deepspeed.initialize(model=model, mpu=mpu, config=ds_config)\n", CPU)
    assert json.loads(p.files["plan.json"])["mpu_grid"] is False  # passed along as None, as before


def test_a_function_body_excerpt_runs_inside_a_function() -> None:
    """A `return` outside any function is an excerpt of a method's body: it runs as the body of a function called
    once (the static check calls it an excerpt too); a fragment whose returns are inside its own functions is as written."""
    p = prepare("python", "y = self(x)\nreturn y\n", CPU)
    assert p.files["snippet.py"].startswith("def _excerpt():\n    global y\n    y = self(x)\n    return y\n")
    assert p.files["snippet.py"].rstrip().endswith("_excerpt()")
    assert "an excerpt of a function's body (it returns): run as the body of a function called once" in p.adaptations
    own = "def f(a):\n    return a + 1\n\nprint(f(1))\n"
    p = prepare("python", own, CPU)
    assert p.files["snippet.py"] == own and not any("excerpt of a function" in a for a in p.adaptations)


def test_a_partial_optimizer_offload_gets_deepspeeds_cpu_adam() -> None:
    cfg, notes = adapt_config({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})
    assert cfg["optimizer"] == {"type": "AdamW", "params": {"lr": 1e-3}} and any("DeepSpeedCPUAdam" in n and "ratio 0.3" in n for n in notes)
    cfg, notes = adapt_config({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1}}})
    assert cfg["optimizer"]["params"]["torch_adam"] is True  # a whole offload keeps the base's torch AdamW


def test_launcher_and_hostfile_are_rewritten_for_this_machine() -> None:
    p = prepare("launcher", "NCCL_DEBUG=INFO deepspeed train.py --deepspeed --deepspeed_config ds_config.json", CPU)
    assert p.argv[1:4] == ["-m", "deepspeed.launcher.runner", "--num_gpus"] and "train.py" in p.argv
    assert "--deepspeed_config" in p.argv and "train.py" in p.files
    p = prepare("launcher", "deepspeed --num_gpus 2 pretrain.py", GPU8)
    assert p.argv[p.argv.index("--num_gpus") + 1] == "2" and any("pretrain.py" in a for a in p.adaptations)
    filled = prepare("launcher", "deepspeed --num_gpus <N> train.py", CPU)
    assert not filled.skip and filled.adaptations == ["placeholder <N> filled with 1"]
    p = prepare("hostfile", "worker-1 slots=8", CPU)
    assert p.files["hostfile"] == "localhost slots=1\n" and p.adaptations


TP4 = '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}, "tensor_parallel": {"autotp_size": 4, "preset_model": "llama"}}'


def test_a_few_gpus_are_as_many_cpu_processes() -> None:
    """A launcher line or a tensor-parallel config asking for up to CPU_RANKS GPUs runs that many CPU
    processes (gloo) and says so; more, or expert parallelism, stays skipped on CPU."""
    launcher = detect_requirements("launcher", "deepspeed --num_gpus 2 train.py")
    assert [cpu_adaptable("launcher", r) for r in unmet(launcher, CPU)] == [True]
    p = prepare("launcher", "deepspeed --num_gpus 2 train.py", CPU)
    assert p.argv[p.argv.index("--num_gpus") + 1] == "2" and "2 CPU processes over gloo in place of 2 GPUs (--num_gpus 2)" in p.adaptations
    p = prepare("launcher", "deepspeed --include localhost:0,1 train.py", CPU)
    assert p.argv[p.argv.index("--num_gpus") + 1] == "2"
    assert include_slots("localhost:0,1") == 2 and include_slots("a:0,1@b:2") == 3 and include_slots(None) == 0
    fp16 = detect_requirements("launcher", "deepspeed pretrain_gpt.py --zero-stage 3 --fp16")
    assert [cpu_adaptable("launcher", r) for r in unmet(fp16, CPU)] == [True]  # the flag is the user script's
    p = prepare("launcher", "deepspeed pretrain_gpt.py --zero-stage 3 --fp16", CPU)
    assert any(a.startswith("--fp16 is the user script's flag") for a in p.adaptations)
    assert not cpu_adaptable("python", Requirement("fp16", "the code trains or casts in fp16"))
    too_many = detect_requirements("launcher", f"deepspeed --num_gpus {CPU_RANKS * 2} train.py")
    assert [cpu_adaptable("launcher", r) for r in unmet(too_many, CPU)] == [False]
    assert "placeholder" in prepare("launcher", "deepspeed --bind_cores_to_rank --bind_core_list <0-27> --num_gpus 2 x.py", CPU).skip
    tp = detect_requirements("ds_config", TP4)
    assert [r.why for r in unmet(tp, CPU)] == ["tensor parallel size 4"] and all(cpu_adaptable("ds_config", r) for r in unmet(tp, CPU))
    p = prepare("ds_config", TP4, CPU)
    assert p.argv[1:5] == ["-m", "deepspeed.launcher.runner", "--num_gpus", "4"] and p.argv[-1] == "driver.py"
    assert json.loads(p.files["plan.json"])["model"] == "llama" and json.loads(p.files["ds_config.json"])["train_batch_size"] == 8
    assert any(a.startswith("4 processes, one per tensor-parallel rank (CPU processes over gloo") for a in p.adaptations)
    assert prepare("ds_config", '{"train_batch_size": 8}', CPU).argv[-1] == "driver.py"  # one process, no launcher
    assert json.loads(prepare("ds_config", '{"train_batch_size": 8}', CPU).files["plan.json"])["model"] == "mlp"
    ep = detect_requirements("ds_config", '{"expert_parallel": {"enabled": true, "autoep_size": 4, "preset_model": "mixtral"}}')
    assert [cpu_adaptable("ds_config", r) for r in unmet(ep, CPU)] == [False]
    custom = '{"tensor_parallel": {"autotp_size": 4, "partition_config": {"use_default_specs": false, "layer_specs": []}}}'
    assert prepare("ds_config", custom, CPU).skip.startswith("custom AutoTP layer patterns")
    compiled = '{"tensor_parallel": {"autotp_size": 4}, "compile": {"deepcompile": true}}'
    assert prepare("ds_config", compiled, CPU).skip.startswith("tensor parallelism through a compiled graph")
    assert "more processes" in prepare("ds_config", '{"tensor_parallel": {"autotp_size": 8}}', CPU).skip


def test_env_is_scrubbed() -> None:
    env = scrub_env({"PATH": "/bin", "HOME": "/root", "SLACK_BOT_TOKEN": "x", "DSQA_LLM_API_KEY": "k", "AWS_SECRET_ACCESS_KEY": "s",
                     "DS_ACCELERATOR": "cpu", "RANDOM_VAR": "1"}, {"RANK": "0", "MY_API_KEY": "leak"})
    assert env == {"PATH": "/bin", "DS_ACCELERATOR": "cpu", "RANK": "0"}
    assert is_secret_name("DSQA_RUNNER_TOKEN") and is_secret_name("GITHUB_PAT") and not is_secret_name("LOCAL_RANK")


def test_failure_reason_picks_the_exception_line() -> None:
    err = "Traceback (most recent call last):\n  File \"x\", line 1\nValueError: bad config\n[rank0]: noise\n"
    assert failure_reason(err).startswith("ValueError: bad config")
    pyd = ("[rank0]: pydantic_core._pydantic_core.ValidationError: 1 validation error for DeepSpeedZeroConfig\n"
           "[rank0]: reduce_bucket_sise\n[rank0]:   Extra inputs are not permitted [type=extra_forbidden]\n"
           "[rank0]:     For further information visit https://errors.pydantic.dev/2.14/v/extra_forbidden\n")
    assert failure_reason(pyd) == ("pydantic_core._pydantic_core.ValidationError: 1 validation error for DeepSpeedZeroConfig | "
                                   "reduce_bucket_sise | Extra inputs are not permitted [type=extra_forbidden]")
    assert failure_reason("", "last words\n") == "last words"


def test_ledger_is_merged_atomically_and_stamped(tmp_path: Path) -> None:
    a = RunResult(status="passed", id="aaa", kind="ds_config", device="cpu", torch="2.13", deepspeed="0.19.8")
    b = RunResult(status="failed", id="bbb", kind="python", reason="NameError: x", device="cpu", deepspeed="0.19.8")
    write_ledger(tmp_path, [a, b])
    write_ledger(tmp_path, [RunResult(status="timeout", id="bbb", kind="python", device="cpu", deepspeed="0.19.8")])
    rows = read_ledger(tmp_path)
    assert rows["aaa"]["status"] == "passed" and rows["bbb"]["status"] == "timeout"
    assert [p.name for p in tmp_path.iterdir()] == ["verification.jsonl"]  # no temp files left
    ran = verdict("checked", "", "0.19.8", rows["aaa"])
    assert ran.status == "ran" and ran.words.startswith("ran on cpu, deepspeed 0.19.8, 20")
    static = verdict("checked", "", "0.19.8")
    assert static.status == "checked" and static.words.startswith("checked statically against deepspeed 0.19.8") and "not run" in static.words
    skipped = verdict("checked", "", "0.19.8", {"status": "skipped", "reason": "needs gpu"})
    assert skipped.status == "checked" and "could not test it" in skipped.words and "needs gpu" in skipped.words


def test_only_a_failure_blamed_on_the_snippet_shows_as_fails() -> None:
    snippet_fault = {"status": "failed", "blame": "snippet", "reason": "TypeError: bad", "device": "cpu", "deepspeed": "0.19.8"}
    assert verdict("checked", "", "0.19.8", snippet_fault).status == "fails"
    harness_fault = {**snippet_fault, "blame": "harness", "blame_why": "the fragment uses 'model' from its page"}
    shown = verdict("checked", "", "0.19.8", harness_fault)
    assert shown.status == "checked" and "(harness)" in shown.words and "'model'" in shown.words
    assert verdict("template", "fill <n>", "0.19.8", {**snippet_fault, "blame": "environment"}).status == "template"


def test_report_is_self_contained() -> None:
    assert percentiles([1, 2, 3, 4, 100])["p50"] == 3
    svg = svg_bars("t", [("a", 0.5), ("b<", 1.0)]) + svg_histogram("h", [1.0, 5.0, 9.0])
    assert svg.count("<svg") == 2 and "b&lt;" in svg
    summary = {"questions": 1, "errors": 0, "retrieval": {"all": {"n": 1, "hit@5": 1.0}, "en": {"n": 1, "hit@5": 1.0}},
               "by_topic": {"zero": {"n": 1, "hit@5": 1.0}}, "snippets": {"total": 0, "by_status": {}, "pass_rate": None, "by_kind": {}},
               "latency_ms": {"p50": 3.0}}
    page = render_report(summary, [{"id": "1", "question": "q", "lang": "en", "topic": "zero", "first_relevant": 1, "latency_ms": 3.0, "error": ""}])
    assert "<script" not in page and "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_run_snippet_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main

    assert main(["run-snippet", str(tmp_path / "missing.py"), "--kind", "python"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["run-snippet", "x.py", "--kind", "nonsense"])
    assert exc.value.code == 2


class _SlowStub(LocalRunner):
    def __init__(self) -> None:
        super().__init__(capabilities=CPU)

    def run(self, request, *, gpu_ids=None):  # type: ignore[override]
        time.sleep(0.6)
        return RunResult(status="passed", id=request.id, kind=request.kind, device="cpu")


def test_runner_service_auth_hash_and_queue_bound() -> None:
    from eval.runner_service import create_runner_app

    code = "print('hi')"
    app = create_runner_app(token="s3cret", allowed={content_hash(code, length=12)}, runner=_SlowStub(), queue_limit=1)
    with ServerThread(app) as server:
        url = server.url + "/run"
        body = {"kind": "python", "code": code}
        assert httpx.post(url, json=body).status_code == 401
        assert httpx.post(url, json=body, headers={"authorization": "Bearer wrong"}).status_code == 401
        auth = {"authorization": "Bearer s3cret"}
        assert httpx.post(url, json={"kind": "python", "code": "import os"}, headers=auth).status_code == 403
        assert httpx.post(url, json={"kind": "bogus", "code": code}, headers=auth).status_code == 422
        codes: list[int] = []

        def post() -> None:
            codes.append(httpx.post(url, json=body, headers=auth, timeout=30).status_code)

        threads = [threading.Thread(target=post) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(codes) == [200, 200, 429, 429]  # one running + one queued; the rest refused
        assert httpx.get(server.url + "/healthz").json()["slots"] == 1
        # the token before the body: no token, a 2 MB body, a 401 that echoes nothing back
        huge = httpx.post(url, content=b"x" * 2_000_000, headers={"content-type": "application/json"})
        assert huge.status_code == 401 and len(huge.content) < 500
        assert httpx.post(url, content=b"x" * 2_000_000, headers=auth).status_code == 413
        junk = httpx.post(url, content=b'{"kind": "python", "code": "' + b"y" * 5000 + b'", "timeout_s": -1}', headers=auth)
        assert junk.status_code == 422 and b"yyyy" not in junk.content
        assert httpx.get(server.url + "/openapi.json").status_code == 401 and httpx.get(server.url + "/docs").status_code == 404
        assert "/run" in httpx.get(server.url + "/openapi.json", headers=auth).json()["paths"]
    with pytest.raises(ValueError):
        create_runner_app(token="", allowed=None, runner=_SlowStub())


class _PassStub(LocalRunner):
    def __init__(self) -> None:
        super().__init__(capabilities=CPU)

    def run(self, request, *, gpu_ids=None):  # type: ignore[override]
        return RunResult(status="passed", id=request.id, kind=request.kind, device="cpu", deepspeed="0.19.8")


def test_verify_writes_the_ledger_and_ask_stamps_it(tiny_docs: Path, tmp_path: Path) -> None:
    from app.ask import ask
    from app.engine import load_engine
    from app.schemas import AskRequest
    from app.settings import Settings
    from eval.verify import verify_index
    from indexer.build import build_index
    from indexer.embedder import HashEmbedder
    from indexer.store import load_index

    out = tmp_path / "index"
    emb = HashEmbedder()
    build_index(out, emb, docs_dir=tiny_docs, notes_dir=None, cache_dir=None, progress=False)
    report = verify_index(out, _PassStub(), only="docs")
    assert report["total"] >= 3 and report["by_status"] == {"passed": report["total"]}  # docs + package API snippets
    assert {"ds_config", "launcher", "python"} <= set(report["by_kind"])
    index = load_index(out)  # the ledger is not part of the checksums
    assert len(index.verification) == report["total"]
    engine = load_engine(Settings(index_dir=out, no_answer_threshold=0.0), emb)
    reply = ask(engine, AskRequest(question="configure ZeRO stage overlap_comm", k=3))
    assert reply.snippets and all(s.status == "ran" and s.stamp.startswith("ran on cpu, deepspeed 0.19.8") for s in reply.snippets)


def test_fp16_config_runs_on_cpu_as_bf16_and_says_so() -> None:
    from indexer.snippet_status import verdict

    code = '{"train_batch_size": 2, "fp16": {"enabled": true, "loss_scale": 0}}'
    r = LocalRunner(capabilities=CPU).run(RunRequest(kind="ds_config", code=code, timeout_s=240))
    assert r.status == "passed", r.stderr[-2000:]
    assert any(a.startswith("as bf16 on cpu: fp16 needs a GPU") for a in r.adaptations)
    shown = verdict("checked", "", "0.19.8", {**r.to_json(), "time": "2026-11-30"})
    assert shown.status == "ran" and "as bf16 on cpu" in shown.words


def test_placeholders_are_filled_and_named() -> None:
    from indexer.launcher_line import fill_placeholders
    from indexer.snippet_check import fill_config_placeholders

    words, notes = fill_placeholders(["deepspeed", "--num_gpus", "<num_gpus>", "<client_entry.py>", "--launcher=[pdsh|openmpi]", "..."])
    assert words == ["deepspeed", "--num_gpus", "1", "train.py", "--launcher=pdsh"] and len(notes) == 4
    words, notes = fill_placeholders(["deepspeed", "--bind_cores_to_rank", "--bind_core_list", "<comma-separated-dash-range>", "t.py"])
    assert words[3] == "0" and notes == ["placeholder <comma-separated-dash-range> filled with 0"]  # a range of one core, not `x`
    text, notes = fill_config_placeholders('{"offload_param": {"device": "[cpu|nvme]", "pin_memory": [true|false]}, "mp": MP_SIZE}')
    assert json.loads(text) == {"offload_param": {"device": "cpu", "pin_memory": True}, "mp": 1} and len(notes) == 3


def test_fragment_gets_the_imports_of_its_page() -> None:
    from eval.verify import page_imports

    def snip(i: str, code: str, path: str = "docs/a.md") -> Snippet:
        return Snippet(id=i, language="python", kind="python", code=code, chunk_id="c", source_url="u", path=path)

    first = snip("a", "from deepspeed.runtime.zero.partition_parameters import GatheredParameters\nx = 1")
    later = snip("b", "print(GatheredParameters)")
    other_page = snip("c", "print(GatheredParameters)", path="docs/b.md")
    ctx = page_imports([first, later, other_page])
    assert ctx == {"a": "", "b": "from deepspeed.runtime.zero.partition_parameters import GatheredParameters", "c": ""}
    p = prepare("python", later.code, CPU, context=ctx["b"])
    assert not p.skip and p.files["snippet.py"].startswith("from deepspeed.runtime.zero.partition_parameters import")
    assert any("imports from earlier on its page" in a for a in p.adaptations)
    assert prepare("python", other_page.code, CPU, context="import os; os.system('x')").skip  # only imports are taken
    # the ZeRO-3 page's offload enums and typing's annotations are found without an import on the page
    enums = prepare("python", "def f(s: Set[OffloadStateTypeEnum]) -> None:\n    pass", CPU)
    assert not enums.skip and "from typing import Set" in enums.files["snippet.py"]
    assert "from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum" in enums.files["snippet.py"]


def test_a_passing_run_does_not_clear_a_static_failure_it_never_reached() -> None:
    run = {"status": "passed", "device": "cpu", "deepspeed": "0.19.8", "time": "2026-11-30", "adaptations": ["as bf16 on cpu: fp16 needs a GPU"]}
    shown = verdict("fails", "line 3: `deepspeed.checkpoint.get_cuda_rng_tracker` does not exist", "0.19.8", run)
    assert shown.status == "fails" and "passed without reaching it" in shown.words
    assert verdict("checked", "", "0.19.8", run).status == "ran"


def test_what_inference_and_hub_snippets_need() -> None:
    def needs(kind: str, code: str) -> set[str]:
        return {r.name for r in detect_requirements(kind, code)}

    assert needs("python", "engine = deepspeed.init_inference(model=net, config=config)") == set()  # runs on a CPU
    assert "cuda" in needs("python", "m = deepspeed.init_inference(m, dtype=torch.float, replace_with_kernel_inject=True)")
    assert "network" in needs("python", 'pipe = pipeline(task="text-generation", model="EleutherAI/gpt-neo-2.7B", device=0)')
    assert "multi-gpu" in needs("python", 'cfg = {"tensor_parallel": {"autotp_size": 4}}\ndeepspeed.initialize(model=m, config=cfg)')
    zenflow = '{"zero_optimization": {"stage": 2, "zenflow": {"select_strategy": "auto", "update_interval": "auto"}}}'
    assert "hf-auto" not in needs("ds_config", zenflow)  # deepspeed's own "auto"
    assert "hf-auto" in needs("ds_config", '{"train_micro_batch_size_per_gpu": "auto"}')


def test_a_name_read_before_the_snippet_binds_it_comes_from_its_page() -> None:
    code = "model = model.eval()\nparser = deepspeed.add_config_arguments(parser)\nx = [i for i in range(2)]\nfor a in b:\n    c = a\n"
    assert free_names(ast.parse(code)) == ["b", "deepspeed", "model", "parser"]
    p = prepare("python", "engine = deepspeed.init_inference(model=net, config=config)", CPU)
    assert "the prelude's config for init_inference sets dtype fp32 (its default, fp16, needs a GPU)" in p.adaptations
    assert json.loads(p.files["plan.json"])["inference"] is True and json.loads(p.files["plan.json"])["config_in_call"] is True


def test_fp16_the_cpu_accelerator_refuses_is_the_environment() -> None:
    from eval.failure_blame import blame_failure
    from indexer.snippet_status import BLAME_ENVIRONMENT

    err = 'File "snippet.py", line 1, in <module>\nValueError: Data type torch.float16 is not supported by cpu accelerator'
    code = "engine = deepspeed.init_inference(model=net, config=config)"
    assert blame_failure("python", code, "failed", "ValueError", err).party == BLAME_ENVIRONMENT


def test_a_stand_in_batch_of_the_wrong_shape_is_the_harness_fault() -> None:
    from eval.failure_blame import blame_failure
    from indexer.snippet_status import BLAME_HARNESS, BLAME_SNIPPET

    err = 'File "snippet.py", line 3, in <module>\n    ids = batch["input_ids"]\nTypeError: tuple indices must be integers or slices, not str'
    assert blame_failure("python", 'x = 1\n\nids = batch["input_ids"]', "failed", "TypeError", err, ["prelude supplied: batch"]).party == BLAME_HARNESS
    assert blame_failure("python", 'b = (1, 2)\n\nids = b["input_ids"]', "failed", "TypeError", err, []).party == BLAME_SNIPPET


def test_several_nodes_run_on_one_and_say_so() -> None:
    """A launcher line or hostfile for several nodes runs on this machine (a localhost hostfile) and
    says what it stood in for; an MPI launch (mpirun, impi, mvapich) stays skipped: it needs MPI itself."""
    for kind, code in (("launcher", "deepspeed --num_nodes 2 train.py"), ("launcher", "deepspeed --hostfile=myhosts train.py"),
                       ("hostfile", "worker-1 slots=4\nworker-2 slots=4")):
        assert [cpu_adaptable(kind, r) for r in unmet(detect_requirements(kind, code), CPU)] == [True]
    p = prepare("launcher", "deepspeed --hostfile=myhosts --master_addr=<addr> --master_port=<port> train.py", CPU)
    assert p.files["hostfile"] == "localhost slots=1\n" and p.argv[p.argv.index("--hostfile") + 1] == "hostfile"
    assert any(a.startswith("the hostfile myhosts (not in the snippet) -> 'localhost slots=1'") for a in p.adaptations)
    port = int(p.argv[p.argv.index("--master_port") + 1])
    assert port > 1024 and "--master_addr x -> this machine (the launcher's default)" in p.adaptations  # not the filled '1'
    p = prepare("launcher", "deepspeed --hostfile=<hostfile> train.py", CPU)
    assert any(a.startswith("the hostfile (a placeholder)") for a in p.adaptations) and "train.py" not in p.argv[:p.argv.index("--hostfile") + 2]
    p = prepare("launcher", "deepspeed --num_nodes=4 train.py", CPU)
    assert "hostfile" not in p.files and any(a.startswith("one node (this machine) in place of --num_nodes 4") for a in p.adaptations)
    p = prepare("hostfile", "worker-1 slots=4\nworker-2 slots=4", CPU)
    assert p.files["hostfile"] == "localhost slots=1\n" and p.adaptations[0].startswith("hostfile of 2 hosts -> 'localhost slots=1'")
    mpi = detect_requirements("launcher", "deepspeed --launcher=openmpi script.py")
    assert [cpu_adaptable("launcher", r) for r in unmet(mpi, CPU)] == [False]


def test_wandb_logs_offline_and_a_cut_off_config_is_closed() -> None:
    wandb = detect_requirements("ds_config", '{"train_batch_size": 8, "wandb": {"enabled": true}}')
    assert [cpu_adaptable("ds_config", r) for r in wandb if r.name == "network"] == [True]
    comet = detect_requirements("ds_config", '{"train_batch_size": 8, "comet": {"enabled": true}}')
    assert [cpu_adaptable("ds_config", r) for r in comet if r.name == "network"] == [False]
    p = prepare("ds_config", '{"train_batch_size": 8, "wandb": {"enabled": true, "project": "p"}}', CPU)
    assert any("WANDB_MODE=offline" in a for a in p.adaptations)
    cut = '"compression_training": {\n  "weight_quantization": {\n    "shared_parameters": {"enabled": false}\n  }\n'
    p = prepare("ds_config", cut, CPU)
    assert not p.skip and json.loads(p.files["ds_config.json"])["compression_training"]["weight_quantization"]
    assert any("'}' added at the end" in a for a in p.adaptations)
    assert prepare("ds_config", '{"a": 1}}', CPU).skip.startswith("not a readable config")  # one closed too many: no sure repair


def test_output_capture_is_safe_across_threads() -> None:
    """The runner prepares two snippets at a time, each parsing its config with DeepSpeed under a
    captured stdout; unguarded redirects once left sys.stdout a StringIO for good (every later print
    of `dsqa verify` lost)."""
    import sys

    from indexer.quiet import captured

    out, err = sys.stdout, sys.stderr

    def work() -> None:
        for _ in range(50):
            with captured(stderr=True) as (buf, _):
                time.sleep(0.001)  # another thread gets in while the streams are swapped
                print("x")
            assert buf.getvalue() == "x\n"

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sys.stdout is out and sys.stderr is err


def test_printed_output_pasted_after_the_code_is_not_run() -> None:
    from indexer.python_check import printed_output_cut

    code = "n = 3\nprint(f'total params: {n}M')\n\ntotal params:   3M\nlargest layer memory:    125MB\n"
    assert printed_output_cut(code) == ("n = 3\nprint(f'total params: {n}M')\n", 4)
    p = prepare("python", code, CPU)
    assert not p.skip and p.files["snippet.py"].strip().endswith("print(f'total params: {n}M')")
    assert "lines 4-5 are what the prints show, pasted after the code: not run" in p.adaptations
    assert printed_output_cut("n = 3\nx = (\n") is None  # a cut-off call, not output
    assert printed_output_cut("n = 3\nprint(n)\nm = 4 +\n") is None  # an output line must not be code
    assert printed_output_cut("x = 1\ntotal params: 3M\n") is None  # nothing printed, nothing to cut


def test_a_rank_crash_the_launcher_passes_on_is_a_native_crash() -> None:
    """deepspeed's launcher exits with a crashed rank's negative return code: a rank's SIGABRT
    ('terminate called without an active exception' in gloo, now and then) arrives as signal 122."""
    import signal

    from eval.runner import native_crash

    assert native_crash(signal.SIGSEGV) == signal.SIGSEGV and native_crash(122) == signal.SIGABRT
    assert native_crash(signal.SIGKILL) is None and native_crash(None) is None and native_crash(128 - signal.SIGKILL) is None
