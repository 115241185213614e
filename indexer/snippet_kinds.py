"""Classify a code block: ds_config, python, launcher, hostfile, shell, yaml, output or other.

Pure: the info-string language is a hint; the code itself decides. Every block gets a kind.
"""

from __future__ import annotations

import ast
import json
import re

from indexer.launcher_line import HOSTFILE_LINE

KINDS = ("ds_config", "python", "launcher", "hostfile", "shell", "yaml", "output", "other")

# Top-level keys that mark a dict as a DeepSpeed config (names from DeepSpeed's config reference).
CONFIG_MARKERS = frozenset(
    {
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "zero_optimization", "fp16", "bf16", "optimizer", "scheduler", "gradient_clipping",
        "amp", "activation_checkpointing", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
        "comms_logger", "autotuning", "aio", "steps_per_print", "wall_clock_breakdown",
        "zero_allow_untested_optimizer", "elasticity", "pipeline", "data_efficiency",
        "compression_training", "communication_data_type", "prescale_gradients", "sparse_attention",
        "checkpoint", "data_types", "monitor_config", "compile", "tensor_parallel", "torch_autocast",
        "stage", "offload_optimizer", "offload_param", "stage3_max_live_parameters",
        "zero_quantized_weights", "zero_hpz_partition_size", "zero_quantized_gradients",
    }
)
_CONFIG_KEY = re.compile(r"[\"']?(" + "|".join(sorted(CONFIG_MARKERS)) + r")[\"']?\s*:")
# a launcher command: the program, then an option, a script, a placeholder, a line continuation or
# nothing ("deepspeed install path ..... [...]" is ds_report output, not a command)
_LAUNCH = re.compile(
    r"^(?:\$\s*)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:deepspeed|torchrun|srun|mpirun|mpiexec|accelerate\s+launch|"
    r"python3?\s+-m\s+torch\.distributed\.(?:launch|run)|ds_ssh|pdsh)(?=\s*$|\s+(?:-|\S+\.(?:py|sh)\b|[<$\[{\\\"']|\.\.\.|…|\w+\s*$))"
)
# `"zero_optimization": {` / `"fp16": {`: a config excerpt without the outer braces
_BARE_CONFIG = re.compile(r"^\s*[\"'](\w+)[\"']\s*[:=]")
_SHELL_START = re.compile(
    r"^(?:\$\s|#\s|pip3?\s|python3?\s|git\s|cd\s|export\s|apt(?:-get)?\s|conda\s|sudo\s|bash\s|sh\s|"
    r"ds_report|ds_bench|ds_nvme_tune|ds_io|ds_elastic|make\s|mkdir\s|ls\s|wget\s|curl\s|docker\s|echo\s|"
    r"nvidia-smi|nvcc|cmake|for\s|if\s|source\s|set\s|\w+=|\./|unset\s|ninja|DS_BUILD|TORCH_)"
)
_OUTPUT_HINT = re.compile(
    r"Traceback \(most recent call last\)|^\[\d{4}-\d\d-\d\d|^\s*\[(?:INFO|WARNING|ERROR)|^-{5,}|"
    r"^\s*(?:INFO|WARNING|ERROR)\b|Error:|^\s*\|.*\|\s*$|^\s*step\s*=|\bsamples/sec\b|"
    r"^\s*(?:rank|Rank)\s*\d|^\s*\d+(?:\.\d+)?\s*(?:TFLOPS|GB|MB|ms)\b|\S[ \t]+\.{6,}[ \t]*\S|\[(?:OKAY|NO|YES)\]",
    re.M,
)
_PY_LANGS = {"python", "py", "python3", "ipython", "pycon"}
_SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh", "shell-session", "shellsession"}
_JSON_LANGS = {"json", "jsonc", "json5", "js", "javascript"}
_YAML_LANGS = {"yaml", "yml"}
_OUTPUT_LANGS = {"text", "txt", "log", "output", "plaintext", "none"}


def _strip_comments(code: str) -> str:
    return "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("#", "//")))


def looks_like_config(code: str) -> bool:
    """A JSON object or Python dict whose keys include DeepSpeed config keys, or an excerpt of one
    without its outer braces (`"fp16": {...}`)."""
    body = _strip_comments(code).strip()
    bare = _BARE_CONFIG.match(body)
    if bare:
        return bare.group(1) in CONFIG_MARKERS or bool(_CONFIG_KEY.search(body))
    if "=" in body.split("{", 1)[0]:  # ds_config = {...}
        body = body.split("=", 1)[1].strip()
    if not body.startswith("{"):
        return False
    return bool(_CONFIG_KEY.search(body))


def _is_pure_dict(code: str) -> bool:
    """True when the Python code is a dict literal, optionally assigned to one name."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    if len(tree.body) != 1:
        return False
    node = tree.body[0]
    value = node.value if isinstance(node, ast.Assign | ast.Expr) else None
    return isinstance(value, ast.Dict)


def _command_lines(code: str) -> list[str]:
    lines: list[str] = []
    for raw in code.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        lines.append(line)
    return lines


def _is_python(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return bool(re.search(r"^\s*(?:import|from|def|class|with|for|if|@)\b|\w\s*=\s*\S|\w\(", code, re.M))


def detect_language(code: str) -> str:
    if looks_like_config(code):
        try:
            json.loads(code)
            return "json"
        except ValueError:
            return "python" if _is_pure_dict(code) else "json"
    lines = _command_lines(code)
    if lines and (_LAUNCH.match(lines[0]) or _SHELL_START.match(lines[0])):
        return "bash"
    if _is_python(code):
        return "python"
    return "text"


def classify_snippet(code: str, language: str = "") -> tuple[str, str]:
    """Return (kind, language) for a code block; language falls back to detection."""
    lang = (language or "").lower().strip()
    if code.lstrip().startswith(">>>"):  # a Python session, whatever the fence says
        return "python", "pycon"
    if not lang or lang in _OUTPUT_LANGS:
        detected = detect_language(code)
        lang = detected if (not lang or detected != "text") else lang
    lines = _command_lines(code)
    if lines and all(HOSTFILE_LINE.match(line) for line in lines):
        return "hostfile", lang
    if looks_like_config(code) and (lang in _JSON_LANGS | _PY_LANGS | {"text", ""} or _is_pure_dict(code)):
        if lang in _PY_LANGS and not _is_pure_dict(code) and not code.lstrip().startswith("{"):
            return "python", lang
        return "ds_config", lang
    if lang in _PY_LANGS and not any(_LAUNCH.match(line) for line in lines[:1]):
        if lang == "pycon" or code.lstrip().startswith(">>>"):
            return "python", lang
        return ("python", lang) if _is_python(code) or not _OUTPUT_HINT.search(code) else ("output", lang)
    if lines and any(_LAUNCH.match(line) for line in lines):
        return "launcher", lang or "bash"
    if lang in _SHELL_LANGS or (lines and _SHELL_START.match(lines[0])):
        return "shell", lang or "bash"
    if lang in _YAML_LANGS:
        return "yaml", lang
    if lang in _JSON_LANGS:
        return "other", lang
    if lang in _OUTPUT_LANGS or _OUTPUT_HINT.search(code):
        return "output", lang or "text"
    return "other", lang or "text"
