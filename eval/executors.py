"""Turn a snippet into a program that exercises it for real, or a reasoned `skipped`.

Requirements are detected from the code (and the notes' `requires=` tags), never guessed: fp16,
CUDA-only code and ops, GDS, NCCL, several GPUs or nodes, libaio, packages that are not installed,
and HF `"auto"` values. A runner that lacks one reports `skipped` with the reason.

- ds_config: parsed with `parse_config_text`, merged into a minimal base when it is a fragment, run
  through `deepspeed.initialize` on a tiny MLP for a few real steps (forward, backward, step), with
  a checkpoint save and load when the config touches checkpointing. Only world-size-dependent
  values are adapted (train_batch_size for world size 1, hpZ / MiCS partition sizes); every
  adaptation is listed in the result. Keys deepspeed would silently ignore fail the run, named.
- python: run as `snippet.py` with a prelude that supplies the names doc fragments assume
  (`model`, `optimizer`, `engine`, `args`, `data_loader`...; see `PRELUDE_NAMES`) only when the
  snippet loads them without binding or importing them (found with `ast`).
- launcher / hostfile: the `deepspeed` launcher on localhost with a tiny training script (one
  process on CPU, `--num_gpus` up to the GPUs there are on a GPU host).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import sys
import textwrap
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from indexer.snippet_check import parse_config_text

RUNNABLE_KINDS = ("ds_config", "python", "launcher", "hostfile")
DRIVERS = Path(__file__).resolve().parent / "drivers"


@dataclass(frozen=True)
class Capabilities:
    """What a runner's machine offers."""

    device: str  # "cpu" or "cuda" (with the GPU name in `label`)
    gpus: int = 0
    aio: bool = False
    gds: bool = False
    nodes: int = 1
    label: str = "cpu"

    @property
    def cuda(self) -> bool:
        return self.device == "cuda" and self.gpus > 0

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "gpus": self.gpus, "aio": self.aio, "gds": self.gds, "nodes": self.nodes, "label": self.label}


def _op_compatible(name: str) -> bool:
    try:
        from deepspeed.accelerator import get_accelerator

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            builder = get_accelerator().create_op_builder(name)
            return bool(builder is not None and builder.is_compatible(verbose=False))
    except Exception:  # noqa: BLE001 - an op that cannot even be asked about is not available
        return False


@lru_cache(maxsize=1)
def detect_capabilities() -> Capabilities:
    """This machine: CUDA GPUs when torch sees them and DS_ACCELERATOR is not forced to cpu."""
    import torch

    forced_cpu = os.environ.get("DS_ACCELERATOR", "") == "cpu"
    if torch.cuda.is_available() and not forced_cpu:
        n = torch.cuda.device_count()
        name = torch.cuda.get_device_name(0)
        return Capabilities(device="cuda", gpus=n, aio=_op_compatible("AsyncIOBuilder"), gds=_op_compatible("GDSBuilder"),
                            label=f"cuda ({n}x {name})")
    return Capabilities(device="cpu", gpus=0, aio=False, gds=False, label="cpu")


# --------------------------------------------------------------------------- requirements

@dataclass(frozen=True)
class Requirement:
    name: str  # gpu | fp16 | cuda | nccl | gds | libaio | nvme | multi-gpu | multi-node | hf-auto | network | package:X
    why: str
    count: int = 1  # GPUs or nodes for multi-gpu / multi-node


_CUDA_CODE = re.compile(
    r"\.cuda\(|\btorch\.cuda\.(?!is_available)|get_accelerator\(\)\.device\(|[\"']cuda(?::\d+)?[\"']|\bFusedAdam\b|\bFusedLamb\b|\bFusedLion\b|"
    r"\bcuda_graph|\bdeepspeed\.ops\.transformer\b|\bDeepSpeedTransformerLayer\b|\bapex\b|\btriton\b|\binit_inference\b"
)
_HUB = re.compile(r"\b(?:from_pretrained|load_dataset|snapshot_download|hf_hub_download)\(\s*[\"'](?![./~])([\w\-]+(?:/[\w\-.]+)?)[\"']")
_FP16_CODE = re.compile(r"\.half\(\)|\btorch\.(?:float16|half)\b|--fp16\b")
_FP16_CFG = re.compile(r"[\"']fp16[\"']\s*:\s*\{[^{}]*[\"']enabled[\"']\s*:\s*(?:true|True)")
_NCCL = re.compile(r"[\"']nccl[\"']|\bNCCL\b(?!_)|dist_backend\s*=\s*[\"']nccl")
_GDS = re.compile(r"\bgds\b|GDSBuilder|gds_handle|[\"']use_gds[\"']\s*:\s*(?:true|True)", re.I)
_AIO = re.compile(r"\basync_io\b|\baio_handle\b|AsyncIOBuilder|\bAsyncIOHandle\b")
_NUM_STAGES = re.compile(r"\bnum_stages\s*=\s*(\d+)")
_MULTI_SIZE = re.compile(r"\b(?:ep_size|mp_size|tp_size|tensor_parallel_size|sequence_parallel_size)\s*=\s*(\d+)")
_PLACEHOLDER = re.compile(r"<[A-Za-z_][^<>]*>|\$\{?[A-Za-z_]\w*\}?")


def _walk_items(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((f"{prefix}/{k}", v))
            out.extend(_walk_items(v, f"{prefix}/{k}"))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.extend(_walk_items(v, f"{prefix}/{i}"))
    return out


def config_requirements(cfg: dict[str, Any]) -> list[Requirement]:
    reqs: list[Requirement] = []
    fp16 = cfg.get("fp16")
    if isinstance(fp16, dict) and fp16.get("enabled") in (True, "true"):
        reqs.append(Requirement("fp16", "the config enables fp16"))
    amp = cfg.get("amp")
    if isinstance(amp, dict) and amp.get("enabled") in (True, "true"):
        reqs.append(Requirement("cuda", "the config enables apex amp"))
    opt = cfg.get("optimizer")
    if isinstance(opt, dict) and str(opt.get("type", "")).lower() in ("lamb", "fusedlamb"):
        reqs.append(Requirement("cuda", f"optimizer {opt.get('type')} is the CUDA FusedLamb"))
    zero: dict[str, Any] = cfg["zero_optimization"] if isinstance(cfg.get("zero_optimization"), dict) else {}
    quant = [k for k in ("zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights") if zero.get(k) is True]
    if quant:
        reqs.append(Requirement("cuda", f"ZeRO++ {', '.join(quant)} use the CUDA quantizer op"))
    autos = [p for p, v in _walk_items(cfg) if v == "auto"]
    if autos:
        reqs.append(Requirement("hf-auto", f"'auto' values ({', '.join(autos[:3])}) are filled in by the Hugging Face Trainer"))
    for p, v in _walk_items(cfg):
        if p.endswith("/device") and v == "nvme":
            reqs.append(Requirement("nvme", f"{p.rsplit('/', 1)[0]} offloads to NVMe (libaio and an NVMe path)"))
            break
    if "aio" in cfg:
        reqs.append(Requirement("libaio", "the config has an aio block (DeepNVMe)"))
    if any(p.endswith("/use_gds") and v is True for p, v in _walk_items(cfg)):
        reqs.append(Requirement("gds", "the config asks for GPUDirect Storage"))
    for block, package, online in (("tensorboard", "tensorboard", False), ("wandb", "wandb", True), ("comet", "comet_ml", True)):
        mon = cfg.get(block)
        if isinstance(mon, dict) and mon.get("enabled") in (True, "true"):
            reqs.append(Requirement(f"package:{package}", f"the {block} monitor is enabled"))
            if online:
                reqs.append(Requirement("network", f"the {block} monitor logs to an online service"))
    tp = cfg.get("tensor_parallel")
    n_tp = tp.get("autotp_size", tp.get("tp_size", 1)) if isinstance(tp, dict) else 1
    if isinstance(n_tp, int) and n_tp > 1:
        n = n_tp
        reqs.append(Requirement("multi-gpu", f"tensor parallel size {n}", n))
    sp = cfg.get("sequence_parallel_size")
    if isinstance(sp, int) and sp > 1:
        reqs.append(Requirement("multi-gpu", f"sequence parallel size {sp}", sp))
    return reqs


def _top_imports(tree: ast.AST) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module.split(".")[0])
    return mods


@lru_cache(maxsize=512)
def package_installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def python_requirements(code: str, tree: ast.AST | None) -> list[Requirement]:
    reqs: list[Requirement] = []
    if _FP16_CODE.search(code) or (_FP16_CFG.search(code) and re.search(r"\binitialize\(|\binit_inference\(", code)):
        reqs.append(Requirement("fp16", "the code trains or casts in fp16"))
    m = _CUDA_CODE.search(code)
    if m:
        reqs.append(Requirement("cuda", f"CUDA-only code ({m.group(0).strip()!s})"))
    if _NCCL.search(code):
        reqs.append(Requirement("nccl", "uses the NCCL backend"))
    hub = _HUB.search(code)
    if hub:
        reqs.append(Requirement("network", f"downloads {hub.group(1)} from the Hugging Face Hub"))
    if _GDS.search(code):
        reqs.append(Requirement("gds", "uses GPUDirect Storage"))
    if _AIO.search(code):
        reqs.append(Requirement("libaio", "uses DeepNVMe async I/O (libaio)"))
    for pat, what in ((_NUM_STAGES, "pipeline stages"), (_MULTI_SIZE, "parallel size")):
        for m2 in pat.finditer(code):
            n = int(m2.group(1))
            if n > 1:
                reqs.append(Requirement("multi-gpu", f"{n} {what} ({m2.group(0)})", n))
    if tree is not None:
        for mod in sorted(_top_imports(tree)):
            if mod not in sys.builtin_module_names and not package_installed(mod):
                reqs.append(Requirement(f"package:{mod}", f"imports {mod}, which is not installed"))
    return reqs


def detect_requirements(kind: str, code: str, tags: tuple[str, ...] | list[str] = ()) -> list[Requirement]:
    """Everything the snippet needs beyond one CPU process with deepspeed and torch."""
    reqs = [Requirement(t, f"tagged requires={t}") for t in tags if t and t != "cpu"]
    if kind == "ds_config":
        try:
            cfg, _ = parse_config_text(code)
        except ValueError:
            cfg = None
        if isinstance(cfg, dict):
            reqs += config_requirements(cfg)
    elif kind == "python":
        try:
            tree: ast.AST | None = ast.parse(textwrap.dedent(code))
        except SyntaxError:
            tree = None
        reqs += python_requirements(code, tree)
    elif kind == "launcher":
        reqs += launcher_requirements(code)
    elif kind == "hostfile":
        hosts = _hostfile_hosts(code)
        if len(hosts) > 1:
            reqs.append(Requirement("multi-node", f"{len(hosts)} hosts in the hostfile", len(hosts)))
    return reqs


def unmet(reqs: list[Requirement], caps: Capabilities) -> list[Requirement]:
    missing: list[Requirement] = []
    for r in reqs:
        ok: bool
        if r.name in ("gpu", "cuda", "fp16", "nccl"):
            ok = caps.cuda
        elif r.name == "multi-gpu":
            ok = caps.cuda and caps.gpus >= max(r.count, 2)
        elif r.name == "multi-node":
            ok = caps.nodes >= max(r.count, 2)
        elif r.name in ("libaio", "nvme"):
            ok = caps.aio
        elif r.name == "gds":
            ok = caps.gds
        elif r.name in ("hf-auto", "network"):  # sandboxed runs have no network
            ok = False
        elif r.name.startswith("package:"):
            ok = package_installed(r.name.split(":", 1)[1])
        else:  # an unknown tag: do not pretend to satisfy it
            ok = False
        if not ok:
            missing.append(r)
    return missing


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


def _touches_checkpointing(cfg: dict[str, Any]) -> bool:
    if "checkpoint" in cfg:
        return True
    zero = cfg.get("zero_optimization")
    return isinstance(zero, dict) and any("on_model_save" in k or k.startswith("checkpoint") for k in zero)


def prepare_ds_config(code: str, caps: Capabilities) -> Prepared:
    from indexer.config_check import validate_config

    try:
        cfg, fragment = parse_config_text(code)
    except ValueError as exc:
        return Prepared(skip=f"not a readable config: {exc}"[:300])
    if not isinstance(cfg, dict):
        return Prepared(skip="not a JSON object")
    world = 1  # one process per config run
    run_cfg, notes = adapt_config(cfg, world)
    if fragment:
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
    }
    files = {"ds_config.json": json.dumps(run_cfg, indent=2), "plan.json": json.dumps(plan), "driver.py": _driver("ds_config_driver.py")}
    return Prepared(files=files, argv=[sys.executable, "driver.py"], adaptations=notes, expect_unknown_keys=unknown)


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
    }
)


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
    return [n for n in loaded if n not in bound]


def prepare_python(code: str, caps: Capabilities) -> Prepared:
    src = textwrap.dedent(code)
    if src.lstrip().startswith(">>>"):
        src = "\n".join(line[4:] for line in src.splitlines() if line.startswith((">>> ", "... ")))
    try:
        tree = ast.parse(src)
    except SyntaxError as exc:
        return Prepared(skip=f"fragment: not complete Python (line {exc.lineno}: {exc.msg})")
    if any(isinstance(n, ast.Call) and any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in [*n.args, *(k.value for k in n.keywords)])
           for n in ast.walk(tree)):
        return Prepared(skip="fragment: '...' placeholders in a call")
    names = free_names(tree)
    unknown = [n for n in names if n not in PRELUDE_NAMES]
    if unknown:
        return Prepared(skip=f"fragment: uses names it does not define and the prelude does not supply: {', '.join(unknown[:6])}")
    supplied = [n for n in names if n in PRELUDE_NAMES]
    plan = {"names": supplied, "client_optimizer": "optimizer=" in src, "device": caps.device}
    files = {"snippet.py": src, "prelude.py": _driver("prelude.py"), "plan.json": json.dumps(plan), "main.py": _driver("python_main.py")}
    adaptations = [f"prelude supplied: {', '.join(supplied)}"] if supplied else []
    return Prepared(files=files, argv=[sys.executable, "main.py"], adaptations=adaptations)


# --------------------------------------------------------------------------- launcher

def _hostfile_hosts(code: str) -> list[tuple[str, int]]:
    hosts = []
    for line in code.splitlines():
        m = re.match(r"^\s*([\w.\-]+)\s+slots\s*=\s*(\d+)\s*$", line)
        if m:
            hosts.append((m.group(1), int(m.group(2))))
    return hosts


def _launcher_lines(code: str) -> list[list[str]]:
    """Each `deepspeed ...` command of the snippet, as words (env assignments and `$ ` dropped)."""
    out = []
    for raw in code.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line.removeprefix("$ "), comments=True)
        except ValueError:
            continue
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words.pop(0)
        if words and words[0] == "deepspeed":
            out.append(words)
    return out


@lru_cache(maxsize=1)
def _launcher_parser() -> Any:
    from deepspeed.launcher.runner import parse_args

    return parse_args


def _parse_launcher(words: list[str]) -> tuple[Any | None, str]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return _launcher_parser()(words[1:]), ""
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return None, (lines[-1] if lines else "rejected by deepspeed's launcher parser")[:300]


def launcher_requirements(code: str) -> list[Requirement]:
    reqs: list[Requirement] = []
    for words in _launcher_lines(code):
        if any(_PLACEHOLDER.search(w) for w in words):
            continue
        args, _ = _parse_launcher(words)
        if args is None:
            continue
        if args.num_nodes and args.num_nodes > 1:
            reqs.append(Requirement("multi-node", f"--num_nodes {args.num_nodes}", args.num_nodes))
        if args.num_gpus and args.num_gpus > 1:
            reqs.append(Requirement("multi-gpu", f"--num_gpus {args.num_gpus}", args.num_gpus))
        if args.include:
            slots = re.findall(r"[\w.\-]+(?::([\d,]+))?", args.include)
            hosts = [h for h in args.include.split("@") if h]
            if len(hosts) > 1:
                reqs.append(Requirement("multi-node", f"--include {args.include}", len(hosts)))
            n = sum(len(s.split(",")) for s in slots if s)
            if n > 1:
                reqs.append(Requirement("multi-gpu", f"--include {args.include}", n))
        if args.master_addr and args.master_addr not in ("localhost", "127.0.0.1"):
            reqs.append(Requirement("multi-node", f"--master_addr {args.master_addr}", 2))
        if args.launcher and args.launcher.lower() != "pdsh" or args.force_multi:
            reqs.append(Requirement("multi-node", f"--launcher {args.launcher} / --force_multi", 2))
        if args.hostfile and "--hostfile" in " ".join(words) or any(w.startswith(("-H", "--hostfile")) for w in words[1:]):
            reqs.append(Requirement("multi-node", f"a hostfile ({args.hostfile}) that this snippet does not include", 2))
        if args.autotuning:
            reqs.append(Requirement("gpu", "--autotuning runs experiments that measure GPU memory and throughput"))
        if "--fp16" in words:
            reqs.append(Requirement("fp16", "--fp16"))
    return reqs


def prepare_launcher(code: str, caps: Capabilities, *, hostfile: bool = False) -> Prepared:
    adaptations: list[str] = []
    if hostfile:
        hosts = _hostfile_hosts(code)
        if not hosts:
            return Prepared(skip="no 'host slots=N' line")
        host, slots = hosts[0]
        want = slots if caps.cuda else 1
        n = min(want, caps.gpus) if caps.cuda else 1
        adaptations.append(f"hostfile '{host} slots={slots}' -> 'localhost slots={n}' (this machine)")
        files = {"hostfile": f"localhost slots={n}\n"}
        words = ["deepspeed", "--hostfile", "hostfile", "--no_ssh_check", "train.py"]
        launcher_words = words
    else:
        lines = _launcher_lines(code)
        if not lines:
            return Prepared(skip="no `deepspeed` launcher line (torchrun, srun and mpirun are not run)")
        launcher_words = lines[0]
        if any(_PLACEHOLDER.search(w) for w in launcher_words):
            return Prepared(skip="the launcher line has placeholders (<...> or $VARS) to fill in")
        args, err = _parse_launcher(launcher_words)
        if args is None:
            return Prepared(files={"err.txt": err}, argv=[sys.executable, "-c", f"import sys; sys.exit({json.dumps('deepspeed launcher rejected the line: ' + err)})"])
        if args.module or args.no_python:
            return Prepared(skip="runs a module or a non-Python program (--module / --no_python): nothing of ours to substitute")
        files = {}
        words = ["deepspeed"]
        for flag in ("master_port", "bind_cores_to_rank", "bind_core_list", "log_level", "enable_each_rank_log"):
            v = getattr(args, flag, None)
            if v not in (None, False, "", -1) and f"--{flag}" in " ".join(launcher_words):
                words += [f"--{flag}"] if v is True else [f"--{flag}", str(v)]
        if caps.cuda:
            n = args.num_gpus if args.num_gpus and args.num_gpus > 0 else caps.gpus
            words += ["--num_gpus", str(min(n, caps.gpus))]
        else:
            words += ["--num_gpus", "1"]
            if args.num_gpus != 1:
                adaptations.append("one process on CPU (--num_gpus 1)")
        words.append("train.py")
        if args.user_script != "train.py":
            adaptations.append(f"user script {args.user_script} -> dsqa's tiny training script (its arguments kept for parsing)")
        words += list(args.user_args)
    files["train.py"] = _driver("tiny_train.py")
    files["ds_config.json"] = json.dumps({**BASE_CONFIG, "steps_per_print": 1})
    argv = [sys.executable, "-m", "deepspeed.launcher.runner", *words[1:]]
    return Prepared(files=files, argv=argv, adaptations=adaptations)


def prepare(kind: str, code: str, caps: Capabilities) -> Prepared:
    if kind == "ds_config":
        return prepare_ds_config(code, caps)
    if kind == "python":
        return prepare_python(code, caps)
    if kind == "launcher":
        return prepare_launcher(code, caps)
    if kind == "hostfile":
        return prepare_launcher(code, caps, hostfile=True)
    return Prepared(skip=f"{kind} snippets are not run")
