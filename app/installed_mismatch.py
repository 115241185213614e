"""What the installed deepspeed lacks or rejects among what a question names, each told in one line of the
answer: settings nothing indexed names (`unknown_line`, with the catalogue key one nearly spells), keyword
arguments a function does not take (`unaccepted_line`), and cited examples the installed release no longer
runs (`version_notes`). Pure functions over what the search and the index found."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from app.retriever import Hit
from indexer.documents import Snippet


def unknown_line(names: tuple[str, ...], keys: Iterable[str] = (), limit: int = 3) -> str:
    """'`stage3_prefetch_strategy` appears nowhere ...' for the settings a refused question writes out
    that nothing indexed names ('' for none): the likeliest reason it is not covered; with the config
    catalogue's `keys`, the key one of them nearly spells ("did you mean `zero_optimization.overlap_comm`?")."""
    if not names:
        return ""
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    verb = "appears" if len(names) == 1 else "appear"
    meant = [m for n in names[:limit] if (m := nearly_spelled(n, keys))]
    hint = f"; did you mean {' or '.join(f'`{m}`' for m in dict.fromkeys(meant))}?" if meant else ""
    return (f"{shown} {verb} nowhere in the DeepSpeed docs, config catalogue or notes indexed here "
            f"(deepspeed's own config, launcher and API do not seem to have {'it' if len(names) == 1 else 'them'}{hint}).\n\n")


def nearly_spelled(name: str, keys: Iterable[str]) -> str:
    """The catalogue key a misspelt setting comes closest to (its last part or its whole dotted name, difflib's
    ratio at least SPELLING_RATIO: `overlap_comms`, `stage3_gather_fp16_weights_on_model_save`), else ''."""
    by_part: dict[str, str] = {}
    for key in keys:
        by_part.setdefault(key.rsplit(".", 1)[-1], key)
        by_part.setdefault(key, key)
    close = difflib.get_close_matches(name.lstrip("-"), list(by_part), n=1, cutoff=SPELLING_RATIO)
    return by_part[close[0]] if close else ""


SPELLING_RATIO = 0.85


def unaccepted_line(arguments: tuple[tuple[str, str], ...], version: str, limit: int = 2) -> str:
    """'`deepspeed.initialize` takes no keyword argument `seed` in deepspeed 0.19.8.' for the (function,
    keyword) pairs a question passes that the installed function does not take ('' for none)."""
    if not arguments:
        return ""
    where = f" in deepspeed {version}" if version else " in the installed deepspeed"
    said = [f"`{function}` takes no keyword argument `{keyword}`{where}." for function, keyword in arguments[:limit]]
    return " ".join(said) + "\n\n"


_POINTER = re.compile(r"^/[\w/]*:\s*")
_NAMED = re.compile(r"'([A-Za-z_][\w.]*)'|\b([a-z]+(?:_[a-z0-9]+)+)\b|\b(deepspeed(?:\.\w+)+)")
_CHOICES = re.compile(r"\[[^\]]*\]")  # "one of [...]": the valid choices, not what failed


def _squash(text: str) -> str:
    """Letters and digits only, with "one" and "zero" as digits: 'OneBitAdam' is the "1-bit Adam" a question
    names, 'ZeroOneAdam' its "0/1 Adam"."""
    return re.sub(r"[^a-z0-9]", "", text.lower()).replace("one", "1").replace("zero", "0")


def version_notes(stale: dict[str, Snippet], hits: list[Hit], answer: str, question: str) -> str:
    """Warn when a passage the answer cites shows code the installed deepspeed rejects, and only when
    the question names what that code fails on (a key, an optimizer, a module; not the valid choices a
    reason lists in brackets). Pages failing for the same reason share one note."""
    cited = {int(n) for n in re.findall(r"\[(\d+)\]", answer)}
    asked = _squash(question)
    reasons: dict[str, list[int]] = {}
    version = ""
    seen: set[str] = set()
    for n, hit in enumerate(hits, 1):
        bad = stale.get(hit.chunk.path)
        if bad is None or n not in cited or hit.chunk.path in seen:
            continue
        reason = _POINTER.sub("", bad.reason).strip()
        reason = reason if reason.endswith((".", "!", "?")) else reason + "."
        failing = _CHOICES.sub("", bad.reason)
        named = [part for m in _NAMED.finditer(failing) for part in m.groups() if part]
        keys = {_squash(n) for n in named} | {_squash(n.split(".")[-1]) for n in named}
        if not any(key and key in asked for key in keys):
            continue
        seen.add(hit.chunk.path)
        reasons.setdefault(reason, []).append(n)
        version = bad.checked_with
    notes = [f"Heads-up: {'an example' if len(ns) == 1 else 'examples'} on {'that page' if len(ns) == 1 else 'those pages'} no longer "
             f"work{'s' if len(ns) == 1 else ''} with the installed deepspeed {version}. {reason} " + "".join(f"[{n}]" for n in ns)
             for reason, ns in reasons.items()]
    return ("\n\n" + "\n".join(notes)) if notes else ""
