"""Matching an error message against the error catalogue (`indexer/error_catalogue.py`): the catalogue
read once per index (or built from the installed deepspeed), its patterns compiled once; exact patterns
(the longest fixed text first), a message cut after its first sentences, the nearest messages by their
words, and the lines a traceback cut off inside deepspeed points at.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from indexer.config_catalogue import deepspeed_version
from indexer.error_catalogue import ERRORS_FILE, RaisedError, build_error_catalogue, read_error_catalogue


def catalogue_for(index_dir: Path | None) -> tuple[str, tuple[RaisedError, ...]]:
    """The version and entries of the index's error catalogue when it has one, else the installed deepspeed's."""
    return _catalogue(_catalogue_key(index_dir))


@lru_cache(maxsize=4)
def _catalogue(index_dir: str | None) -> tuple[str, tuple[RaisedError, ...]]:
    """The deepspeed version the catalogue was read from (its lines' URLs point at that tag) and its entries:
    the index's `errors.jsonl`, whose first line names the version (asking deepspeed instead imports it and
    torch, which took a server's first pasted error about 3 s), else the installed deepspeed's, built now."""
    if index_dir is not None:
        head, entries = read_error_catalogue(Path(index_dir) / ERRORS_FILE)
        return str(head.get("deepspeed") or "") or deepspeed_version(), tuple(entries)
    return deepspeed_version(), tuple(build_error_catalogue())


def _catalogue_key(index_dir: Path | None) -> str | None:
    """`_catalogue`'s cache key: the index folder when it holds an error catalogue, else None (the
    installed deepspeed's)."""
    return str(index_dir) if index_dir is not None and (Path(index_dir) / ERRORS_FILE).is_file() else None


def warm_catalogue(index_dir: Path | None) -> None:
    """Read and compile the index's error catalogue now (about 2 s on 2 cores), as a diagnosis will: a
    server's first pasted error does not wait for it."""
    _compiled(catalogue_for(index_dir)[1])


@lru_cache(maxsize=4)
def _compiled(catalogue: tuple[RaisedError, ...]) -> tuple[tuple[RaisedError, str, re.Pattern[str]], ...]:
    """Each pattern compiled once, with its longest fixed fragment: a cheap `in` test first, so a
    long message is scanned by the few regexes whose fixed text it holds."""
    return tuple((e, max(_fixed_parts(e.template), key=len), re.compile(e.pattern)) for e in catalogue if e.pattern)


def _fixed_parts(template: str) -> list[str]:
    """A message template's fixed texts between its holes, whitespace-flattened as the messages matched are."""
    return [" ".join(t.split()) for t in template.split("{}")]


WEAK_EXACT = 0.4  # an exact match whose fixed text is less of the message than this gives way to a close longer one; chosen on the tune logs


def fixed_chars(entry: RaisedError) -> int:
    """How much of a catalogue message is fixed text (its holes left out)."""
    return len(entry.template.replace("{}", ""))


# a message that goes on to the left of where a line's fixed text starts, within its sentence, is another
# message that holds those words: Python's own "tuple index out of range" is not deepspeed's "index out of
# range", nor "partially initialized module 'x' has no attribute 'y'" its "module {} has no attribute {}"
_WORDS_BEFORE = re.compile(r"[A-Za-z]\s+$")


def _ends_a_longer_sentence(message: str, found: re.Match[str] | None) -> bool:
    """A line's pattern was found in the message, but as the end of a longer sentence (`_WORDS_BEFORE`)."""
    return found is not None and _WORDS_BEFORE.search(message, 0, found.start()) is not None


def exact_matches(message: str, catalogue: tuple[RaisedError, ...]) -> list[RaisedError]:
    """The entries whose pattern the (whitespace-flattened) message matches, the longest fixed text first;
    when that is a short generic pattern ("{} does not match {}"), a close longer message reworded across
    versions (`nearest`) goes before it."""
    exact = [e for e, fragment, pattern in _compiled(catalogue)
             if fragment in message and (found := pattern.search(message)) and not _ends_a_longer_sentence(message, found)]
    exact.sort(key=lambda e: -fixed_chars(e))
    if exact and fixed_chars(exact[0]) < WEAK_EXACT * len(message):
        longer = [e for _, e in nearest(message, catalogue) if e not in exact[:1]]
        exact = longer[:1] + exact
    return exact


# a sentence's end inside a message: where a pasted message is often cut ("The parameter 12 has already been reduced.")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
LEADING_WORDS = 4  # words of fixed text the first sentences need to stand for their message
_HOLE = r"\s*(.+?)\s*"
_CLOSING_HOLE = r"\s*(\S+?)"  # a hole that ends the first sentences takes one word, not the sentences after it


@lru_cache(maxsize=4)
def _leading(catalogue: tuple[RaisedError, ...]) -> tuple[tuple[RaisedError, str, re.Pattern[str]], ...]:
    """The first sentences of each message that has several, as whole-message patterns, each with its
    longest fixed fragment (the cheap `in` test first, as for the exact patterns)."""
    out = []
    for e in catalogue:
        sentences = _SENTENCE_END.split(e.template) if e.pattern else []
        for k in range(1, len(sentences)):
            head = " ".join(sentences[:k]).rstrip(".!? ")
            if len(_WORD.findall(head.replace("{}", " ").lower())) >= LEADING_WORDS:
                fixed = _fixed_parts(head)
                texts = [re.escape(t).replace(r"\ ", r"\s+") for t in fixed]
                body = _HOLE.join(texts[:-1]) + _CLOSING_HOLE if not texts[-1] else _HOLE.join(texts)
                out.append((e, max(fixed, key=len), re.compile(body + r"[.!?]?")))
    return tuple(out)


def leading_matches(message: str, catalogue: tuple[RaisedError, ...]) -> list[RaisedError]:
    """Catalogue messages the message is the first sentences of, word for word: a message pasted without
    the sentences after its first (its words are a small share of the whole, so `nearest` would pass
    it by for a shorter message that shares most of them)."""
    found: list[RaisedError] = []
    text = message.strip()
    for e, fragment, pattern in _leading(catalogue):
        if e not in found and fragment in text and pattern.fullmatch(text) and (not e.classes or any(c in message for c in e.classes)):
            found.append(e)
    return found


_WORD = re.compile(r"[a-z][a-z0-9_]{2,}")


@lru_cache(maxsize=4)
def _word_sets(catalogue: tuple[RaisedError, ...]) -> tuple[frozenset[str], ...]:
    return tuple(frozenset(_WORD.findall(e.template.lower())) for e in catalogue)


def nearest(message: str, catalogue: tuple[RaisedError, ...], n: int = 3, cutoff: float = 0.6) -> list[tuple[float, RaisedError]]:
    """Catalogue messages most of whose words the message holds (a message reworded across versions); one
    whose class-name field names none of its classes is Python's own wording, not that line's."""
    words = frozenset(_WORD.findall(message.lower()))
    if len(words) < 3:
        return []
    scored = []
    for entry, theirs in zip(catalogue, _word_sets(catalogue), strict=True):
        if entry.classes and not any(c in message for c in entry.classes):
            continue
        if len(theirs) >= 3:
            score = len(words & theirs) / len(theirs | words) ** 0.5 / len(theirs) ** 0.5
            if score >= cutoff and not _ends_a_longer_sentence(message, re.search(entry.pattern, message) if entry.pattern else None):
                scored.append((score, entry))
    return sorted(scored, key=lambda s: -s[0])[:n]


def raised_where(frame: tuple[str, str, str], catalogue: tuple[RaisedError, ...]) -> list[RaisedError]:
    """The catalogue's raising lines a cut-off traceback points at: those of the function its last line
    calls (in the frame's file first), else those of the frame's own function."""
    path, function, called = frame
    inside = sorted((e for e in catalogue if called and e.function == called), key=lambda e: (e.path != path, e.path, e.line))
    return inside or [e for e in catalogue if e.path == path and e.function == function]
