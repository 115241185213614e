"""A ds_config snippet as a program: parsed with `parse_config_mended` (as written, or with a missing
comma or `=` for `:` mended, which the run names; placeholders like `[true|false]` take their first
choice), merged into a minimal base when it is a fragment, run through `deepspeed.initialize` on a
tiny MLP for a few real steps (forward, backward, step), with a checkpoint save and load when the
config touches checkpointing. Only world-size-dependent values are adapted (train_batch_size for
world size 1, hpZ partition sizes), and fp16 runs as bf16 on CPU; every adaptation is listed in the
result. Keys deepspeed would silently ignore fail the run, named.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from eval.prepared import Prepared, driver
from eval.requirements import (
    CPU_RANKS,
    TP_SIZE,
    Capabilities,
    tensor_parallel_size,
)
from eval.sandbox import free_port
from indexer.snippet_check import (
    fill_config_placeholders,
    parse_config_mended,
    placed,
    stage_it_needs,
    with_stage,
)
from indexer.snippet_status import repaired_syntax_note

TINY_LLAMA = "2 layers, hidden size 32, 4 heads"  # built by drivers/ds_config_driver.py for tensor-parallel runs
BASE_CONFIG: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
}
DEEPSPEED_ADAMW: dict[str, Any] = {"type": "AdamW", "params": {"lr": 1e-3}}  # deepspeed's own AdamW (its CPU Adam under an optimizer offload)
_BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def adapt_config(cfg: dict[str, Any], world_size: int = 1) -> tuple[dict[str, Any], list[str]]:
    """Merge a fragment into the minimal base and adapt world-size-dependent values only."""
    cfg = json.loads(json.dumps(cfg))
    notes: list[str] = []
    if not any(k in cfg for k in ("train_batch_size", "train_micro_batch_size_per_gpu")):
        cfg["train_micro_batch_size_per_gpu"] = BASE_CONFIG["train_micro_batch_size_per_gpu"]
        notes.append("fragment merged into the minimal base: train_micro_batch_size_per_gpu=2")
    if "optimizer" not in cfg:
        zero_block = cfg.get("zero_optimization")
        offload = zero_block.get("offload_optimizer") if isinstance(zero_block, dict) else None
        ratio = offload.get("ratio") if isinstance(offload, dict) else None
        if isinstance(zero_block, dict) and "zenflow" in zero_block:  # ZenFlow brings its own AdamW, which takes no torch_adam
            cfg["optimizer"] = json.loads(json.dumps(DEEPSPEED_ADAMW))
            notes.append("no optimizer block: AdamW (lr 1e-3) added")
        elif isinstance(ratio, int | float) and not isinstance(ratio, bool) and ratio < 1:
            # a partial optimizer offload steps part of the optimizer on the CPU with deepspeed's own CPU Adam only
            cfg["optimizer"] = json.loads(json.dumps(DEEPSPEED_ADAMW))
            notes.append(f"no optimizer block: deepspeed's AdamW (lr 1e-3) added, which it runs as DeepSpeedCPUAdam: the partial "
                         f"optimizer offload (ratio {ratio}) takes no other")
        else:
            cfg["optimizer"] = BASE_CONFIG["optimizer"]
            notes.append("no optimizer block: the base's torch AdamW (lr 1e-3) added")
    tbs, mbs, gas = (cfg.get(k) for k in _BATCH)
    if isinstance(tbs, int) and isinstance(mbs, int) and isinstance(gas, int) and tbs != mbs * gas * world_size:
        cfg["train_batch_size"] = mbs * gas * world_size
        notes.append(f"train_batch_size {tbs} -> {cfg['train_batch_size']} for world size {world_size} "
                     f"(micro {mbs} x accumulation {gas})")
    elif isinstance(tbs, int) and isinstance(mbs, int) and gas is None and tbs % (mbs * world_size):
        cfg["train_batch_size"] = mbs * world_size
        notes.append(f"train_batch_size {tbs} -> {cfg['train_batch_size']}: not divisible by micro {mbs} at world size {world_size}")
    elif isinstance(tbs, int) and isinstance(gas, int) and mbs is None and tbs % (gas * world_size):
        cfg["train_batch_size"] = gas * world_size
        notes.append(f"train_batch_size {tbs} -> {cfg['train_batch_size']}: not divisible by accumulation {gas} at world size {world_size}")
    zero = cfg.get("zero_optimization")
    if isinstance(zero, dict):
        for key in ("zero_hpz_partition_size",):
            v = zero.get(key)
            if isinstance(v, int) and v > world_size:
                zero[key] = world_size
                notes.append(f"zero_optimization.{key} {v} -> {world_size} (must divide world size {world_size})")
    return cfg, notes


def _fp16_enabled(cfg: dict[str, Any]) -> bool:
    fp16 = cfg.get("fp16")
    return isinstance(fp16, dict) and fp16.get("enabled") in (True, "true")


FP16_ON_CPU = "as bf16 on cpu: fp16 needs a GPU (its loss-scaling keys not exercised)"


def fp16_as_bf16(cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """On CPU deepspeed raises for fp16: the run trains in bf16 instead, and says so."""
    cfg = {k: v for k, v in cfg.items() if k != "fp16"}
    cfg["bf16"] = {"enabled": True}
    return cfg, FP16_ON_CPU


NVME_RUN_DIR = "nvme_swap"  # relative to the run's own folder, created by deepspeed's swapper
NVME_TINY_BUFFER = 100_000  # elements per pinned swap buffer: ample for the tiny model, within an 8 MB RLIMIT_MEMLOCK


def nvme_offload_in_run_dir(cfg: dict[str, Any]) -> list[str]:
    """NVMe offload swaps through libaio into `nvme_path`: a run points it at a folder of its own (this
    machine may have no NVMe drive, and a reader's path is theirs), so the same async I/O path runs
    through the local filesystem; the parameter swap buffers, pinned and sized for a real model
    (1e8 elements each by default), are sized for the tiny one. Changes `cfg` in place; the
    adaptations, said."""
    notes: list[str] = []
    zero = cfg.get("zero_optimization")
    for block in ("offload_param", "offload_optimizer"):
        off = zero.get(block) if isinstance(zero, dict) else None
        if not (isinstance(off, dict) and off.get("device") == "nvme"):
            continue
        was = off.get("nvme_path")
        off["nvme_path"] = NVME_RUN_DIR
        notes.append(f"zero_optimization.{block}.nvme_path {was!s} -> a folder of the run (libaio async I/O through "
                     "the local filesystem, not an NVMe drive)")
        size = off.get("buffer_size", 100_000_000)
        if block == "offload_param" and isinstance(size, (int, float)) and size > NVME_TINY_BUFFER:
            off["buffer_size"] = NVME_TINY_BUFFER
            notes.append(f"zero_optimization.offload_param.buffer_size {size:g} -> {NVME_TINY_BUFFER:g} elements (sized for the tiny model)")
    if notes:
        notes.append("NVMe swapping is set up (libaio handles, pinned buffers, swap folders), but the tiny model's tensors "
                     "are under deepspeed's 1 MB swap minimum, so none is swapped out")
    return notes


def _touches_checkpointing(cfg: dict[str, Any]) -> bool:
    if "checkpoint" in cfg:
        return True
    zero = cfg.get("zero_optimization")
    return isinstance(zero, dict) and any("on_model_save" in k or k.startswith("checkpoint") for k in zero)


def prepare_ds_config(code: str, caps: Capabilities) -> Prepared:
    from indexer.config_check import validate_config

    filled, notes_filled = fill_config_placeholders(code)
    try:
        cfg, fragment, repairs = parse_config_mended(filled)
    except ValueError as exc:
        return Prepared(skip=f"not a readable config: {exc}"[:300])
    if repairs:
        notes_filled.insert(0, repaired_syntax_note(repairs))
    if not isinstance(cfg, dict):
        return Prepared(skip="not a JSON object")
    cfg, where = placed(cfg)
    stage = stage_it_needs(cfg) if fragment or where or not any(k in cfg for k in ("train_batch_size", "train_micro_batch_size_per_gpu")) else None
    if stage is not None:
        cfg = with_stage(cfg, stage)
        notes_filled.append(f"ZeRO stage {stage} added: the excerpt needs the stage its page sets elsewhere")
    ranks = tensor_parallel_size(cfg)  # one process per config run, or one per tensor-parallel rank
    if ranks > 1 and isinstance(cfg.get("compile"), dict):
        return Prepared(skip="tensor parallelism through a compiled graph (the compile block) is not run in several processes")
    tp_block = cfg.get("tensor_parallel")
    if ranks > 1 and isinstance(tp_block, dict) and isinstance(tp_block.get("partition_config"), dict):
        return Prepared(skip="custom AutoTP layer patterns name one model's own layers (a fused gate_up_proj...): "
                             "the stand-in tiny Llama need not have them, so the run would not test the snippet")
    if ranks > (caps.gpus if caps.cuda else CPU_RANKS):
        return Prepared(skip=f"{TP_SIZE} {ranks}: more processes than this runner starts")
    world = 1  # the data-parallel size: every rank of the run holds one tensor-parallel slice
    run_cfg, notes = adapt_config(cfg, world)
    notes[:0] = notes_filled + ([f"an excerpt: placed under {where}"] if where else [])
    if ranks > 1:
        notes.append(f"{ranks} processes, one per tensor-parallel rank" + (" (CPU processes over gloo in place of GPUs)" if not caps.cuda else "")
                     + f"; the model is a tiny Llama ({TINY_LLAMA}), the family the docs' presets and patterns name")
    notes += nvme_offload_in_run_dir(run_cfg)
    wandb = run_cfg.get("wandb")
    if isinstance(wandb, dict) and wandb.get("enabled") in (True, "true"):
        notes.append("the wandb monitor logged offline into the run's directory (WANDB_MODE=offline: the sandbox has no network)")
    if not caps.cuda and _fp16_enabled(run_cfg):
        run_cfg, note = fp16_as_bf16(run_cfg)
        notes.insert(0, note)
    if re.search(r"\.\.\.|…|<[A-Za-z_ ]+>", code):  # not merely an excerpt without braces
        notes.insert(0, "placeholders ('...', <...>) removed before parsing")
    unknown = []
    for f in validate_config(run_cfg, world_size=world).errors:
        if "unknown key" in f.message or "removed" in f.message:
            unknown.append(f"{f.pointer}: {f.message}" + (f" ({f.suggestion})" if f.suggestion else ""))
    zero: dict[str, Any] = run_cfg["zero_optimization"] if isinstance(run_cfg.get("zero_optimization"), dict) else {}
    gas = run_cfg.get("gradient_accumulation_steps")
    if not isinstance(gas, int):
        tbs, mbs = run_cfg.get("train_batch_size"), run_cfg.get("train_micro_batch_size_per_gpu")
        gas = tbs // (mbs * world) if isinstance(tbs, int) and isinstance(mbs, int) and mbs else 1
    prof: dict[str, Any] = run_cfg["flops_profiler"] if isinstance(run_cfg.get("flops_profiler"), dict) else {}
    steps = max(3, 2 * gas) if gas <= 64 else gas
    zenflow = zero.get("zenflow") if isinstance(zero.get("zenflow"), dict) else None
    if zenflow:  # ZenFlow steps the optimizer every update_interval after its warm-up rounds
        steps = max(steps, (int(zenflow.get("update_interval", 4)) + int(zenflow.get("full_warm_up_rounds", 0)) + 1) * gas)
    if prof.get("enabled"):
        steps = max(steps, (int(prof.get("profile_step", 1)) + 1) * gas)
    plan = {
        "steps": min(steps, 512),
        "checkpoint": _touches_checkpointing(run_cfg),
        "save_16bit": bool(zero.get("stage3_gather_16bit_weights_on_model_save") or zero.get("gather_16bit_weights_on_model_save")),
        "activation_checkpointing": isinstance(run_cfg.get("activation_checkpointing"), dict),
        "device": caps.device,
        "model": "llama" if ranks > 1 else "mlp",
    }
    files = {"ds_config.json": json.dumps(run_cfg, indent=2), "plan.json": json.dumps(plan), "driver.py": driver("ds_config_driver.py")}
    argv = [sys.executable, "driver.py"]
    if ranks > 1:
        argv = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(ranks), "--no_local_rank",
                "--master_port", str(free_port()), "driver.py"]
    return Prepared(files=files, argv=argv, adaptations=notes, expect_unknown_keys=unknown)
