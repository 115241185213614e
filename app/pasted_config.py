"""A DeepSpeed config pasted into a question, found and checked: the answer's first lines.

"Is this config right? {"train_batch_size": 32, ...}" is answered first by what the config validator
(`indexer.config_check`: the catalogue's keys and types, the checks deepspeed lets slip, deepspeed's own
parser behind them) says of it, then by the docs' passages. The reading is pure text:
- `pasted_config`: the first JSON object (or Python dict literal) in the text that is a config's top
  level (two or more top-level config keys, most of its keys), or one block: written after its key
  (`"zero_optimization": {"stage": 2, ...}`) or alone (`{"optimizer": {...}}`), checked as a config
  holding only that block;
- `world_size_said`: the number of GPUs the text names ("on 8 GPUs", "8 卡", "--num_gpus 8"), which the
  batch arithmetic needs;
- `config_check_line`: the validator's findings as the answer's opening lines. A whole config that
  passes says so (and what was checked); a block that passes says nothing, since the question is
  about something else ("with "bf16": {"enabled": true} it crashes on TITAN X").
A whole config's check answers the question whatever the docs hold (`app.ask.prepare`); a block's
findings open an answer the docs cover, and a refused one keeps its own words on an unknown key.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from app.query import block_end
from indexer.config_check import ValidationResult, validate_config

log = logging.getLogger(__name__)

_KEY_BEFORE = re.compile(r"""["']?([A-Za-z_][A-Za-z0-9_]*)["']?\s*[:=]\s*$""")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_WORLD = re.compile(
    r"(?:--num_gpus[= ]|--nproc_per_node[= ]|nproc_per_node=)(\d{1,5})"
    r"|(\d{1,5})\s*(?:x\s*|×\s*)?(?:gpus?\b|cards?\b|ranks?\b|npus?\b|个?\s*(?:卡|gpu|GPU|显卡))",
    re.IGNORECASE,
)
_BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
CHECKED = "unknown keys, types, fp16/bf16, batch arithmetic, offload against the ZeRO stage"
MAX_STARTS = 32  # the opening braces a question's text is read from


@dataclass(frozen=True)
class PastedConfig:
    config: dict[str, Any]
    whole: bool  # a config's top level (two or more of its keys); else one block, written after its key or alone


def _read_object(text: str, start: int) -> tuple[Any, int]:
    """The JSON object (or Python dict literal, or JSON with trailing commas) starting at `start`, and
    where it ends; (None, start + 1) when none parses there."""
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        pass
    end = block_end(text, start)
    if end is not None:
        for parse in (ast.literal_eval, lambda s: json.loads(_TRAILING_COMMA.sub(r"\1", s))):
            try:
                return parse(text[start:end]), end
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
    return None, start + 1


def pasted_config(text: str, top_keys: Iterable[str]) -> PastedConfig | None:
    """The first config (or config block) the text holds; None when it holds none."""
    tops = set(top_keys)
    at = text.find("{")
    for _ in range(MAX_STARTS):  # "{{{{...": each start reads on to its closing brace; a few are enough
        if at == -1:
            break
        value, end = _read_object(text, at)
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            known = sum(1 for k in value if k in tops)
            if known and known * 2 >= len(value):
                return PastedConfig(value, known >= 2)  # one key alone may be an argument's value: a block
            named = _KEY_BEFORE.search(text[max(0, at - 60):at])
            if named and named.group(1) in tops:
                return PastedConfig({named.group(1): value}, False)
            at = text.find("{", at + 1)  # a block inside it may be one written after its key
        else:
            at = text.find("{", end if value is not None else at + 1)
    return None


def world_size_said(text: str) -> int | None:
    """The number of GPUs the text names, when it names one (the first such number)."""
    for m in _WORLD.finditer(text):
        n = int(m.group(1) or m.group(2))
        if n >= 1:
            return n
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _shown(pointer: str) -> str:
    return pointer.strip("/").replace("/", ".")


def config_check_line(pasted: PastedConfig, question: str, version: str,
                      validate: Callable[[Any, int], ValidationResult] = validate_config) -> str:
    """The validator's word on the pasted config, for the answer's first lines ('' when a block passes)."""
    config = pasted.config
    tbs, mbs, gas = (_int(config.get(k)) for k in _BATCH)
    said = world_size_said(question)
    per_step = mbs * gas if mbs and gas else None
    # without a stated GPU count, the batch sizes hold on tbs / (micro x accumulation) GPUs, when that divides
    implied = tbs // per_step if said is None and tbs and per_step and tbs % per_step == 0 else None
    try:
        result = validate(config, said or implied or 1)
    except Exception:  # noqa: BLE001 - a config the validator cannot read leaves the docs' answer alone
        log.warning("pasted config not checked", exc_info=True)
        return ""
    lines: list[str] = []
    for finding, warned in [(f, False) for f in result.errors] + [(f, True) for f in result.warnings]:
        where = f"`{_shown(finding.pointer)}`: " if finding.pointer else ""
        if finding.pointer == "/train_batch_size" and said is None and tbs and per_step and tbs % per_step:
            text = (f"train_batch_size {tbs} is not train_micro_batch_size_per_gpu {mbs} x gradient_accumulation_steps {gas} "
                    f"x any number of GPUs; give two of the three and deepspeed infers the third")
        else:
            text = finding.message + (f"; {finding.suggestion}" if finding.suggestion else "")
        warning = " (a warning: deepspeed runs, ignoring it)" if warned else ""
        lines.append(f"- {where}{text.rstrip('.?! ')}{warning}." if not text.endswith("?") or warning else f"- {where}{text}")
    if implied and implied > 1:
        lines.append(f"- `train_batch_size`: {tbs} = micro batch {mbs} x accumulation {gas} x {implied} GPUs, so it holds only when "
                     f"{implied} GPUs train; give two of the three and deepspeed infers the third.")
    where = f"deepspeed {version}'s" if version else "the installed deepspeed's"
    if not result.errors and not result.warnings:
        if not pasted.whole:
            return ""
        head = f"Your config passes {where} config parser and dsqa's checks ({CHECKED})."
        return "\n".join([head, *lines]) + "\n\n"
    problems = len(result.errors) + len(result.warnings)
    what = "config" if pasted.whole else f"`{next(iter(config))}` block"
    head = f"Your {what}, checked by {where} config parser and dsqa's checks: {problems} problem{'s' if problems > 1 else ''}."
    return "\n".join([head, *lines]) + "\n\n"
