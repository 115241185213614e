"""Known causes of frequent failures: the one reader of `corpus/notes/known-errors.md`.

Each `##` section of that note is one cause: its heading is the title, then lines
`Matches:` (backquoted texts a log shows when it happens, separated by `|`, where `…` stands for any one word; a text followed by
`(follow-up)` only reports that something failed earlier, such as "Error building extension" after a
compiler error: a cause the log shows elsewhere goes before it), `Why:`, `Check:`,
`Fix:` and an optional `Config:` (a ds_config fragment the validator accepts), `Harmless: yes` (a
warning that stops nothing) and `Hangs: yes` (a cause of a job that stops without an error: the doctor's
candidates for a log that only says it hangs). The error doctor (`app/doctor.py`) puts a matching cause before the raising
line it found in the catalogue; a harmless one only when the error itself is that warning.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from indexer.docs_source import note_url
from indexer.markdown import slugify_kramdown

KNOWN_ERRORS_NOTE = "known-errors.md"
KNOWN_ERRORS_URL = note_url(Path(KNOWN_ERRORS_NOTE))  # where a known cause is cited: this, "#" and its title's anchor
_FIELD = re.compile(r"^(Matches|Why|Check|Fix|Config|Harmless|Hangs):\s*(.*)$")
_MATCH = re.compile(r"`([^`]+)`(\s*\(follow-up\))?")


def reader_line(line: str) -> str | None:
    """A line of a known cause's section as a reader of an answer meets it: the why without its label, the check
    and the fix with theirs; "" for the doctor's own fields (`Matches`, `Config`, `Harmless`, `Hangs`); None for a
    line that is no field."""
    m = _FIELD.match(line.strip())
    if m is None:
        return None
    name, value = m.groups()
    return value if name == "Why" else f"{name}: {value}" if name in ("Check", "Fix") else ""


def opens_a_cause(block: str) -> bool:
    """Whether a paragraph holds a known cause's fields (a line of `Matches:` texts; a short section folded into
    the passage before it has its heading on the line above)."""
    return any(line.startswith("Matches: `") for line in block.splitlines())


@dataclass(frozen=True)
class KnownCause:
    title: str
    matches: tuple[str, ...]  # literal texts, compared case-insensitively with the log
    why: str
    check: str
    fix: str
    config: dict[str, Any] | None  # the fix as a ds_config fragment, when it is one
    url: str
    harmless: bool = False  # a warning that stops nothing: not the cause of an error elsewhere in the log
    follow_ups: frozenset[str] = frozenset()  # those of `matches` that only report an earlier failure
    hangs: bool = False  # a cause of a job that stops making progress without an error

    def found_in(self, text: str, *, follow_ups: bool = True) -> str:
        """The longest of its texts that `text` (lower-cased) holds, or ''; without `follow_ups`, of those that are none.
        A text with a hole gives what the log shows there (`--deepspeed: command not found`)."""
        return max((seen for m, low in zip(self.matches, self._lowered, strict=True)
                    if (follow_ups or m not in self.follow_ups) and (seen := _seen(text, m, low))), key=len, default="")

    def texts_in(self, text: str) -> int:
        """How many of its texts `text` (lower-cased) holds."""
        return sum(bool(_seen(text, m, low)) for m, low in zip(self.matches, self._lowered, strict=True))

    @cached_property
    def _lowered(self) -> tuple[str | re.Pattern[str], ...]:  # every question and log is held against all of them
        return tuple(_hole_pattern(m.lower()) if HOLE in m else m.lower() for m in self.matches)


HOLE = "…"  # in a Matches text: one word of the log, any (`--…: command not found`: an option line run as a command)


def _hole_pattern(text: str) -> re.Pattern[str]:
    return re.compile(r"[^\s:'\"]+".join(re.escape(part) for part in text.split(HOLE)))


def _seen(text: str, match: str, low: str | re.Pattern[str]) -> str:
    """`match` as `text` shows it ('' where it does not): itself, or for a text with a hole the log's words there."""
    if isinstance(low, str):
        return match if low in text else ""
    found = low.search(text)
    return found.group(0) if found else ""


def parse_known_causes(markdown: str, base_url: str = KNOWN_ERRORS_URL) -> list[KnownCause]:
    causes: list[KnownCause] = []
    for block in re.split(r"^## ", markdown, flags=re.M)[1:]:
        title, _, body = block.partition("\n")
        fields: dict[str, str] = {}
        for line in body.splitlines():
            m = _FIELD.match(line.strip())
            if m:
                fields[m.group(1)] = m.group(2).strip()
        found = [(t, bool(mark)) for t, mark in _MATCH.findall(fields.get("Matches", "")) if t.strip()]
        matches = tuple(t for t, _ in found)
        if not matches or "Fix" not in fields:
            raise ValueError(f"known cause {title.strip()!r} needs a Matches line with `texts` and a Fix line")
        config = json.loads(fields["Config"]) if fields.get("Config") else None
        harmless, hangs = (_yes_or_no(fields, name, title) for name in ("Harmless", "Hangs"))
        causes.append(KnownCause(title.strip(), matches, fields.get("Why", ""), fields.get("Check", ""), fields["Fix"], config,
                                 f"{base_url}#{slugify_kramdown(title.strip())}", harmless,
                                 frozenset(t for t, follow_up in found if follow_up), hangs))
    return causes


def _yes_or_no(fields: dict[str, str], name: str, title: str) -> bool:
    value = fields.get(name, "no").lower()
    if value not in ("yes", "no"):
        raise ValueError(f"known cause {title.strip()!r}: {name} is yes or no, not {value!r}")
    return value == "yes"


@lru_cache(maxsize=4)
def read_known_causes(notes_dir: Path) -> tuple[KnownCause, ...]:
    """The causes of the notes directory's known-errors note (none when it has no such note)."""
    path = notes_dir / KNOWN_ERRORS_NOTE
    if not path.is_file():
        return ()
    return tuple(parse_known_causes(path.read_text(encoding="utf-8"), KNOWN_ERRORS_URL))
