"""The `deepspeed` launcher line and the hostfile: the one place that splits a launcher command,
parses it with DeepSpeed's own launcher parser, fills its placeholders, and reads `host slots=N`.
Used by the kind classifier, the static check and the runner's program builder."""

from __future__ import annotations

import re
import shlex
from functools import lru_cache
from typing import Any

from indexer.quiet import captured

HOSTFILE_LINE = re.compile(r"^\s*([\w.\-]+)\s+slots\s*=\s*(\d+)\s*$")
# <num_gpus>, $NNODES, ${N}, [mvapich|openmpi], and elided arguments
PLACEHOLDER = re.compile(r"<[A-Za-z_][^<>]*>|\$\{?[A-Za-z_]\w*\}?|\[[\w\-]+(?:\|[\w\-]+)+\]|\.\.\.|…")
CHOICE = re.compile(r"(\"?)\[(\w[\w\-]*)(?:\|[\w\-]+)+\]\1")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_NUMERIC_FLAGS = {"--num_gpus", "--num_nodes", "--master_port", "--node_rank", "--num_accelerators"}


def hostfile_hosts(code: str) -> list[tuple[str, int]]:
    """The (host, slots) of each `host slots=N` line."""
    return [(m.group(1), int(m.group(2))) for m in map(HOSTFILE_LINE.match, code.splitlines()) if m]


def names_hostfile(words: list[str]) -> bool:
    """Whether a launcher line's words pass a hostfile (`--hostfile F`, `--hostfile=F`, `-H F`)."""
    return any(w.startswith(("-H", "--hostfile")) for w in words[1:])


def bad_hostfile_lines(code: str) -> list[str]:
    return [line for line in code.splitlines() if line.strip() and not line.strip().startswith("#") and not HOSTFILE_LINE.match(line)]


def command_words(line: str) -> list[str]:
    """One shell line as words, a `$ ` prompt and leading VAR=value assignments dropped; raises
    ValueError when the quoting does not close."""
    words = shlex.split(line.strip().removeprefix("$ "), comments=True)
    while words and _ENV_ASSIGNMENT.match(words[0]):
        words.pop(0)
    return words


def include_slots(include: str | None) -> int:
    """How many GPU slots an `--include` value names (`localhost:0,1` -> 2, `a:0,1@b:2` -> 3; 0 when it
    names none)."""
    if not include:
        return 0
    return sum(len(part.split(":", 1)[1].split(",")) for part in include.split("@") if ":" in part)


def launcher_lines(code: str) -> list[list[str]]:
    """Each `deepspeed ...` command of a snippet as words (continuation lines joined); a line whose
    quoting does not close raises ValueError."""
    out = []
    for raw in code.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = command_words(line)
        if words and words[0] == "deepspeed":
            out.append(words)
    return out


@lru_cache(maxsize=1)
def _launcher_parser() -> Any:
    from deepspeed.launcher.runner import parse_args

    return parse_args


def parse_launcher(words: list[str]) -> tuple[Any | None, str]:
    """DeepSpeed's own launcher parser on `deepspeed ...` words: (args, '') or (None, its complaint)."""
    with captured(stderr=True) as (_, err):
        try:
            return _launcher_parser()(words[1:]), ""
        except SystemExit:
            pass
    lines = err.getvalue().strip().splitlines()
    return None, (lines[-1] if lines else "rejected by deepspeed's launcher parser")[:300]


def fill_placeholders(words: list[str]) -> tuple[list[str], list[str]]:
    """A launcher line's placeholders filled so it can run: a choice takes its first option, a count
    flag 1, a script our tiny training script, a range or list (of cores) 0, anything else the word `x`; elided arguments are
    dropped. Each filling is named (a run says what was done)."""
    out: list[str] = []
    notes: list[str] = []
    for i, word in enumerate(words):
        if not PLACEHOLDER.search(word):
            out.append(word)
            continue
        if word in ("...", "…"):
            notes.append(f"placeholder {word} dropped")
            continue
        picked = CHOICE.sub(lambda m: m.group(2), word)
        if picked != word and not PLACEHOLDER.search(picked):
            out.append(picked)
            notes.append(f"placeholder {word} filled with {picked}")
            continue
        flag = out[-1] if out else ""
        if word.startswith("-") and "=" in word:  # --hostfile=<hostfile>: the flag's own value
            flag = word.split("=", 1)[0]
        value = "1" if flag in _NUMERIC_FLAGS or re.search(r"num|gpus|nodes|port|rank|size", word, re.I) else "x"
        if value == "x" and re.search(r"range|core|list", f"{flag} {word}", re.I):  # --bind_core_list <comma-separated-dash-range>
            value = "0"  # the first core (device) alone: a range of one
        if value == "x" and (word.endswith(".py>") or "script" in word.lower() or (
                i > 0 and not flag.startswith("-") and not word.startswith("-") and ".py" not in " ".join(out))):
            value = "train.py"
        out.append(PLACEHOLDER.sub(value, word))
        notes.append(f"placeholder {word} filled with {value}")
    return out, notes


def parse_filled(words: list[str]) -> tuple[Any | None, str, list[str], list[str]]:
    """Fill the placeholders, then parse: (args, complaint, the words run, what was filled). An
    elided `...` that stood where the script goes gives way to our tiny script."""
    filled, notes = fill_placeholders(words)
    args, complaint = parse_launcher(filled)
    if args is None and any(n.endswith(" dropped") for n in notes):
        retry = [*filled, "train.py"]
        args, again = parse_launcher(retry)
        if args is not None:
            return args, "", retry, [*notes, "the elided script run as train.py"]
    return args, complaint, filled, notes
