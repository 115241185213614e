"""The config planner: scenarios whose expected stage/offload/precision were written from the docs'
rules (smallest ZeRO stage that fits; offload the optimizer before the parameters; stage 3 to
partition parameters; NVMe when CPU memory does not suffice; bf16 on Ampere and newer) before
running the planner; memory equal to DeepSpeed's own estimators; every fitting config valid."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from app.planner import PlanRequest, model_shape, plan

SCENARIOS = [
    # (inputs, expected (stage, offload_optimizer, offload_param, precision))
    ({"params": 7e9, "gpus_per_node": 8, "gpu_mem_gb": 80, "gpu_kind": "a100"}, (2, "none", "none", "bf16")),
    ({"params": 7e9, "gpus_per_node": 8, "gpu_mem_gb": 40, "gpu_kind": "a100", "micro_batch": 4}, (2, "none", "none", "bf16")),
    ({"params": 7e9, "gpus_per_node": 1, "gpu_mem_gb": 80, "gpu_kind": "h100"}, (2, "cpu", "none", "bf16")),
    # stage 3 without offload needs 33 GB of 32: then the optimizer goes to the CPU, at the lowest stage that fits
    ({"params": 13e9, "gpus_per_node": 8, "gpu_mem_gb": 32, "gpu_kind": "v100"}, (2, "cpu", "none", "fp16")),
    ({"params": 70e9, "gpus_per_node": 8, "gpu_mem_gb": 80, "gpu_kind": "a100", "cpu_mem_gb": 2048}, (3, "cpu", "none", "bf16")),
    ({"params": 1.3e9, "gpus_per_node": 1, "gpu_mem_gb": 16, "gpu_kind": "t4", "seq_len": 1024}, (2, "cpu", "none", "fp16")),
    ({"params": 176e9, "gpus_per_node": 8, "gpu_mem_gb": 80, "gpu_kind": "a100", "cpu_mem_gb": 1024, "nvme": "/local_nvme"}, (3, "nvme", "nvme", "bf16")),
    # stage 2 keeps all 16-bit parameters on every GPU (2 x 30e9 bytes = 60 GB > 40): stage 3
    ({"params": 30e9, "gpus_per_node": 8, "nodes": 8, "gpu_mem_gb": 40, "gpu_kind": "a100", "global_batch": 1024}, (3, "none", "none", "bf16")),
    # 7B on one 16 GB GPU: its 14 GB of 16-bit parameters leave no room: stage 3 offloads them too
    ({"params": 7e9, "gpus_per_node": 1, "gpu_mem_gb": 16, "gpu_kind": "v100", "cpu_mem_gb": 256}, (3, "cpu", "cpu", "fp16")),
]


@pytest.mark.parametrize(("inputs", "expected"), SCENARIOS, ids=[f"{s[0]['params']:.0e}-{s[0]['gpus_per_node']}x{s[0]['gpu_mem_gb']}" for s in SCENARIOS])
def test_planned_choice_follows_the_docs_rules(inputs: dict, expected: tuple) -> None:
    result = plan(PlanRequest(**inputs))
    c = result.choice
    assert result.fits and (c["stage"], c["offload_optimizer"], c["offload_param"], c["precision"]) == expected, result.candidates
    assert result.validated["valid"], result.validated["errors"]
    cfg = result.config
    world = inputs["gpus_per_node"] * inputs.get("nodes", 1)
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * world
    assert all(r["text"] for r in result.reasons) and any(r["url"].startswith("https://") for r in result.reasons)


def test_memory_is_deepspeeds_own_estimate_to_the_byte() -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    req = PlanRequest(params=13e9, gpus_per_node=4, nodes=2, gpu_mem_gb=80, hidden=5120, layers=40)
    largest = model_shape(req)["largest_layer_params"]
    by_key = {(c.stage, c.offload_optimizer, c.offload_param): c for c in plan(req).candidates}
    cpu, gpu = estimate_zero2_model_states_mem_needs(int(13e9), 4, 2, cpu_offload=False)
    assert (by_key[(2, "none", "none")].model_states_gpu_bytes, by_key[(2, "none", "none")].model_states_cpu_bytes) == (int(gpu), int(cpu))
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(int(13e9), largest, 4, 2, cpu_offload=True, cpu_offload_params=True)
    assert (by_key[(3, "cpu", "cpu")].model_states_gpu_bytes, by_key[(3, "cpu", "cpu")].model_states_cpu_bytes) == (int(gpu), int(cpu))


def test_nothing_fits_is_explained_and_the_cli_exits_1() -> None:
    result = plan(PlanRequest(params=176e9, gpus_per_node=8, gpu_mem_gb=80, gpu_kind="a100", cpu_mem_gb=1024))
    assert not result.fits and "nothing fits" in result.reasons[1]["text"] and "NVMe" in result.reasons[1]["text"]
    out = subprocess.run([sys.executable, "-m", "app.cli", "plan", "--params", "176e9", "--gpus-per-node", "8", "--gpu-mem-gb", "80",
                          "--cpu-mem-gb", "1024", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and json.loads(out.stdout)["fits"] is False
    bad = subprocess.run([sys.executable, "-m", "app.cli", "plan", "--params", "7e9", "--gpus-per-node", "0", "--gpu-mem-gb", "80"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "gpus_per_node" in bad.stderr and "Traceback" not in bad.stderr


def test_plan_route_answers_and_refuses_impossible_batches(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.small_index import build_small_index, small_app

    with TestClient(small_app(build_small_index(tmp_path_factory))) as http:
        ok = http.post("/plan", json={"params": 7e9, "gpus_per_node": 8, "gpu_mem_gb": 40})
        assert ok.status_code == 200 and ok.json()["choice"]["stage"] == 2 and ok.json()["validated"]["valid"]
        bad = http.post("/plan", json={"params": 7e9, "gpus_per_node": 8, "gpu_mem_gb": 40, "micro_batch": 64, "global_batch": 32})
        assert bad.status_code == 422 and "micro_batch" in bad.json()["message"]
        assert http.post("/plan", json={"params": 7e9, "gpus_per_node": 0, "gpu_mem_gb": 40}).json()["field"] == "gpus_per_node"


@pytest.mark.slow
@pytest.mark.parametrize(("inputs", "expected"), SCENARIOS, ids=[f"{s[0]['params']:.0e}-{s[0]['gpus_per_node']}x{s[0]['gpu_mem_gb']}" for s in SCENARIOS])
def test_every_planned_config_runs_on_cpu_at_tiny_scale(inputs: dict, expected: tuple, plan_runner) -> None:
    """The emitted config itself through deepspeed.initialize and a few steps of a tiny model on this
    CPU (world size adapted, fp16 as bf16; each adaptation reported); NVMe offload needs libaio and an
    NVMe path, which a CPU runner does not have: it is skipped with that reason, never called passed."""
    from eval.plan_run import run_plan

    result = plan(PlanRequest(**inputs))
    run = run_plan(result.config, plan_runner)
    if expected[1] == "nvme":
        assert run["status"] == "skipped" and ("libaio" in run["reason"] or "nvme" in run["reason"].lower()), run
        return
    assert run["status"] == "passed", run
    if expected[3] == "fp16":
        assert any("bf16" in a for a in run["adaptations"]), run


@pytest.fixture(scope="module")
def plan_runner():  # noqa: ANN201
    from eval.runner import LocalRunner

    return LocalRunner()
