"""What a snippet needs to run, and what a runner's machine offers.

Requirements are detected from the code (and the notes' `requires=` tags), never guessed: fp16,
CUDA-only code and ops, GDS, NCCL, several GPUs or nodes, libaio, packages that are not installed,
and HF `"auto"` values. A runner that lacks one reports `skipped` with the reason, unless a CPU run
can meet it by adapting the snippet and saying so (`cpu_adaptable`: an fp16 config runs as bf16, a
launcher line's --fp16 goes to the tiny script standing in for the user's, a few GPUs of a launcher line or a tensor-parallel config are as many CPU processes).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import runpy
import sys
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from indexer.launcher_line import hostfile_hosts, include_slots, launcher_lines, names_hostfile, parse_filled
from indexer.snippet_check import parse_config_mended


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
    """Whether this accelerator has the op and it can build here. Not under a redirected stdout: the
    builders' compile-and-link probe (libaio's `io_submit`) needs real file descriptors."""
    try:
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder(name)
        if builder is None or builder.name == "deepspeed_not_implemented":  # the CPU accelerator's stand-in
            return False
        return bool(builder.is_compatible(verbose=False))
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
    # DeepNVMe's async I/O builds on a CPU too (libaio-dev installed); GDS is CUDA-only
    return Capabilities(device="cpu", gpus=0, aio=_op_compatible("AsyncIOBuilder"), gds=False, label="cpu")


# --------------------------------------------------------------------------- requirements

@dataclass(frozen=True)
class Requirement:
    name: str  # gpu | fp16 | cuda | nccl | gds | libaio | nvme | multi-gpu | multi-node | hf-auto | network | package:X
    why: str
    count: int = 1  # GPUs or nodes for multi-gpu / multi-node
    subject: str = ""  # network: the Hugging Face Hub id a snippet would download


@lru_cache(maxsize=1)
def _stand_ins() -> dict[str, Any]:
    """The tiny Hub stand-ins' table, from the driver that builds them in the sandbox (one owner)."""
    return runpy.run_path(str(Path(__file__).resolve().parent / "drivers" / "hub_stand_in.py"))


def hub_stand_in(hub_id: str) -> str | None:
    """The model family dsqa stands in for this Hub id at toy size (eval/drivers/hub_stand_in.py), or None."""
    family: str | None = _stand_ins()["family_of"](hub_id)
    return family


DEEPSPEED_AUTO = ("/zero_optimization/zenflow/",)  # where "auto" is a value deepspeed reads itself
TP_SIZE = "tensor parallel size"  # how a tensor-parallel config's multi-gpu requirement begins its reason
MPI_LAUNCH = "an MPI launch"  # how a launcher line's multi-node requirement for mpirun/impi/mvapich begins its reason
WANDB_ONLINE = "the wandb monitor logs to an online service"  # met offline (WANDB_MODE=offline in every sandbox)


_CUDA_CODE = re.compile(
    r"\.cuda\(|\btorch\.cuda\.(?!is_available)|get_accelerator\(\)\.device\(|[\"']cuda(?::\d+)?[\"']|\bFusedAdam\b|\bFusedLamb\b|\bFusedLion\b|"
    r"\bcuda_graph|\bdeepspeed\.ops\.transformer\b|\bDeepSpeedTransformerLayer\b|\bapex\b|\btriton\b|"
    # init_inference runs on a CPU (AutoTP, injection policies); its fused-kernel injection is CUDA's
    r"\breplace_with_kernel_inject\s*=\s*True|[\"']replace_with_kernel_inject[\"']\s*:\s*True"
)
_HUB = re.compile(r"\b(?:from_pretrained|load_dataset|snapshot_download|hf_hub_download)\(\s*[\"'](?![./~])([\w\-]+(?:/[\w\-.]+)?)[\"']"
                  r"|\bpipeline\([^)]*?\bmodel\s*=\s*[\"'](?![./~])([\w\-]+(?:/[\w\-.]+)?)[\"']")
_FP16_CODE = re.compile(r"\.half\(\)|\btorch\.(?:float16|half)\b|--fp16\b")
_FP16_CFG = re.compile(r"[\"']fp16[\"']\s*:\s*\{[^{}]*[\"']enabled[\"']\s*:\s*(?:true|True)")
_NCCL = re.compile(r"[\"']nccl[\"']|\bNCCL\b(?!_)|dist_backend\s*=\s*[\"']nccl")
_GDS = re.compile(r"\bgds\b|GDSBuilder|gds_handle|[\"']use_gds[\"']\s*:\s*(?:true|True)", re.I)
_AIO = re.compile(r"\basync_io\b|\baio_handle\b|AsyncIOBuilder|\bAsyncIOHandle\b")
_NUM_STAGES = re.compile(r"\bnum_stages\s*=\s*(\d+)")
_MULTI_SIZE = re.compile(r"\b(?:ep_size|mp_size|tp_size|tensor_parallel_size|sequence_parallel_size)\s*=\s*(\d+)"
                         r"|[\"'](?:autotp_size|tp_size|sequence_parallel_size)[\"']\s*:\s*(\d+)")


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
    # "auto" the HF Trainer fills in; ZenFlow's own select/update settings take "auto" in deepspeed itself
    autos = [p for p, v in _walk_items(cfg) if v == "auto" and not p.startswith(DEEPSPEED_AUTO)]
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
                reqs.append(Requirement("network", f"the {block} monitor logs to an online service"))  # wandb's: WANDB_ONLINE
    n_tp = tensor_parallel_size(cfg)
    if n_tp > 1:
        reqs.append(Requirement("multi-gpu", f"{TP_SIZE} {n_tp}", n_tp))
    ep = cfg.get("expert_parallel")
    n_ep = ep.get("autoep_size", 1) if isinstance(ep, dict) and ep.get("enabled", True) else 1
    if isinstance(n_ep, int) and n_ep > 1:
        reqs.append(Requirement("multi-gpu", f"expert parallel size {n_ep}", n_ep))
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
    for hub_id in dict.fromkeys(m.group(1) or m.group(2) for m in _HUB.finditer(code)):
        reqs.append(Requirement("network", f"downloads {hub_id} from the Hugging Face Hub", subject=hub_id))
    if _GDS.search(code):
        reqs.append(Requirement("gds", "uses GPUDirect Storage"))
    if _AIO.search(code):
        reqs.append(Requirement("libaio", "uses DeepNVMe async I/O (libaio)"))
    for pat, what in ((_NUM_STAGES, "pipeline stages"), (_MULTI_SIZE, "parallel size")):
        for m2 in pat.finditer(code):
            n = int(m2.group(1) or m2.group(2) or 1) if pat is _MULTI_SIZE else int(m2.group(1))
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
            cfg, _, _ = parse_config_mended(code)  # what a run would read (JSON slips mended)
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
        hosts = hostfile_hosts(code)
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


CPU_RANKS = 4  # CPU processes (gloo) a run may start in place of GPUs: launcher lines and tensor-parallel configs


def tensor_parallel_size(cfg: Any) -> int:
    """The AutoTP size a config asks for (1 when none)."""
    tp = cfg.get("tensor_parallel") if isinstance(cfg, dict) else None
    n = tp.get("autotp_size", tp.get("tp_size", 1)) if isinstance(tp, dict) else 1
    return n if isinstance(n, int) and n > 1 else 1


def cpu_adaptable(kind: str, requirement: Requirement) -> bool:
    """A requirement a CPU run meets by adapting the snippet (and saying so in its adaptations): an fp16
    config runs as bf16; up to CPU_RANKS GPUs of a launcher line or of a tensor-parallel config are as many
    CPU processes over gloo (the run is really distributed; only the device differs); a launcher line or
    hostfile for several nodes runs on one (this machine, a localhost hostfile: more nodes need hosts
    reachable by ssh), unless it asks for an MPI launch; the wandb monitor logs offline."""
    if requirement.name == "network" and kind == "python" and requirement.subject and hub_stand_in(requirement.subject):
        return True  # a Hub model the run builds at toy size instead (eval/drivers/hub_stand_in.py)
    if requirement.name == "network" and kind == "ds_config" and requirement.why == WANDB_ONLINE:
        return True
    if requirement.name == "multi-node" and kind in ("launcher", "hostfile"):
        return not requirement.why.startswith(MPI_LAUNCH)
    if requirement.name == "fp16" and (kind == "ds_config" or (kind == "launcher" and requirement.why == "--fp16")):
        return True  # a launcher's --fp16 belongs to the user script, which dsqa's tiny script stands in for
    if requirement.name == "multi-gpu" and 1 < requirement.count <= CPU_RANKS:
        return kind == "launcher" or (kind == "ds_config" and requirement.why.startswith(TP_SIZE))
    return False


def launcher_requirements(code: str) -> list[Requirement]:
    reqs: list[Requirement] = []
    try:
        lines = launcher_lines(code)
    except ValueError:
        lines = []
    for raw in lines:
        args, _, words, _ = parse_filled(raw)
        if args is None:
            continue
        if args.num_nodes and args.num_nodes > 1:
            reqs.append(Requirement("multi-node", f"--num_nodes {args.num_nodes}", args.num_nodes))
        if args.num_gpus and args.num_gpus > 1:
            reqs.append(Requirement("multi-gpu", f"--num_gpus {args.num_gpus}", args.num_gpus))
        if args.include:
            hosts = [h for h in args.include.split("@") if h]
            if len(hosts) > 1:
                reqs.append(Requirement("multi-node", f"--include {args.include}", len(hosts)))
            n = include_slots(args.include)
            if n > 1:
                reqs.append(Requirement("multi-gpu", f"--include {args.include}", n))
        if args.master_addr and args.master_addr not in ("localhost", "127.0.0.1"):
            reqs.append(Requirement("multi-node", f"--master_addr {args.master_addr}", 2))
        if args.launcher and args.launcher.lower() != "pdsh" or args.force_multi:
            reqs.append(Requirement("multi-node", f"{MPI_LAUNCH} (--launcher {args.launcher} / --force_multi)", 2))
        if names_hostfile(words):
            reqs.append(Requirement("multi-node", f"a hostfile ({args.hostfile}) that this snippet does not include", 2))
        if args.autotuning:
            reqs.append(Requirement("gpu", "--autotuning runs experiments that measure GPU memory and throughput"))
        if "--fp16" in words:
            reqs.append(Requirement("fp16", "--fp16"))
    return reqs


