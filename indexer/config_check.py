"""Validate a user's DeepSpeed config: DeepSpeed's own parser plus the checks it lets slip.

Unknown keys at any depth (with a did-you-mean from the real catalogue), wrong types, removed and
deprecated keys, fp16 and bf16 together, batch arithmetic, offload blocks the ZeRO stage ignores and
ZeRO-Offload with optimizers it cannot run on the CPU. HF Trainer "auto" values are accepted.
"""

from __future__ import annotations

import copy
import difflib
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from indexer.config_catalogue import DEEPSPEED_LOGGER, ConfigKey, build_catalogue, logs_to_stderr
from indexer.quiet import captured, logger_quiet

DOC = "https://www.deepspeed.ai/docs/config-json/"
_ANCHORS = {
    "train_batch_size": "batch-size-related-parameters",
    "train_micro_batch_size_per_gpu": "batch-size-related-parameters",
    "gradient_accumulation_steps": "batch-size-related-parameters",
    "optimizer": "optimizer-parameters",
    "scheduler": "scheduler-parameters",
    "fp16": "fp16-training-options",
    "bf16": "bfloat16-training-options",
    "zero_optimization": "zero-optimizations-for-fp16-training",
    "activation_checkpointing": "activation-checkpointing",
    "flops_profiler": "flops-profiler",
    "gradient_clipping": "gradient-clipping",
}
# free-form blocks whose inner keys DeepSpeed passes on without a schema
_FREE_FORM = {"optimizer", "scheduler", "optimizer.params", "scheduler.params", "autotuning", "data_efficiency", "activation_checkpointing", "flops_profiler"}
CPU_OFFLOAD_OPTIMIZERS = {"adam", "adamw", "adagrad", "lion"}


@dataclass
class Finding:
    pointer: str
    message: str
    suggestion: str | None = None
    doc_url: str | None = None


@dataclass
class ValidationResult:
    valid: bool
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def clean(f: Finding) -> dict[str, Any]:
            return {k: v for k, v in asdict(f).items() if v is not None}

        return {"valid": self.valid, "errors": [clean(e) for e in self.errors], "warnings": [clean(w) for w in self.warnings]}


def pointer(path: list[str]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def doc_url(path: list[str]) -> str:
    for key in (path[0] if path else "", path[-1] if path else ""):
        if key in _ANCHORS:
            return DOC + "#" + _ANCHORS[key]
    return DOC


@lru_cache(maxsize=1)
def keys_by_path() -> dict[str, ConfigKey]:
    """Every config key by dotted path; an alias path resolves to the key it stands for."""
    keys: dict[str, ConfigKey] = {key.path: key for key in build_catalogue()}
    for key in build_catalogue():
        parent = key.path.rsplit(".", 1)[0] if "." in key.path else ""
        for alias in key.aliases:
            keys.setdefault(f"{parent}.{alias}" if parent else alias, key)
    return keys


@lru_cache(maxsize=1)
def _catalogue() -> tuple[dict[str, ConfigKey], dict[str, set[str]]]:
    """Keys by dotted path (aliases too) and the known children of each section."""
    by_path = keys_by_path()
    children: dict[str, set[str]] = {"": set()}
    for dotted in by_path:
        parent, _, name = dotted.rpartition(".")
        children.setdefault(parent, set()).add(name)
    return by_path, children


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def _type_ok(expected: str, value: Any) -> bool:
    """Check a JSON value against the primitive types named in a catalogue type string."""
    if _is_auto(value) or value is None:
        return True
    names = set(re.findall(r"\b(bool|int|float|str)\b", expected.lower()))
    if not names or re.search(r"\b(dict|list|any|literal|enum)\b", expected.lower()):
        return True
    checks = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool) or (isinstance(value, float) and value.is_integer()),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "str": isinstance(value, str),
    }
    return any(checks[n] for n in names)


def _walk(cfg: dict[str, Any], path: list[str], result: ValidationResult) -> None:
    by_path, children = _catalogue()
    parent = ".".join(path)
    known = children.get(parent)
    for key, value in cfg.items():
        here = [*path, str(key)]
        dotted = ".".join(here)
        entry = by_path.get(dotted)
        if entry is None:
            if known and parent not in _FREE_FORM:
                close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
                where = f"under {parent}" if parent else "at the top level"
                result.errors.append(
                    Finding(
                        pointer(here),
                        f"unknown key '{key}' {where}: deepspeed does not read it, so it would be ignored",
                        f"did you mean '{close[0]}'?" if close else None,
                        doc_url(here),
                    )
                )
            continue
        if entry.removed:
            result.errors.append(Finding(pointer(here), f"'{dotted}' was removed from deepspeed: {entry.removed}", None, doc_url(here)))
            continue
        if entry.deprecated:
            repl = f"use '{entry.deprecated}' instead" if entry.deprecated != "deprecated" else None
            result.warnings.append(Finding(pointer(here), f"'{dotted}' is deprecated", repl, doc_url(here)))
        if isinstance(value, dict):
            if dotted not in _FREE_FORM:
                _walk(value, here, result)
        elif entry.choices and not _is_auto(value) and value not in entry.choices and not (isinstance(value, str) and value.lower() in entry.choices):
            allowed = ", ".join(repr(c) for c in entry.choices)
            close = difflib.get_close_matches(str(value), [str(c) for c in entry.choices], n=1, cutoff=0.5)
            result.errors.append(
                Finding(pointer(here), f"'{dotted}' must be one of {allowed}, got {value!r}"[:300],
                        f"did you mean {close[0]!r}?" if close else None, doc_url(here))
            )
        elif not entry.is_section and not _type_ok(entry.type, value):
            result.errors.append(
                Finding(pointer(here), f"'{dotted}' must be of type {entry.type}, got {type(value).__name__} {value!r}"[:300], None, doc_url(here))
            )
        elif entry.is_section and entry.type == "dict" and not isinstance(value, dict | bool):
            result.errors.append(Finding(pointer(here), f"'{dotted}' must be an object, got {type(value).__name__}", None, doc_url(here)))


def _num(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _block(cfg: dict[str, Any], key: str) -> dict[str, Any]:
    value = cfg.get(key)
    return value if isinstance(value, dict) else {}


def _semantic(cfg: dict[str, Any], world_size: int, result: ValidationResult) -> None:
    fp16, bf16 = _block(cfg, "fp16"), _block(cfg, "bf16")
    if fp16.get("enabled") is True and bf16.get("enabled") is True:
        result.errors.append(Finding("/bf16/enabled", "fp16 and bf16 are both enabled: choose one", "set fp16.enabled or bf16.enabled to false", doc_url(["bf16"])))
    tbs, mbs, gas = (_num(cfg.get(k)) for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"))
    if tbs is not None and mbs is not None and gas is not None and tbs != mbs * gas * world_size:
        result.errors.append(
            Finding(
                "/train_batch_size",
                f"train_batch_size {tbs} != train_micro_batch_size_per_gpu {mbs} x gradient_accumulation_steps {gas} x world size {world_size} = {mbs * gas * world_size}",
                f"set train_batch_size to {mbs * gas * world_size}, or give only two of the three",
                doc_url(["train_batch_size"]),
            )
        )
    elif tbs is not None and mbs is not None and gas is None and tbs % (mbs * world_size):
        result.errors.append(Finding("/train_batch_size", f"train_batch_size {tbs} is not divisible by micro batch {mbs} x world size {world_size}", None, doc_url(["train_batch_size"])))
    zero = _block(cfg, "zero_optimization")
    stage = _num(zero.get("stage")) or 0
    for block, needed in (("offload_param", 3), ("offload_optimizer", 1)):
        sub = zero.get(block)
        if isinstance(sub, dict) and str(sub.get("device", "none")).lower() != "none" and stage < needed:
            result.warnings.append(
                Finding(f"/zero_optimization/{block}", f"{block} is ignored at ZeRO stage {stage}: it needs stage {'3' if needed == 3 else '1 or higher'}", f"set zero_optimization.stage to {max(needed, 2) if block == 'offload_optimizer' else 3}", doc_url(["zero_optimization"]))
            )
    _check_named_types(cfg, result)
    # what DeepSpeedEngine / the ZeRO-3 optimizer refuse at initialize, after the config parser accepted it
    params = _block(_block(cfg, "optimizer"), "params")
    if "max_grad_norm" in params:
        result.errors.append(Finding("/optimizer/params/max_grad_norm", "deepspeed refuses 'max_grad_norm' as an optimizer parameter at initialize",
                                     "set the top-level gradient_clipping instead", doc_url(["gradient_clipping"])))
    if str(_block(cfg, "optimizer").get("type", "")).lower() == "muon" and stage == 3 and zero.get("reduce_scatter", True) is not False:
        result.errors.append(Finding("/zero_optimization/reduce_scatter", "ZeRO-3 refuses Muon with reduce_scatter on (the default) at initialize",
                                     "set zero_optimization.reduce_scatter to false", doc_url(["zero_optimization"])))
    off = zero.get("offload_optimizer")
    opt = _block(cfg, "optimizer")
    opt_type = str(opt.get("type", "")).lower()
    if isinstance(off, dict) and str(off.get("device", "none")).lower() in {"cpu", "nvme"} and stage >= 1 and opt_type and opt_type not in CPU_OFFLOAD_OPTIMIZERS:
        result.errors.append(
            Finding("/optimizer/type", f"ZeRO-Offload runs the optimizer step on the CPU, which deepspeed supports for {sorted(CPU_OFFLOAD_OPTIMIZERS)}; '{opt.get('type')}' is refused or unsupported there", "use Adam, AdamW, Adagrad or Lion, or turn offload_optimizer off", doc_url(["optimizer"]))
        )


def _check_named_types(cfg: dict[str, Any], result: ValidationResult) -> None:
    """optimizer.type and scheduler.type must name something the installed deepspeed can build."""
    import torch
    from deepspeed.runtime import lr_schedules
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    opt_type = _block(cfg, "optimizer").get("type")
    if isinstance(opt_type, str) and not _is_auto(opt_type):
        if opt_type.lower() not in DEEPSPEED_OPTIMIZERS and not hasattr(torch.optim, opt_type):
            close = difflib.get_close_matches(opt_type.lower(), DEEPSPEED_OPTIMIZERS, n=1, cutoff=0.6)
            result.errors.append(
                Finding("/optimizer/type", f"optimizer type '{opt_type}' is neither one of deepspeed's optimizers {sorted(DEEPSPEED_OPTIMIZERS)} nor a torch.optim class",
                        f"did you mean '{close[0]}'?" if close else None, doc_url(["optimizer"]))
            )
    sched_type = _block(cfg, "scheduler").get("type")
    if isinstance(sched_type, str) and not _is_auto(sched_type):
        if not hasattr(lr_schedules, sched_type) and not hasattr(torch.optim.lr_scheduler, sched_type):
            valid = list(lr_schedules.VALID_LR_SCHEDULES)
            close = difflib.get_close_matches(sched_type, valid, n=1, cutoff=0.6)
            result.errors.append(
                Finding("/scheduler/type", f"scheduler type '{sched_type}' is neither one of deepspeed's schedules {valid} nor a torch.optim.lr_scheduler class",
                        f"did you mean '{close[0]}'?" if close else None, doc_url(["scheduler"]))
            )


def _strip_auto(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_auto(v) for k, v in value.items() if not _is_auto(v)}
    return value


def _deepspeed_parser(cfg: dict[str, Any], world_size: int) -> str | None:
    """Run DeepSpeed's own DeepSpeedConfig; return its complaint, if any."""
    logs_to_stderr()
    from deepspeed.runtime.config import DeepSpeedConfig

    class _Mpu:  # tells DeepSpeed the data-parallel world size without torch.distributed
        def get_data_parallel_world_size(self) -> int:
            return world_size

        def get_model_parallel_world_size(self) -> int:
            return 1

    data = _strip_auto(copy.deepcopy(cfg))
    if world_size != 1 and all(k in data for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")):
        data.pop("train_batch_size", None)  # checked above with the real world size; DeepSpeed sees 1 here
    if not any(k in data for k in ("train_batch_size", "train_micro_batch_size_per_gpu")):
        data["train_micro_batch_size_per_gpu"] = 1
    try:
        with captured(), logger_quiet(DEEPSPEED_LOGGER):  # what it warns of (deprecated keys) is in our findings
            DeepSpeedConfig(data, mpu=_Mpu())
    except Exception as exc:  # noqa: BLE001 - DeepSpeed's own message is the finding
        lines = [line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
        return " | ".join(line for line in lines if not line.startswith("For further information"))[:500]
    return None


def validate_config(cfg: Any, world_size: int = 1) -> ValidationResult:
    result = ValidationResult(valid=True)
    if not isinstance(cfg, dict):
        result.errors.append(Finding("", f"a DeepSpeed config must be a JSON object, got {type(cfg).__name__}", None, DOC))
        result.valid = False
        return result
    _walk(cfg, [], result)
    _semantic(cfg, world_size, result)
    if not result.errors:
        complaint = _deepspeed_parser(cfg, world_size)
        if complaint:
            result.errors.append(Finding("", f"deepspeed's own config parser rejects it: {complaint}", None, DOC))
    result.valid = not result.errors
    return result
