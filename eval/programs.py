"""Turn a snippet into a program that exercises it for real, or a reasoned `skip`.

- ds_config: parsed with `parse_config_mended` (as written, or with a missing comma or `=` for `:`
  mended, which the run names; placeholders like `[true|false]` take their first choice), merged into a minimal base when it is a fragment, run through `deepspeed.initialize` on a
  tiny MLP for a few real steps (forward, backward, step), with a checkpoint save and load when the
  config touches checkpointing. Only world-size-dependent values are adapted (train_batch_size for
  world size 1, hpZ partition sizes), and fp16 runs as bf16 on CPU; every adaptation is listed in
  the result. Keys deepspeed would silently ignore fail the run, named.
- python: run as `snippet.py` with a prelude that supplies the names doc fragments assume
  (`model`, `optimizer`, `engine`, `args`, `data_loader`...; see `PRELUDE_NAMES`) only when the
  snippet loads them without binding or importing them (found with `ast`), and the imports its page
  made in earlier snippets; `>>>` prompts are stripped and elision lines run as `pass`.
- launcher / hostfile: the `deepspeed` launcher on localhost with a tiny training script (one
  process on CPU, `--num_gpus` up to the GPUs there are on a GPU host); placeholders filled, named.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import json
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.requirements import (
    CPU_RANKS,
    TP_SIZE,
    Capabilities,
    hub_stand_in,
    python_requirements,
    tensor_parallel_size,
)
from eval.sandbox import free_port
from indexer.launcher_line import hostfile_hosts, include_slots, launcher_lines, names_hostfile, parse_filled
from indexer.python_check import PUBLIC_NAMESPACES, printed_output_cut, strip_repl
from indexer.snippet_check import (
    fill_config_placeholders,
    parse_config_mended,
    placed,
    stage_it_needs,
    with_stage,
)
from indexer.snippet_status import repaired_syntax_note

RUNNABLE_KINDS = ("ds_config", "python", "launcher", "hostfile")
ONE_NODE = "more nodes need hosts reachable by ssh"
# the launcher on this machine alone: a localhost hostfile, no ssh check, and the master address given
# (without it the launcher asks the first host for its address over ssh)
LOCAL_HOSTFILE_WORDS = ["--hostfile", "hostfile", "--no_ssh_check", "--master_addr", "127.0.0.1"]
DRIVERS = Path(__file__).resolve().parent / "drivers"


# --------------------------------------------------------------------------- prepared programs

@dataclass
class Prepared:
    files: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    adaptations: list[str] = field(default_factory=list)
    skip: str = ""  # a reason not to run
    expect_unknown_keys: list[str] = field(default_factory=list)  # fail the run naming these


def _driver(name: str) -> str:
    return (DRIVERS / name).read_text(encoding="utf-8")


TINY_LLAMA = "2 layers, hidden size 32, 4 heads"  # built by drivers/ds_config_driver.py for tensor-parallel runs
BASE_CONFIG: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
}
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
        if isinstance(zero_block, dict) and "zenflow" in zero_block:  # ZenFlow brings its own AdamW, which takes no torch_adam
            cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3}}
            notes.append("no optimizer block: AdamW (lr 1e-3) added")
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
    files = {"ds_config.json": json.dumps(run_cfg, indent=2), "plan.json": json.dumps(plan), "driver.py": _driver("ds_config_driver.py")}
    argv = [sys.executable, "driver.py"]
    if ranks > 1:
        argv = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(ranks), "--no_local_rank",
                "--master_port", str(free_port()), "driver.py"]
    return Prepared(files=files, argv=argv, adaptations=notes, expect_unknown_keys=unknown)


# names a doc fragment may use without defining them; supplied by drivers/prelude.py
PRELUDE_NAMES = frozenset(
    {
        "model", "net", "optimizer", "engine", "model_engine", "ds_engine", "args", "cmd_args", "ds_config",
        "config", "ds_config_path", "config_path", "data_loader", "dataloader", "train_loader", "trainloader",
        "train_dataloader", "dataset", "train_dataset", "training_data", "batch", "inputs", "labels", "x", "y",
        "loss", "criterion", "loss_fn", "lr_scheduler", "scheduler", "device", "local_rank", "rank", "world_size",
        "save_dir", "ckpt_dir", "checkpoint_dir", "load_dir", "ckpt_id", "tag", "client_sd", "client_state",
        "step", "epoch", "parameters", "model_parameters", "params", "mpu", "torch", "deepspeed", "nn", "np",
        "os", "sys", "json", "math", "time", "argparse", "dist", "get_accelerator", "F",
        "self", "module", "parser", "get_argument_parser", "micro_batch_size", "sequence_parallel_size", "trainset", "cifar_trainset",
        "dtype", "data_iter", "tensor", "chunk_size", "output_dir", "output_file", "random",
        "Model", "MyLargeModel", "Net", "weight_shape", "num_features",  # `model = Model()`: the tiny model's class
        "optimizer_grouped_parameters", "optimizer_parameters", "param_groups", "grouped_parameters",
    }
)
# where a name a fragment neither defines nor imports is looked up, after earlier imports on its page:
# deepspeed's public namespaces, the ZeRO offload enums the ZeRO-3 page uses, and typing's annotations
FRAGMENT_NAMESPACES = (*PUBLIC_NAMESPACES, "deepspeed.runtime.zero.offload_config", "typing")


def free_names(tree: ast.Module) -> list[str]:
    """Names the code loads but never binds, imports or gets from builtins (scope-insensitive)."""
    bound: set[str] = set(dir(builtins)) | {"__name__", "__file__", "__doc__", "__builtins__"}
    loaded: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store | ast.Del):
                bound.add(node.id)
            elif node.id not in loaded:
                loaded.append(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for a in node.names:
                bound.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
            if not isinstance(node, ast.ClassDef):
                args = node.args
                for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                    if arg is not None:
                        bound.add(arg.arg)
        elif isinstance(node, ast.Lambda):
            for arg in node.args.args:
                bound.add(arg.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            bound.update(node.names)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            pass
    free = [n for n in loaded if n not in bound]
    return free + [n for n in _read_before_written(tree) if n not in free and n not in dir(builtins)]


def _read_before_written(tree: ast.Module) -> list[str]:
    """Names a top-level statement reads before any earlier statement binds them (`model = model.eval()`
    takes `model` from the page), in order; compound statements and definitions are left out."""
    bound: set[str] = set()
    early: list[str] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.Expr):
            value = stmt.value
            if isinstance(stmt, ast.AugAssign):  # `x += 1` reads x first
                value = ast.Tuple(elts=[stmt.target, stmt.value], ctx=ast.Load())
            for node in ast.walk(value) if value is not None else ():
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound and node.id not in early:
                    early.append(node.id)
                if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
                    break  # their own variables are not the page's
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                bound.add(node.id)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound.add(node.name)
    return early


def import_lines(code: str) -> list[str]:
    """The top-level import statements of a Python snippet (none when it does not parse)."""
    src = strip_repl(code)
    try:
        tree = ast.parse(textwrap.dedent(src if src is not None else code))
    except SyntaxError:
        return []
    return [ast.unparse(node) for node in tree.body
            if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.level == 0)]


def _context_imports(context: str, wanted: set[str]) -> dict[str, str]:
    """Name -> the import line (from earlier on the page, or deepspeed's public namespaces) that
    binds it; only import statements are ever taken from the context."""
    found: dict[str, str] = {}
    for line in context.splitlines():
        try:
            node = ast.parse(line).body[0]
        except (SyntaxError, IndexError):
            continue
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for alias in node.names:
            name = (alias.asname or alias.name).split(".")[0]
            if name in wanted and name not in found:
                found[name] = line
    for name in sorted(wanted - set(found)):
        for space in FRAGMENT_NAMESPACES:
            if _public_callable(space, name):
                found[name] = f"from {space} import {name}"
                break
    return found


def _public_callable(space: str, name: str) -> bool:
    try:
        module = importlib.import_module(space)
    except Exception:  # noqa: BLE001
        return False
    return callable(getattr(module, name, None))


_ELISION = re.compile(r"^(\s*)(?:\.{2,}|…|\[\.\.\.\]|#\s*\.\.\.)\s*$")


def elisions_as_pass(src: str) -> str:
    """A doc excerpt's elision lines (`......`, `…`, `[...]`) as `pass`, indentation kept, tabs as
    spaces: the rest of the excerpt then parses as written."""
    return "\n".join(_ELISION.sub(r"\1pass", line) for line in src.expandtabs(4).splitlines())


def prepare_python(code: str, caps: Capabilities, context: str = "") -> Prepared:
    typed = strip_repl(code)
    src = textwrap.dedent(typed if typed is not None else code)
    adaptations: list[str] = []
    try:
        tree = ast.parse(src)
    except SyntaxError as exc:
        repaired = elisions_as_pass(src)
        try:
            tree = ast.parse(repaired)
        except SyntaxError:
            cut = printed_output_cut(src)
            if cut is None:
                return Prepared(skip=f"fragment: not complete Python (line {exc.lineno}: {exc.msg})")
            last = len(src.splitlines())
            src, first = cut
            tree = ast.parse(src)
            adaptations.append(f"lines {first}-{last} are what the prints show, pasted after the code: not run")
        else:
            src = repaired
            adaptations.append("elided lines ('......') run as `pass`")
    if any(isinstance(n, ast.Call) and any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in [*n.args, *(k.value for k in n.keywords)])
           for n in ast.walk(tree)):
        return Prepared(skip="fragment: '...' placeholders in a call")
    names = free_names(tree)
    imported = _context_imports(context, {n for n in names if n not in PRELUDE_NAMES})
    if imported:
        src = "\n".join(dict.fromkeys(imported.values())) + "\n" + src
        adaptations.append("imports from earlier on its page: " + "; ".join(dict.fromkeys(imported.values())))
        names = [n for n in names if n not in imported]
    unknown = [n for n in names if n not in PRELUDE_NAMES]
    if unknown:
        return Prepared(skip=f"fragment: uses names it does not define and the prelude does not supply: {', '.join(unknown[:6])}")
    supplied = [n for n in names if n in PRELUDE_NAMES]
    stand_ins: dict[str, str] = {}  # Hub ids the run builds at toy size, each at a local path the snippet now names
    for req in python_requirements(src, tree):
        family = hub_stand_in(req.subject) if req.name == "network" and req.subject else None
        if family and not caps.cuda:
            local = "hub/" + re.sub(r"[^\w.-]", "__", req.subject)
            src = re.sub(rf"([\"']){re.escape(req.subject)}\1", f"\\g<1>{local}\\g<1>", src)
            stand_ins[local] = family
            adaptations.append(f"'{req.subject}' -> a tiny {family} of random weights (2 layers, width 32; MiniLM's WordPiece "
                               "tokenizer) built offline: the calls run, what the model outputs means nothing")
    inference = bool(re.search(r"\binit_inference\(", src))  # `config` there is an inference config, not a training one
    plan = {"names": supplied, "client_optimizer": "optimizer=" in src, "device": caps.device, "inference": inference,
            "config_in_call": bool(re.search(r"\b(?:config|config_params)\s*=", src))}  # then args carries no config path
    plan["stand_ins"] = stand_ins
    files = {"snippet.py": src, "prelude.py": _driver("prelude.py"), "plan.json": json.dumps(plan), "main.py": _driver("python_main.py")}
    if stand_ins:
        files["hub_stand_in.py"] = _driver("hub_stand_in.py")
    adaptations += [f"prelude supplied: {', '.join(supplied)}"] if supplied else []
    if inference and {"config", "ds_config"} & set(supplied):
        adaptations.append("the prelude's config for init_inference is empty (the inference defaults)" if caps.cuda else
                           "the prelude's config for init_inference sets dtype fp32 (its default, fp16, needs a GPU)")
    return Prepared(files=files, argv=[sys.executable, "main.py"], adaptations=adaptations)


# --------------------------------------------------------------------------- launcher

def prepare_launcher(code: str, caps: Capabilities, *, hostfile: bool = False) -> Prepared:
    adaptations: list[str] = []
    if hostfile:
        hosts = hostfile_hosts(code)
        if not hosts:
            return Prepared(skip="no 'host slots=N' line")
        host, slots = hosts[0]
        want = slots if caps.cuda else 1
        n = min(want, caps.gpus) if caps.cuda else 1
        if len(hosts) > 1:
            adaptations.append(f"hostfile of {len(hosts)} hosts -> 'localhost slots={n}' (one node, this machine: {ONE_NODE})")
        else:
            adaptations.append(f"hostfile '{host} slots={slots}' -> 'localhost slots={n}' (this machine)")
        files = {"hostfile": f"localhost slots={n}\n"}
        words = ["deepspeed", *LOCAL_HOSTFILE_WORDS, "train.py"]
        launcher_words = words
    else:
        try:
            lines = launcher_lines(code)
        except ValueError as exc:
            return Prepared(skip=f"the command line does not split: {exc}")
        if not lines:
            return Prepared(skip="no `deepspeed` launcher line (torchrun, srun and mpirun are not run)")
        args, err, launcher_words, filled = parse_filled(lines[0])
        adaptations += filled
        if args is None:
            return Prepared(files={"err.txt": err}, argv=[sys.executable, "-c", f"import sys; sys.exit({json.dumps('deepspeed launcher rejected the line: ' + err)})"])
        if args.module or args.no_python:
            return Prepared(skip="runs a module or a non-Python program (--module / --no_python): nothing of ours to substitute")
        if args.bind_core_list and "<" in args.bind_core_list:
            return Prepared(skip=f"--bind_core_list {args.bind_core_list} is a placeholder: which cores to bind is the reader's to fill in")
        files = {}
        words = ["deepspeed"]
        for flag in ("master_port", "bind_cores_to_rank", "bind_core_list", "log_level", "enable_each_rank_log"):
            v = getattr(args, flag, None)
            if flag == "master_port" and any(n.startswith("placeholder --master_port") for n in filled):
                v = free_port()
                adaptations.append(f"--master_port: a free port ({v})")
            if v not in (None, False, "", -1) and f"--{flag}" in " ".join(launcher_words):
                words += [f"--{flag}"] if v is True else [f"--{flag}", str(v)]
        wanted = args.num_gpus if args.num_gpus and args.num_gpus > 0 else include_slots(args.include)
        if caps.cuda:
            n = wanted or caps.gpus
            words += ["--num_gpus", str(min(n, caps.gpus))]
        elif wanted and 1 < wanted <= CPU_RANKS:
            words += ["--num_gpus", str(wanted)]
            if "--master_port" not in words:
                words += ["--master_port", str(free_port())]
            adaptations.append(f"{wanted} CPU processes over gloo in place of {wanted} GPUs (--num_gpus {wanted})")
        else:
            words += ["--num_gpus", "1"]
            if args.num_gpus != 1:
                adaptations.append("one process on CPU (--num_gpus 1)")
        if names_hostfile(launcher_words):
            n = min(wanted or caps.gpus, caps.gpus) if caps.cuda else 1
            files["hostfile"] = f"localhost slots={n}\n"
            words += LOCAL_HOSTFILE_WORDS
            named = "(a placeholder)" if any(a.startswith(("placeholder --hostfile", "placeholder -H")) for a in filled) else args.hostfile
            adaptations.append(f"the hostfile {named} (not in the snippet) -> 'localhost slots={n}' (one node, this machine: {ONE_NODE})")
        if args.num_nodes and args.num_nodes > 1:
            adaptations.append(f"one node (this machine) in place of --num_nodes {args.num_nodes}: {ONE_NODE}")
        if args.master_addr and args.master_addr not in ("localhost", "127.0.0.1"):
            adaptations.append(f"--master_addr {args.master_addr} -> this machine (the launcher's default)")
        words.append("train.py")
        if args.user_script != "train.py":
            adaptations.append(f"user script {args.user_script} -> dsqa's tiny training script (its arguments kept for parsing)")
        if "--fp16" in args.user_args and not caps.cuda:
            adaptations.append("--fp16 is the user script's flag: the tiny script in its place trains in fp32 (fp16 needs a GPU)")
        words += list(args.user_args)
    files["train.py"] = _driver("tiny_train.py")
    files["ds_config.json"] = json.dumps({**BASE_CONFIG, "steps_per_print": 1})
    argv = [sys.executable, "-m", "deepspeed.launcher.runner", *words[1:]]
    return Prepared(files=files, argv=argv, adaptations=adaptations)


def prepare(kind: str, code: str, caps: Capabilities, context: str = "") -> Prepared:
    if kind == "ds_config":
        return prepare_ds_config(code, caps)
    if kind == "python":
        return prepare_python(code, caps, context)
    if kind == "launcher":
        return prepare_launcher(code, caps)
    if kind == "hostfile":
        return prepare_launcher(code, caps, hostfile=True)
    return Prepared(skip=f"{kind} snippets are not run")
