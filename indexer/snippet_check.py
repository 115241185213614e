"""Static checks of snippets against the installed deepspeed, in the vocabulary of
`indexer/snippet_status.py` (checked | template | fails | not_checked).

ds_config: parsed (JSON, JSON with comments or trailing commas, Python dict literals; an excerpt
without outer braces is wrapped), fragments merged into a minimal base, validated by
`config_check`; text that is neither JSON nor a dict fails with the fix. python:
`indexer/python_check.py` (names resolve, calls bind). launcher: `deepspeed` lines parsed by
DeepSpeed's own launcher parser, placeholders make a template. hostfile: `host slots=N` lines.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import replace
from typing import Any

from indexer.config_catalogue import deepspeed_version
from indexer.config_check import keys_by_path, validate_config
from indexer.documents import Snippet
from indexer.json_text import brackets
from indexer.launcher_line import CHOICE, bad_hostfile_lines, launcher_lines, parse_filled
from indexer.python_check import check_python
from indexer.snippet_status import CHECKED, FAILS, NOT_CHECKED, TEMPLATE

_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu")
_PLACEHOLDER = re.compile(r"\.\.\.|…|<[A-Za-z_ ]+>|\bYOUR_\w+|\[[\w\-]+(?:\|[\w\-]+)+\]")  # [true|false]: pick one
# a bare name where a value goes (`"shape": [q_size, -1]`, `"model_parallel_size": MP_SIZE`)
_BARE_NAME = re.compile(r"(?<=[:\[,])\s*(?!(?:true|false|null|True|False|None)\b)([A-Za-z_]\w*)\s*(?=[,\]}\n])")
_UNCHECKED_KINDS = {
    "shell": "a shell command: not a DeepSpeed config, script or launcher line",
    "output": "program output, shown as printed",
    "yaml": "YAML (another tool's config)",
    "other": "text that is not code DeepSpeed reads",
}


def parse_config_text(code: str) -> tuple[Any, bool]:
    """(parsed value, is_fragment); raises ValueError when it cannot be read at all."""
    body = code.strip()
    if "=" in body.split("{", 1)[0]:
        body = body.split("=", 1)[1].strip()
    fragment = bool(_PLACEHOLDER.search(body))
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", body, flags=re.S)
    text = re.sub(r"^\s*#[^\n]*", "", text, flags=re.M)
    text = _PLACEHOLDER.sub("", text)
    text = re.sub(r",(\s*[}\]])", r"\1", text)
    text = re.sub(r",\s*,", ",", text)
    if not text.lstrip().startswith("{"):  # a bare '"key": {...}' excerpt
        text, fragment = "{" + text.strip().rstrip(",") + "}", True
    for loader in (json.loads, ast.literal_eval):
        try:
            return loader(text), fragment
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    try:  # Python dicts with True/False/None spelled the JSON way
        fixed = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", re.sub(r"\bnull\b", "None", text)))
        return ast.literal_eval(fixed), fragment
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise ValueError(f"not a readable config: {exc}") from exc


_BARE_VALUE = re.compile(r"(?<=:)(\s*)(?!(?:true|false|null|True|False|None)\b)([A-Z_][A-Z0-9_]*)(?=\s*[,}\n])")


def fill_config_placeholders(code: str) -> tuple[str, list[str]]:
    """`[true|false]` and `"[cpu|nvme]"` take their first choice, an UPPER_CASE name where a value
    goes takes 1; each filling is named (a run lists them in its adaptations)."""
    notes: list[str] = []

    def choice(m: re.Match[str]) -> str:
        notes.append(f"placeholder {m.group(0)} filled with {m.group(2)}")
        return f'"{m.group(2)}"' if m.group(1) else m.group(2)

    def bare(m: re.Match[str]) -> str:
        notes.append(f"placeholder {m.group(2)} filled with 1")
        return f"{m.group(1)}1"

    return _BARE_VALUE.sub(bare, CHOICE.sub(choice, code)), notes


def stage_it_needs(cfg: dict[str, Any]) -> int | None:
    """An excerpt that sets no ZeRO stage but holds keys only a ZeRO stage allows (partial offload,
    fp16 master weights...): the stage it is valid with (3), or None when it needs none."""
    zero = cfg.get("zero_optimization")
    if isinstance(zero, dict) and "stage" in zero:
        return None
    base = {"train_micro_batch_size_per_gpu": 1, **cfg}
    first = validate_config(base).errors
    if not first or "stage" not in first[0].message.lower():
        return None
    return 3 if not validate_config(with_stage(base, 3)).errors else None


def with_stage(cfg: dict[str, Any], stage: int) -> dict[str, Any]:
    zero = cfg.get("zero_optimization")
    return {**cfg, "zero_optimization": {**(zero if isinstance(zero, dict) else {}), "stage": stage}}


def _json_fix(code: str) -> str:
    """What to change so the text reads as JSON, when a common slip is visible."""
    fixes = []
    missing = re.search(r"[}\]\"\d]\s*\n\s*\"", code)
    if missing and not re.search(r"[,{\[]\s*$", code[: missing.start() + 1]):
        fixes.append(f"add the missing comma at the end of line {code[: missing.start()].count(chr(10)) + 1}")
    if code.count("{") != code.count("}"):
        fixes.append(f"balance the braces ({code.count('{')} '{{' against {code.count('}')} '}}')")
    if re.search(r"[\"']\s*=\s*\S", code):
        fixes.append("use ':' not '=' between a key and its value")
    if re.search(r",\s*[}\]]", code):
        fixes.append("drop the trailing comma")
    if re.search(r"(?<![\"\w])(True|False|None)\b", code) and '"' in code:
        fixes.append("write true/false/null in JSON")
    return "; ".join(fixes)


def repair_json_slips(code: str) -> tuple[str, list[str]]:
    """The text with the slips `_json_fix` names that have one sure repair: a missing comma between
    a value's end and the next `"key"` line, `=` written for `:` after a key, and brackets a text that
    stops early never closes; with what was changed (none: the text as given)."""
    lines = code.split("\n")
    repairs: list[str] = []
    following = [next((n for n in lines[i + 1:] if n.strip()), "") for i in range(len(lines))]
    for i, line in enumerate(lines):
        body = line.rstrip()
        if re.search(r"([}\]\"\d]|\btrue|\bfalse|\bnull)$", body) and following[i].lstrip().startswith('"'):
            lines[i] = body + ","
            repairs.append(f"a comma added at the end of line {i + 1}")
    text, n = re.subn(r"(\"[\w.-]+\")\s*=\s*", r"\1: ", "\n".join(lines))
    if n:
        repairs.append(f"':' for '=' after {n} key{'s' if n > 1 else ''}")
    closers = _unclosed(text)
    if closers:
        text = text.rstrip() + "\n" + closers
        repairs.append(f"'{closers}' added at the end (the text stops before closing what it opened)")
    return text, repairs


def _unclosed(text: str) -> str:
    """The closing brackets a text that stops early lacks, innermost first ('' when it closes all it opens,
    or closes one it never opened: no sure repair then)."""
    stack: list[str] = []
    for ch in brackets(text):
        if ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif not stack or stack.pop() != ch:
            return ""
    return "".join(reversed(stack))


def parse_config_mended(code: str) -> tuple[Any, bool, list[str]]:
    """`parse_config_text`, and when the text does not read, the same after `repair_json_slips`:
    (value, is_fragment, repairs made). For running a config (the static check judges it as written)."""
    try:
        cfg, fragment = parse_config_text(code)
        return cfg, fragment, []
    except ValueError:
        repaired, repairs = repair_json_slips(code)
        if not repairs:
            raise
        cfg, fragment = parse_config_text(repaired)
        return cfg, fragment, repairs


def place_fragment(cfg: dict[str, Any]) -> str | None:
    """Where in a ds_config an excerpt's keys belong: '' when they are top-level keys, the section
    path whose keys they all are (`"schedule_type": ...` sits in curriculum_learning), or None when
    they are not a DeepSpeed config's keys at all."""
    keys = keys_by_path()
    names = [k for k in cfg if isinstance(k, str)]
    if not names:
        return None
    if all(k in keys for k in names):
        return ""
    sections = sorted({p.rsplit(".", 1)[0] for p in keys if "." in p and p.rsplit(".", 1)[1] == names[0]}, key=len)
    for section in sections:
        if all(f"{section}.{k}" in keys for k in names):
            return section
    return None


def _nest(cfg: dict[str, Any], section: str) -> dict[str, Any]:
    for part in reversed(section.split(".")):
        cfg = {part: cfg}
    return cfg


def placed(cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """An excerpt nested into the section its keys belong to when they are not top-level keys
    (`"offload_param": {...}` goes under zero_optimization): (config, section or '')."""
    where = place_fragment(cfg)
    return (_nest(cfg, where), where) if where else (cfg, "")


def check_json_excerpt(code: str) -> tuple[str, str, str]:
    """(kind, status, reason) of a JSON block that did not look like a config by its keys alone:
    checked as a ds_config when its keys are a DeepSpeed config's (placed in their section)."""
    try:
        cfg, _ = parse_config_text(code)
    except ValueError:
        return "other", NOT_CHECKED, "JSON text that does not parse and names no DeepSpeed config key"
    where = place_fragment(cfg) if isinstance(cfg, dict) else None
    if where is None:
        return "other", NOT_CHECKED, "JSON whose keys are not config keys deepspeed reads at one place (another file, or a nested excerpt)"
    status, reason = check_ds_config(json.dumps(_nest(cfg, where)) if where else code)
    return "ds_config", status, (f"an excerpt of `{where}`; " if where else "") + reason


def check_ds_config(code: str) -> tuple[str, str]:
    filled, fillings = fill_config_placeholders(code)
    try:
        cfg, fragment = parse_config_text(filled)
    except ValueError as exc:
        if _PLACEHOLDER.search(code):
            return TEMPLATE, "placeholders to fill in before it parses"
        names = sorted({m.group(1) for m in _BARE_NAME.finditer(code)})
        if names:
            return TEMPLATE, "values to fill in: " + ", ".join(names[:5])
        fix = _json_fix(code)
        return FAILS, (f"not valid JSON or a Python dict: {fix}" if fix else str(exc))
    if not isinstance(cfg, dict):
        return FAILS, "not a JSON object"
    cfg, where = placed(cfg)
    fragment = fragment or bool(where)
    if not any(k in cfg for k in _BATCH_KEYS):
        fragment = True
        cfg = {"train_micro_batch_size_per_gpu": 1, **cfg}
    stage = stage_it_needs(cfg) if fragment else None
    if stage is not None:
        cfg = with_stage(cfg, stage)
    result = validate_config(cfg)
    if result.errors:
        first = result.errors[0]
        return FAILS, f"{first.pointer or '/'}: {first.message}" + (f" ({first.suggestion})" if first.suggestion else "")
    if _PLACEHOLDER.search(code) or fillings:
        named = ", ".join(dict.fromkeys(f.split(" ")[1] for f in fillings)) if fillings else "'...'"
        return TEMPLATE, f"placeholders to fill in ({named[:80]}); with them filled, valid merged into a minimal config"
    notes = [] if not fragment else [f"an excerpt{f' of `{where}`' if where else ''}, valid merged into a minimal config"]
    if stage is not None:
        notes.append(f"valid with ZeRO stage {stage}, which its page sets elsewhere")
    if re.search(r"//|/\*|^\s*#", code, re.M) or re.search(r",\s*[}\]]", code):
        notes.append("remove the comments and trailing commas before using it as a JSON file")
    return CHECKED, "; ".join(notes) or "valid for deepspeed's own config parser"


def check_launcher(code: str) -> tuple[str, str]:
    try:
        lines = launcher_lines(code)
    except ValueError as exc:
        return FAILS, f"cannot split the command line: {exc}"
    filled: list[str] = []
    for words in lines:
        args, complaint, _, notes = parse_filled(words)
        if args is None:
            return FAILS, complaint
        filled += [n.split(" ")[1] for n in notes if n.startswith("placeholder")]
    if not lines:
        return NOT_CHECKED, "no `deepspeed` launcher line (torchrun, srun and mpirun are not DeepSpeed's parser)"
    if filled:
        return TEMPLATE, f"placeholders to fill in ({', '.join(sorted(set(filled))[:3])}); with them filled, deepspeed's launcher parser accepts it"
    return CHECKED, f"{len(lines)} launcher line(s) accepted by deepspeed's parser"


def check_hostfile(code: str) -> tuple[str, str]:
    bad = bad_hostfile_lines(code)
    return (FAILS, f"not 'host slots=N': {bad[0]!r}") if bad else (CHECKED, "every line is 'host slots=N'")


def check_snippet(snippet: Snippet) -> Snippet:
    checkers = {"ds_config": check_ds_config, "python": check_python, "launcher": check_launcher, "hostfile": check_hostfile}
    checker = checkers.get(snippet.kind)
    if snippet.kind == "other" and snippet.language in ("json", "jsonc", "json5", "javascript", "js"):
        kind, status, reason = check_json_excerpt(snippet.code)
        return replace(snippet, kind=kind, status=status, reason=reason, checked_with=deepspeed_version())
    if checker is None:
        status, reason = NOT_CHECKED, _UNCHECKED_KINDS.get(snippet.kind, f"{snippet.kind} snippets have no static check")
    else:
        try:
            status, reason = checker(snippet.code)
        except Exception as exc:  # noqa: BLE001 - one odd snippet must not stop a build
            status, reason = NOT_CHECKED, f"the checker broke on it: {type(exc).__name__}: {exc}"[:300]
    return replace(snippet, status=status, reason=reason, checked_with=deepspeed_version())
