"""The config keys of an answer: which keys a text names (`keys_named`, by a dotted ending or a snake_case
name the catalogue has), the `Config:` line of their types and defaults (`config_line`), and which key's
entry each quotable unit belongs to (`owners`), so that a question asking only what a key is quotes
nothing about other keys (`about_other_keys`). Pure functions over the engine's config facts."""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

from app.answer import Candidate

CONFIG_KEYS = 3  # config keys named after an answer, with type and default
_DOTTED = re.compile(r"\b[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+\b")
_SNAKE = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")


_ENDINGS: dict[int, tuple[dict[str, tuple[str, str]], dict[str, list[str]]]] = {}


def _endings(facts: dict[str, tuple[str, str]]) -> dict[str, list[str]]:
    """Each dotted ending of a key ("c", "b.c", "a.b.c" of "a.b.c") -> the keys ending with it, in the table's
    order; built once per facts table (the engine keeps one)."""
    cached = _ENDINGS.get(id(facts))
    if cached is None or cached[0] is not facts:
        by_ending: dict[str, list[str]] = {}
        for path in facts:
            parts = path.split(".")
            for i in range(len(parts)):
                by_ending.setdefault(".".join(parts[i:]), []).append(path)
        cached = _ENDINGS[id(facts)] = (facts, by_ending)
    return cached[1]


def keys_named(text: str, facts: dict[str, tuple[str, str]]) -> list[str]:
    """Config keys a text names: a dotted path (whole, or the unique key it ends), or a distinctive
    leaf name (one with an underscore that at most two keys end with), in order of appearance;
    sections (dict or config-model types) left out."""
    endings = _endings(facts)
    found: list[tuple[int, str]] = []
    spans: list[tuple[int, int]] = []
    for m in _DOTTED.finditer(text):
        name = m.group(0)
        paths = [name] if name in facts else endings.get(name, [])
        if len(paths) == 1:
            found.append((m.start(), paths[0]))
            spans.append(m.span())
    for m in _SNAKE.finditer(text):
        paths = endings.get(m.group(0), [])
        if 0 < len(paths) <= 2 and not any(a <= m.start() < b for a, b in spans):
            found += [(m.start(), p) for p in sorted(paths, key=len)]
    keys: list[str] = []
    for _, path in sorted(found):
        kind = facts[path][0]
        if path not in keys and kind != "dict" and "Config" not in kind:
            keys.append(path)
    return keys


def _states_default(key: str, answer: str) -> bool:
    """The answer quotes the key's catalogue entry ("`a.b` (int, default 0)") or a row that gives its
    default ("`a.b`: what it does (default `0`)")."""
    return f"`{key}` (" in answer or re.search(rf"`{re.escape(key)}`: [^\[\n]*\(default ", answer) is not None


def _section_named(key: str, words: frozenset[str]) -> bool:
    """A nested key's sections are named by the question or the answer ("offload" for
    `zero_optimization.offload_optimizer.pin_memory`): a bare leaf alone is often another thing's name,
    as init_inference's `mp_size` is not `autotuning.mp_size`."""
    sections = key.split(".")[:-1]
    return not sections or any(w in words for s in sections for w in s.split("_"))


def config_line(question: str, answer: str, facts: dict[str, tuple[str, str]], limit: int = CONFIG_KEYS,
                sure: Iterable[str] = ()) -> str:
    """'Config: `a.b` (int, default 0); ...' for the keys the question names, then those the answer
    quotes; '' when there are none. `sure`: keys known to be the asked ones (a question asking only what
    they are), shown whether or not their sections are named."""
    asked = keys_named(question, facts)  # always first: the line a reader of a key question looks for
    # then the answer's keys, but not those whose catalogue entry or table row, default and all, it quotes already
    keys = asked + [k for k in keys_named(answer, facts) if k not in asked and not _states_default(k, answer)]
    words = frozenset(re.findall(r"[a-z0-9]+", f"{question} {answer}".lower().replace("_", " ")))
    keys = [k for k in keys if k in sure or _section_named(k, words)]
    if not keys:
        return ""
    return "Config: " + "; ".join(f"`{k}` ({_type_and_default(*facts[k])})" for k in keys[:limit]) + "."


def _type_and_default(type_name: str, default: str) -> str:
    """"int, default 0"; a key whose type the catalogue could not tell ("any": DeepSpeed reads it with a default
    of None and no annotation) is given its default alone."""
    return f"default {default}" if type_name == "any" else f"{type_name}, default {default}"


_OWNER = re.compile(r"^`(?P<key>[A-Za-z_][\w.]*)`(?::| \()")


def owners(cands: list[Candidate]) -> list[str | None]:
    """The config key each unit belongs to: the key a catalogue entry or key row opens with ("`a.b` (int,
    default 0): ...", "`a.b`: ..."), and the units after it in the same block of the same passage (the entry's
    later sentences); None for the others."""
    out: list[str | None] = []
    owner: str | None = None
    for i, c in enumerate(cands):
        before = cands[i - 1] if i else None
        if before is None or before.source.n != c.source.n or before.unit.block != c.unit.block:
            owner = None
        m = _OWNER.match(c.unit.text)
        owner = m.group("key") if m else owner
        out.append(owner)
    return out


def about_other_keys(cands: list[Candidate], keys: list[str], by_passage: bool = False) -> np.ndarray:
    """Which units are not about `keys` (a question asking only what they are): a unit is about them when it
    names one, is one's entry or row (or a later sentence of it), or stands in a paragraph that names one and
    belongs to no other key. Left out: another key's entry (`tensor_parallel.tp_overlap_comm`'s for "What
    does overlap_comm do?") and prose about something else (a passage naming the key in its code only).
    `by_passage` (a question asking how to set them): any unit of a passage that names one, in its code too
    ("Set the stage in the config:" above a JSON block holding the key), but no other key's entry."""
    asked = {k.rsplit(".", 1)[-1] for k in keys}
    if not asked:
        return np.zeros(len(cands), dtype=bool)
    named = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(a) for a in sorted(asked)) + r")\b")
    names = [bool(named.search(c.unit.text)) for c in cands]
    blocks = {(c.source.n, c.unit.block) for c, said in zip(cands, names, strict=True) if said}
    if by_passage:  # each passage's text searched once, not once per unit of it
        naming = {n for n, text in {c.source.n: c.source.text for c in cands}.items() if named.search(text)}
        blocks |= {(c.source.n, c.unit.block) for c in cands if c.source.n in naming}
    out = []
    for c, said, owner in zip(cands, names, owners(cands), strict=True):
        mine = owner is not None and owner.rsplit(".", 1)[-1] in asked
        out.append(not (said or mine or (owner is None and (c.source.n, c.unit.block) in blocks)))
    return np.array(out, dtype=bool)
