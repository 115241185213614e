"""Answer shapes by question type: what a reply puts around the quoted sentences.

The kind of a question decides what comes with the composed units (`app/answer.py`):
- `version` ("was X removed", "is X deprecated", "since which version"): the installed deepspeed's own
  word on the keys named (removed, with DeepSpeed's message; deprecated, with the replacement) first;
- `compare` ("X vs Y", "difference between"): both sides quoted: when the units name only one of the
  options or identifiers the question weighs, the best unit naming the other joins;
- `config` (names a key, or asks which setting): the keys' type and default lead the answer; a question asking
  only what keys are opens with their catalogue descriptions (`key_line`), one asking only what an API
  symbol is with its docstring's first sentence (`api_summary`), one asking what it returns with its
  docstring's Returns section (`returns_line`);
- `howto`: the best snippet of the first passages, by id and with what was done to it; a question asking
  only how to set config keys gets where they go in the config (`setting_line`);
- `error` (a traceback or an error message): where the whole log is matched against what deepspeed raises;
- `other`: the units alone.
Pure functions: `app/ask.py` calls them with what it has already computed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from app.answer import OPTION_FAMILIES, Candidate, Source, options_named, restated
from app.query import identifiers
from app.schemas import SnippetOut
from indexer.snippet_status import CHECKED, RAN, SHOW_ORDER
from indexer.text_units import markdown_literals

KINDS = ("error", "version", "compare", "config", "howto", "other")

# a pasted message without an exception class counts too: argparse's and a shell's ("train.py: error: argument
# --deepspeed: invalid dict value", "-bash: deepspeed: command not found")
_ERROR = re.compile(r"Traceback \(most recent call last\)|\b[A-Z]\w*(?:Error|Exception)\b|\bassert(?:ion)?\b.{0,40}\bfail|报错|异常"
                    r"|(?<![\w-])error: |: command not found")
_VERSION = re.compile(
    r"\b(?:removed|deprecated|no longer|still (?:supported|exists?|works?|available|there)|which (?:deepspeed )?(?:version|release)"
    r"|what (?:deepspeed )?(?:version|release)|since (?:which|what|version)|in (?:which|what) (?:version|release))\b"
    r"|被移除|移除了|删除了|废弃|弃用|哪个版本|哪一版|还支持",
    re.I,
)
_COMPARE = re.compile(r"\b(?:vs\.?|versus|difference between|differences between|compared? (?:to|with)|or should i use)\b|区别|对比|相比|还是", re.I)
_WHICH_KNOB = re.compile(r"\b(?:which|what) (?:config )?(?:setting|option|key|flag|parameter|knob)s?\b|哪个参数|哪个配置|什么参数", re.I)
_HOWTO = re.compile(r"\bhow (?:do|can|should|to|would|does one)\b|\bwhat(?:'s| is) the (?:right )?way\b|怎么|如何|怎样", re.I)


def question_kind(question: str, keys: list[str]) -> str:
    """One of KINDS: an error first (its message decides), then version, compare, config, how-to."""
    if _ERROR.search(question):
        return "error"
    if _VERSION.search(question):
        return "version"
    if _COMPARE.search(question):
        return "compare"
    if keys or _WHICH_KNOB.search(question):
        return "config"
    if _HOWTO.search(question):
        return "howto"
    return "other"


def status_line(question: str, keys: list[str], status: dict[str, str], body: str = "") -> str:
    """'`elasticity`: removed in deepspeed 0.19.8: ...' for the keys the question names (whole, or a
    top-level block named as a word) that are deprecated or removed, unless `body` says it already."""
    low = question.lower()
    named = [k for k in keys if k in status]
    named += [k for k in status if k not in named and re.search(rf"(?<![\w.]){re.escape(k.rsplit('.', 1)[-1].lower())}(?![\w])", low)]
    named = [k for k in named if status[k].split(": ", 1)[-1].rstrip(".") not in body]
    if not named:
        return ""
    return " ".join(f"`{k}`: {status[k]}" + ("" if status[k].endswith(".") else ".") for k in named[:2])


def sides(question: str) -> list[Callable[[str], bool]]:
    """What a comparison weighs: two or more options of one family (fp16 / bf16, stage 2 / 3, CPU /
    NVMe), else two or more identifiers; as tests of a unit's text. Empty when it names fewer."""
    for family, asked in zip(OPTION_FAMILIES, options_named(question), strict=True):
        if len(asked) >= 2:
            return [_matches(family[name]) for name in sorted(asked)]
    names = sorted(identifiers(question))
    return [_contains(name) for name in names[:3]] if len(names) >= 2 else []


def _matches(pattern: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda text: bool(pattern.search(text))


def _contains(name: str) -> Callable[[str], bool]:
    low = name.lower()
    return lambda text: low in text.lower()


def missing_sides(answer: str, cands: list[Candidate], scores: np.ndarray, tests: list[Callable[[str], bool]]) -> list[Candidate]:
    """For each side the answer does not name, the best-scored unit that does (none when no unit does)."""
    extra: list[Candidate] = []
    order = np.argsort(-scores, kind="stable")
    for test in tests:
        if test(answer) or any(test(c.unit.text) for c in extra):
            continue
        best = next((cands[int(i)] for i in order if test(cands[int(i)].unit.text) and cands[int(i)].unit.text not in answer), None)
        if best is not None:
            extra.append(best)
    return extra


def key_line(keys: list[str], docs: dict[str, str], limit: int = 2, sources: list[Source] | None = None) -> str:
    """'`a.b`: what it does.' for the first keys the catalogue describes ('' for none); with `sources`, each
    cited with the first of them that says it ("... [2]")."""
    said = []
    for k in [k for k in keys if docs.get(k)][:limit]:
        text = f"`{k}`: {docs[k].rstrip()}"
        text = text if text.endswith((".", "!", "?", ")")) else text + "."
        n = next((s.n for s in sources or () if restated(docs[k], s.text)), None)
        said.append(f"{text} [{n}]" if n else text)
    return " ".join(said)


def api_summary(source: Source) -> str:
    """'`deepspeed.zero.TiledLinear`: A replacement for `torch.nn.Linear` that ...' from an API page's passage: its
    symbol (the heading) and the first sentence of its docstring (the passage's first unit that is no argument's
    line); '' when it has none."""
    first = next((u.text for u in source.units or () if not u.text.startswith("`")), "")
    return f"`{source.heading}`: {first}" if first else ""


_RETURNS_HEAD = re.compile(r"^\s*(?:Returns?|Return type)\s*:\s*(?P<rest>.*)$")
_ITEM = re.compile(r"^\s*[*-]\s*")
_SIGNATURE_RETURN = re.compile(r"Signature: `[^`]*\)\s*->\s*(?P<type>[^`]+)`")
RETURNS_WORDS = 70  # the Returns section's words a reply quotes, whole items only


def returns_line(symbol: str, text: str) -> str:
    """'`deepspeed.initialize` returns: A tuple of `engine`, ...; `engine`: DeepSpeed runtime engine ...' from the
    Returns section of the symbol's docstring (`text`: its API section, its chunks joined), with the items listed
    right after it; else its signature's return annotation; '' for neither, and for a class (its constructor's
    annotation says `None`)."""
    if symbol.rsplit(".", 1)[-1][:1].isupper():
        return ""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _RETURNS_HEAD.match(line)), None)
    items: list[str] = []
    if start is not None:
        first = _RETURNS_HEAD.match(lines[start])
        items = [first.group("rest").strip()] if first and first.group("rest").strip() else []
        for n, line in enumerate(lines[start + 1:], start + 1):
            if not line.strip():  # a blank line ends the section, unless the items of what it returns follow
                if not _ITEM.match(next((later for later in lines[n + 1:] if later.strip()), "")):
                    break
            elif _ITEM.match(line):
                items.append(_ITEM.sub("", line).strip())
            elif line[:1].isspace() or not items:  # the section's own lines and an item's wrapped ones
                items[-1:] = [f"{items[-1]} {line.strip()}" if items else line.strip()]
            else:
                break
    said: list[str] = []
    words = 0
    for item in (markdown_literals(" ".join(i.split())) for i in items if i):
        if said and words + len(item.split()) > RETURNS_WORDS:
            break
        said.append(item if item.endswith((".", "!", "?")) else f"{item}.")
        words += len(item.split())
    if said:
        return f"`{symbol}` returns: {' '.join(said)}"
    annotated = _SIGNATURE_RETURN.search(text)
    return f"`{symbol}` returns `{annotated.group('type').strip()}` (its signature's annotation)." if annotated else ""


def snippet_line(snippets: list[SnippetOut], first: set[str]) -> str:
    """The best snippet of the first passages (`first`: their snippet ids), when one ran or was checked."""
    usable = [s for s in snippets if s.id in first and s.status in (RAN, CHECKED)]
    if not usable:
        return ""
    best = min(usable, key=lambda s: SHOW_ORDER.get(s.status, 3))
    return f"Example: snippet `{best.id}` ({best.label}; below)."


# where the whole log goes (the error doctor); 8 words, not 20: the words it frees hold a gold phrase
# for 2 more of tune's 374 answers
ERROR_LINE = "Whole log: `dsqa doctor` (POST /diagnose, MCP `diagnose_error`)."


# asking how to set a key ("How do I set overlap_comm?", "怎么开启 overlap_comm"), not only what it is
_SETTING = re.compile(r"\bhow (?:do|can|should|would) (?:i|we|you|one) (?:set|enable|turn on|configure|use|change|specify|pass)\b"
                      r"|\bhow to (?:set|enable|turn on|configure|use|change|specify|pass)\b|\bwhere (?:do|does|should) .{1,40}\bgo\b"
                      r"|怎么设|如何设|怎样设|怎么配|如何配|怎么开|如何开|怎么用|如何使用|怎么启用|如何启用|设置|开启|启用", re.I)


_ON = re.compile(r"\b(?:enable|turn on|switch on|activate)\b|开启|启用|打开", re.I)
_OFF = re.compile(r"\b(?:disable|turn off|switch off|deactivate)\b|关闭|禁用|关掉", re.I)


def example_value(type_name: str, default: str, question: str = "") -> Any:
    """A value to show for a key in its config: for a boolean what the question asks for (enable: true,
    disable: false), else the opposite of its default (what setting it does); the default of a number or a
    string; None when the catalogue gives none to show (a dict, None)."""
    kind = type_name.split("|")[0].strip()
    if kind == "bool":
        on, off = bool(_ON.search(question)), bool(_OFF.search(question))
        return on if on != off else default.strip() not in ("True", "true")
    if kind in ("int", "float"):
        try:
            number = float(default.replace(",", "").replace("_", ""))
        except ValueError:
            return None
        return int(number) if kind == "int" and number.is_integer() else number
    if kind == "str" and len(default) >= 2 and default[0] == default[-1] and default[0] in "'\"":
        return default[1:-1]
    return None


def config_fragment(keys: list[str], facts: dict[str, tuple[str, str]], question: str = "") -> dict[str, Any]:
    """The keys nested where the config reads them, each with its `example_value` (keys without one left out)."""
    fragment: dict[str, Any] = {}
    for key in keys:
        value = example_value(*facts.get(key, ("", "")), question)
        if value is None:
            continue
        *sections, last = key.split(".")
        node = fragment
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                break
        else:
            node[last] = value
    return fragment


def asks_to_set(question: str) -> bool:
    """Whether a question asks how to set something ("How do I configure ...", "怎么开启 ...")."""
    return bool(_SETTING.search(question))


def setting_line(question: str, keys: list[str], facts: dict[str, tuple[str, str]]) -> str:
    """'In the DeepSpeed config: `{"zero_optimization": {"overlap_comm": true}}`' for a question asking how to
    set config keys ('' for any other, or keys with nothing to show)."""
    sited = [k for k in keys if any(s.lower() in question.lower() for s in k.split(".")[:-1])]
    keys = (sited or keys)[:2]  # "pin_memory for offload_optimizer": not offload_param's
    fragment = config_fragment(keys, facts, question) if asks_to_set(question) else {}
    if not fragment:
        return ""
    plain = [k for k in keys if example_value(*facts.get(k, ("", ""))) is not None and not facts[k][0].startswith("bool")]
    note = f" ({'its' if len(plain) == 1 else 'their'} default{'s' if len(plain) > 1 else ''} shown)" if plain else ""
    return f"In the DeepSpeed config{note}: `{json.dumps(fragment)}`."
