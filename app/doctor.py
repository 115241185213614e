"""The error doctor: a pasted DeepSpeed log or traceback -> the error, the lines of deepspeed that
raise it, what they check, and where the docs and our notes speak of it.

The log is cleaned (ANSI colours, `[rank3]:` prefixes), only its tail and error blocks are read
(bounded), the last exception line is the error (in a log with none, the last line that says
something failed). It is matched against the error catalogue of the
installed deepspeed (`indexer/error_catalogue.py`): exact patterns first (the longest fixed text
wins), then the nearest messages, then retrieval over the docs and notes. A known cause whose text the
log shows comes first; when none does, the known cause closest in meaning to the error (the index's
vectors of the known-errors note) comes first if it is close enough.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from indexer.config_catalogue import deepspeed_version
from indexer.error_catalogue import ERRORS_FILE, RaisedError, build_error_catalogue, read_error_catalogue
from indexer.known_causes import KnownCause, read_known_causes

MAX_LOG_CHARS = 200_000  # the tail that is read; errors are at the end of a log
EXACT = "this exact message"  # how a cause matched word for word begins its explanation (`raised_line` reads past it)
MAX_MESSAGE_CHARS = 2_000  # of the error message matched against the catalogue
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RANK = re.compile(r"^\s*\[(?:rank|Rank)\s*\d+\]:?\s?", re.M)
_EXC_LINE = re.compile(r"^\s*((?:[A-Za-z_][\w]*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Exit|Warning)|Exception)|AssertionError)(?::\s?(.*))?$")
# an exception written inside prose or a chat message ("... get the `RuntimeError: Unable to ...` error")
# (a match starts where a name starts: from inside a long run of letters each start re-read the run, and a
# 200 kB line without spaces took 270 s)
_INLINE_EXC = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception)|Exception)):[ \t]+([^`\n]{8,})")
# a line that says something failed, for a log with no exception line: the last such line is its error
_FAILURE_LINE = re.compile(r"\b(?:error|failed|fatal|cannot|can't|unable|not found|no such file|not supported|mismatch|undefined symbol|"
                           r"segmentation fault|killed|abort(?:ed|s)?|exits with return code|timed? ?out|未找到|错误|失败)\b", re.I)
_NOT_A_FAILURE = re.compile(r"\[(?:INFO|WARNING|WARN|DEBUG)\]|^\s*#")
# what a log shows after its error that is not one: progress bars, traceback frames and their code lines
_NOT_AN_ERROR = re.compile(r"^\s*(?:\d+%\||File \"|Traceback \(most recent|[│╰╭❱])|^\s{4}")
# a traceback frame inside the deepspeed package, and the source line under it
_DS_FRAME = re.compile(r'^\s*File "[^"]*?/(deepspeed/[^"]+\.py)", line \d+, in (\w+)\s*$')
_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")
# a log that says the job stopped making progress, with no error of its own: in words, or a py-spy stack dump
_HANG = re.compile(r"\b(?:hangs?|hung|hanging|stuck|freez(?:es|ing)|froze|frozen|deadlock(?:ed|s)?|never (?:returns?|finish(?:es)?|"
                   r"starts?|completes?|progress(?:es)?)|no (?:further )?output|stops? (?:making )?progress(?:ing)?)\b|"
                   r"\(most recent call first\)", re.I)
_PATH = re.compile(r"\S*/\S*")
HANG_SLOTS = 2  # known causes of a stall put first for a log that only says it hangs
_VERSION = {"deepspeed": re.compile(r"deepspeed(?:\s+version)?[\s:=v(]+(\d+\.\d+\.\d+)", re.I),
            "torch": re.compile(r"torch(?:\s+version)?[\s:=v(]+(\d+\.\d+(?:\.\d+)?)", re.I)}


@dataclass
class Cause:
    title: str
    explanation: str
    fix: str
    source_url: str = ""
    doc_urls: list[str] = field(default_factory=list)
    doc_titles: list[str] = field(default_factory=list)  # the titles of doc_urls' passages, in order


@dataclass
class Diagnosis:
    error: dict[str, str]
    versions: dict[str, str]
    matched: str  # exact | nearest | retrieval | none
    causes: list[Cause]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# the shell's and the C library's own messages as a Chinese-locale machine prints them (glibc's and
# bash's zh_CN translations), in English: the catalogue and the known causes are written in English
_LOCALISED = {
    "未找到命令": "command not found", "没有那个文件或目录": "No such file or directory", "权限不够": "Permission denied",
    "段错误": "Segmentation fault", "已杀死": "Killed", "地址已在使用": "Address already in use",
    "连接被拒绝": "Connection refused", "设备上没有空间": "No space left on device", "无法分配内存": "Cannot allocate memory",
    "连接超时": "Connection timed out", "没有到主机的路由": "No route to host", "核心已转储": "core dumped",
    "未预期的符号": "syntax error near unexpected token ", "附近有语法错误": "",
    "无法打开输入文件": "cannot open input file ",
}
_LOCALISED_RE = re.compile("|".join(map(re.escape, _LOCALISED)))


def clean_log(log: str) -> str:
    """The log's bounded tail without ANSI colours and `[rank3]:` prefixes, with the shell's and the C
    library's Chinese-locale messages in English."""
    text = _RANK.sub("", _ANSI.sub("", log[-MAX_LOG_CHARS:]))
    return _LOCALISED_RE.sub(lambda m: _LOCALISED[m.group(0)], text)


def extract_error(log: str) -> tuple[str, str]:
    """(exception type, message) of the last exception line; a message may run on a few lines."""
    return _last_error(clean_log(log))


def _last_error(text: str) -> tuple[str, str]:
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _EXC_LINE.match(lines[i])
        if m and not lines[i].startswith(("  File ", "    ")):
            message = (m.group(2) or "").strip()
            more = []  # the message's own further lines: up to a blank line, an indented code line or a frame
            for ln in lines[i + 1:i + 4]:
                if not ln.strip() or ln.lstrip().startswith("[") or _NOT_AN_ERROR.match(ln):
                    break
                more.append(ln.strip())
            return m.group(1).rsplit(".", 1)[-1], " ".join([message, *more]).strip()[:MAX_MESSAGE_CHARS]
    inline = list(_INLINE_EXC.finditer(text))
    if inline:  # no exception line of its own: the last one the text quotes
        m = inline[-1]
        return m.group(1).rsplit(".", 1)[-1], m.group(2).strip().rstrip("'\"")[:MAX_MESSAGE_CHARS]
    tail = [ln.strip() for ln in lines if ln.strip() and ln.isprintable() and not _NOT_AN_ERROR.match(ln)]
    tail = tail or [ln.strip() for ln in lines if ln.strip() and ln.isprintable()]
    # the last line saying something failed (not a logged warning, a comment or a bare label), else the last line
    failing = [ln for ln in tail if _FAILURE_LINE.search(ln) and not _NOT_A_FAILURE.search(ln) and len(ln.split()) > 2]
    return "", ((failing or tail)[-1][:MAX_MESSAGE_CHARS] if tail else "")


def cut_off_frame(text: str) -> tuple[str, str, str] | None:
    """A traceback pasted without its exception line, ending in a frame of deepspeed: (the frame's file,
    its function, the function its last line calls, '' when none); None for any other text."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for back in (1, 2):  # the frame line, then (usually) its source line
        if len(lines) >= back and (m := _DS_FRAME.match(lines[-back])):
            calls = _CALL.findall(lines[-1]) if back == 2 else []
            return m.group(1), m.group(2), calls[-1] if calls else ""
    return None


def raised_where(frame: tuple[str, str, str], catalogue: tuple[RaisedError, ...]) -> list[RaisedError]:
    """The catalogue's raising lines a cut-off traceback points at: those of the function its last line
    calls (in the frame's file first), else those of the frame's own function."""
    path, function, called = frame
    inside = sorted((e for e in catalogue if called and e.function == called), key=lambda e: (e.path != path, e.path, e.line))
    return inside or [e for e in catalogue if e.path == path and e.function == function]


def error_message(log: str) -> str:
    """The message of the error a log ends with, as `diagnose` reads it (without diagnosing)."""
    return _last_error(clean_log(log))[1]


def versions_in(log: str) -> dict[str, str]:
    found = {}
    for name, pattern in _VERSION.items():
        m = pattern.search(log[-MAX_LOG_CHARS:])
        if m:
            found[name] = m.group(1)
    return found


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
    """Read and compile the index's error catalogue now (about 2 s on 2 cores), as `diagnose_with` will: a
    server's first pasted error does not wait for it."""
    _compiled(_catalogue(_catalogue_key(index_dir))[1])


@lru_cache(maxsize=4)
def _compiled(catalogue: tuple[RaisedError, ...]) -> tuple[tuple[RaisedError, str, re.Pattern[str]], ...]:
    """Each pattern compiled once, with its longest fixed fragment: a cheap `in` test first, so a
    long message is scanned by the few regexes whose fixed text it holds."""
    out = []
    for e in catalogue:
        if e.pattern:
            fragment = max((" ".join(p.split()) for p in e.template.split("{}")), key=len)
            out.append((e, fragment, re.compile(e.pattern)))
    return tuple(out)


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
            if score >= cutoff:
                scored.append((score, entry))
    return sorted(scored, key=lambda s: -s[0])[:n]


# a sentence's end inside a message: where a pasted message is often cut ("The parameter 12 has already been reduced.")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
LEADING_WORDS = 4  # words of fixed text the first sentences need to stand for their message


@lru_cache(maxsize=4)
def _leading(catalogue: tuple[RaisedError, ...]) -> tuple[tuple[RaisedError, re.Pattern[str]], ...]:
    """The first sentences of each message that has several, as whole-message patterns."""
    out = []
    for e in catalogue:
        sentences = _SENTENCE_END.split(e.template) if e.pattern else []
        for k in range(1, len(sentences)):
            head = " ".join(sentences[:k]).rstrip(".!? ")
            if len(_WORD.findall(head.replace("{}", " ").lower())) >= LEADING_WORDS:
                fixed = [re.escape(" ".join(t.split())).replace(r"\ ", r"\s+") for t in head.split("{}")]
                last = r"\s*(\S+?)" if not fixed[-1] else ""  # a closing hole takes one word, not the sentences after it
                body = r"\s*(.+?)\s*".join(fixed[:-1]) + last if last else r"\s*(.+?)\s*".join(fixed)
                out.append((e, re.compile(body + r"[.!?]?")))
    return tuple(out)


def leading_matches(message: str, catalogue: tuple[RaisedError, ...]) -> list[RaisedError]:
    """Catalogue messages the message is the first sentences of, word for word: a message pasted without
    the sentences after its first (its words are a small share of the whole, so `nearest` would pass
    it by for a shorter message that shares most of them)."""
    found: list[RaisedError] = []
    for e, pattern in _leading(catalogue):
        if e not in found and pattern.fullmatch(message.strip()) and (not e.classes or any(c in message for c in e.classes)):
            found.append(e)
    return found


def _cause(entry: RaisedError, how: str, version: str) -> Cause:
    where = f"`{entry.function}` in {entry.path}" if entry.function != "<module>" else entry.path
    # an assert's test is what must hold; an `if` around a raise is what sets it off
    condition = "" if not entry.condition else (f" unless `{entry.condition}` holds" if entry.exception == "AssertionError"
                                                 else f" when `{entry.condition}`")
    names = ", ".join(f"`{n}`" for n in entry.names[:4])
    fix = f"check {names} in your config or call" if names else "see the raising line for the condition it checks"
    return Cause(title=f"{entry.exception or 'Error'}: {entry.template}"[:300],
                 explanation=f"{how}: raised by {where}{condition} (deepspeed {version})",
                 fix=fix, source_url=entry.url(version))


def _known_cause(k: KnownCause, source_url: str, found: str) -> Cause:
    """`found`: how the log led to it (the text it shows, or how close its message comes)."""
    fix = k.fix + (f" Config: {json.dumps(k.config)}" if k.config else "")
    return Cause(title=k.title, explanation=f"{k.why} Check: {k.check}".strip() + f" ({found})", fix=fix,
                 source_url=source_url, doc_urls=[k.url], doc_titles=[f"Known causes > {k.title}"])


def known_matches(known: tuple[KnownCause, ...], message: str, text: str) -> tuple[list[tuple[KnownCause, str]], list[tuple[KnownCause, str]]]:
    """Known causes whose texts the error message holds, then those found elsewhere in the cleaned log;
    each with the text found, longest first. A text that only reports an earlier failure (a follow-up:
    "Error building extension") found in the message goes after what the log shows elsewhere: the
    compiler's or linker's own line names the cause."""
    msg, whole = message.lower(), text.lower()
    in_message: list[tuple[KnownCause, str]] = []
    elsewhere: list[tuple[KnownCause, str]] = []
    for k in known:
        if seen := k.found_in(msg):
            in_message.append((k, seen))
        elif seen := k.found_in(whole):
            elsewhere.append((k, seen))
    in_message.sort(key=lambda t: -len(t[1]))
    elsewhere.sort(key=lambda t: (t[1] in t[0].follow_ups, -len(t[1])))  # a follow-up after what the log shows beside it
    specific = [t for t in elsewhere if t[1] not in t[0].follow_ups and not t[0].harmless]
    if specific and in_message and all(seen in k.follow_ups for k, seen in in_message):
        specific.sort(key=lambda t: -whole.rfind(t[1].lower()))  # the line nearest the error first
        return [], specific + in_message + [t for t in elsewhere if t not in specific]
    return in_message, elsewhere


_TOKEN = re.compile(r"[a-z0-9]+")
# a name in a known cause's text: a CamelCase class (DeepSpeedEngine) or a snake_case / dotted identifier
_NAMED = re.compile(r"\b[A-Za-z]*[a-z][A-Z][A-Za-z0-9]*\b|\b[A-Za-z0-9]+(?:[_.][A-Za-z0-9]+)+\b")
CLOSE_SHARE = 0.75  # of a known cause's text's words that the message must hold, in the same order; chosen on the tune logs


def close_known_match(known: tuple[KnownCause, ...], message: str) -> tuple[KnownCause, str] | None:
    """The known cause one of whose texts the message nearly holds: most of its words (at least three)
    in order, as when another torch release words the same error a little differently ("'weight' must
    be 2-D" and "tensors must be 2-D"), and every name the text holds (a rewording keeps the names of
    things: "'DeepSpeedEngine' object has no attribute" is not close to "'DummyOptim' object has no
    attribute"); the longest such text wins."""
    lowered = message.lower()
    words = _TOKEN.findall(lowered)
    vocabulary = frozenset(words)
    best: tuple[int, KnownCause, str] | None = None
    for k in known:
        if k.harmless:
            continue
        for text in k.matches:
            theirs = _TOKEN.findall(text.lower())
            need = CLOSE_SHARE * len(theirs)
            if len(theirs) < 3 or (best is not None and len(theirs) <= best[0]):
                continue
            if sum(t in vocabulary for t in theirs) >= need and _in_order(theirs, words) >= need \
                    and all(n.lower() in lowered for n in _NAMED.findall(text)):  # the cheap tests first
                best = (len(theirs), k, text)
    return (best[1], best[2]) if best else None


def _in_order(theirs: list[str], words: list[str]) -> int:
    """How many of `theirs` appear in `words` in the same order (a longest common subsequence)."""
    row = [0] * (len(words) + 1)
    for t in theirs:
        prev = 0
        for j, w in enumerate(words, 1):
            prev, row[j] = row[j], max(row[j], row[j - 1], prev + 1 if t == w else 0)
    return row[-1]


WEAK_EXACT = 0.4  # an exact match whose fixed text is less of the message than this gives way to a close longer one; chosen on the tune logs


def _fixed_chars(entry: RaisedError) -> int:
    """How much of a catalogue message is fixed text (its holes left out)."""
    return len(entry.template.replace("{}", ""))


KNOWN_SLOTS = 2  # known causes before the catalogue's raising lines


def diagnose(log: str, index_dir: Path | None = None, search: Any = None, known: tuple[KnownCause, ...] = (),
             closest_known: Any = None) -> Diagnosis:
    """`search(text) -> list[(title, url)]`: retrieval over the docs and notes (optional); `known`: the
    known causes of frequent failures (`indexer/known_causes.py`), put first when the log shows them;
    `closest_known(text) -> (cause, cosine) | None`: the known cause nearest in meaning (optional)."""
    text = clean_log(log)
    exception, message = _last_error(text)
    seen = versions_in(log)
    error = {"type": exception, "message": message[:1000]}
    if not message and not exception:
        return Diagnosis(error, seen, "none", [Cause("no error found", "the text holds no exception line or message", "paste the traceback or the last lines of the log")])
    version, catalogue = _catalogue(_catalogue_key(index_dir))
    flat = " ".join(message[:MAX_MESSAGE_CHARS].split())  # patterns have holes: keep the text they scan short
    exact = [e for e, fragment, pattern in _compiled(catalogue) if fragment in flat and pattern.search(flat)]
    exact.sort(key=lambda e: -_fixed_chars(e))
    causes: list[Cause]
    frame = None if exact or exception else cut_off_frame(text)
    where: list[RaisedError] = []
    if exact and _fixed_chars(exact[0]) < WEAK_EXACT * len(flat):  # a short generic pattern ("{} does not match {}"):
        longer = [e for _, e in nearest(flat, catalogue) if e not in exact[:1]]  # a longer message reworded across versions first
        exact = longer[:1] + exact
    if exact:
        matched, causes = "exact", [_cause(e, EXACT, version) for e in exact[:3]]
    elif frame is not None and (where := raised_where(frame, catalogue)):
        matched, causes = "nearest", [_cause(e, "the traceback is cut off where deepspeed calls this", version) for e in where[:3]]
        # the messages those lines raise stand in for the one the log lost, first raise first
        flat = " | ".join(e.template for e in where)[:MAX_MESSAGE_CHARS]
    elif lead := leading_matches(flat, catalogue):
        matched, causes = "nearest", [_cause(e, "the message is the start of this one", version) for e in lead[:3]]
    else:
        near = nearest(flat, catalogue)
        if near:
            matched, causes = "nearest", [_cause(e, f"a close message ({score:.0%} of its words)", version) for score, e in near]
        else:
            matched, causes = ("retrieval", []) if search is not None else ("none", [])
    docs = search(f"{exception} {flat}"[:500]) if search is not None else []
    for cause in causes:
        cause.doc_urls = [url for _, url in docs[:3]]
        cause.doc_titles = [title for title, _ in docs[:3]]
    in_message, elsewhere = known_matches(known, f"{exception}: {flat}", text)
    if where:
        in_message.sort(key=lambda t: flat.lower().find(t[1].lower()))
    line = causes[0].source_url if matched == "exact" else ""
    # a harmless warning the log shows beside the error is not its cause: listed last
    benign = [_known_cause(k, "", f"the log shows `{seen}`") for k, seen in elsewhere if k.harmless]
    shows = "a message the lines where the traceback stops can raise holds" if where else "the log shows"
    first = [_known_cause(k, line, f"{shows} `{seen}`") for k, seen in in_message] + \
        [_known_cause(k, "", f"the log shows `{seen}`") for k, seen in elsewhere if not k.harmless]
    if first:
        causes = first[:KNOWN_SLOTS] + causes
        matched = "exact" if in_message and not where else (matched if matched in ("exact", "nearest") else "nearest")
    elif not exception and _HANG.search(text) and (stalls := stall_causes(known, text)):
        # no exception, no known text, and the log says it stopped: what makes DeepSpeed jobs stall, the
        # closest to this log first, before a catalogue line the last line only happens to resemble
        causes = [_known_cause(k, "", f"the log shows no error and says the job stopped; {how}") for k, how in stalls] + causes
    elif (close := close_known_match(known, flat)) is not None:
        k, seen_text = close
        causes = [_known_cause(k, line, f"the message is close to `{seen_text}`")] + causes
    elif matched in ("none", "retrieval") and (release := _release_bug(text, seen, version)) is not None:
        # before a known cause that is only near in meaning (tune-only logs: one more right this way) and
        # before the passages retrieval found for a message no note or line explains
        causes = [release] + causes
    elif closest_known is not None and (near_known := closest_known(f"{exception}: {flat}")) is not None:
        k, cosine = near_known
        causes = [_known_cause(k, line, f"the closest known failure to this message, cosine {cosine:.2f}")] + causes
    if not causes and docs:
        causes = [Cause(title, "not a message the installed deepspeed raises; the closest passage of the docs and notes", "read the passage",
                        doc_urls=[url], doc_titles=[title]) for title, url in docs[:3]]
    if not causes:
        causes = [Cause("no DeepSpeed error recognised", "the message is not one the installed deepspeed raises, and no passage matched",
                        "paste the traceback's last lines (the exception and its message), or ask the question in words")]
    causes += benign[:1]
    if seen.get("deepspeed") and seen["deepspeed"] != version:
        for cause in causes:
            cause.explanation += f"; note: the log is from deepspeed {seen['deepspeed']}, the catalogue from {version}"
    return Diagnosis(error, seen, matched, causes)


def stall_causes(known: tuple[KnownCause, ...], text: str) -> list[tuple[KnownCause, str]]:
    """The known causes of a stall (`Hangs: yes`) nearest a log that reports one, by the words of their
    title, why and check the log holds, a word few of them use counting most (the index's vectors ranked
    the four stalled tune logs worse: one right against three)."""
    stalls = tuple(k for k in known if k.hangs)
    if not stalls:
        return []
    words = set(_TOKEN.findall(_PATH.sub(" ", text).lower()))  # a file's folders say where it is installed, not what stalled
    theirs = {k: {w for w in _TOKEN.findall(f"{k.title} {k.why} {k.check}".lower()) if len(w) > 3} for k in stalls}
    holding = Counter(w for ws in theirs.values() for w in ws)
    # a word few of these causes use says more about which one this is (weighted as in BM25's idf)

    def share(k: KnownCause) -> float:
        return sum(math.log(1 + len(stalls) / holding[w]) for w in theirs[k] & words) / math.sqrt(len(theirs[k]) or 1)

    ranked_by_words = sorted(stalls, key=share, reverse=True)
    return [(k, "the most telling words in common with this log") for k in ranked_by_words[:HANG_SLOTS]]


def _release_bug(text: str, seen: dict[str, str], installed: str) -> Cause | None:
    """For an error no catalogue line and no known cause explains: when the traceback ends inside
    deepspeed's own code, or the log names an older deepspeed, the message is one the installed release
    no longer raises there, which most often means a bug of the user's release, fixed since; None
    when the log shows neither (another library's error, or the user's own)."""
    frames = [m for ln in text.splitlines() if (m := _DS_FRAME.match(ln))]
    theirs = seen.get("deepspeed", "")
    older = bool(theirs) and _version_key(theirs) < _version_key(installed)
    if not frames and not older:
        return None
    release = f"deepspeed {theirs}" if theirs else "the deepspeed version the log comes from"
    if frames:
        what = (f"The traceback ends in {frames[-1].group(1)} ({frames[-1].group(2)}) with a message the installed deepspeed "
                f"({installed}) does not raise, and no known failure matches it. An error from deepspeed's own code")
    else:
        what = (f"The log is from {release}, older than the installed {installed}; its message is none that "
                f"{installed} raises and no known failure matches it. An error under an older deepspeed")
    return Cause(
        title=f"An error that deepspeed {installed} does not raise: likely a bug of {release}, fixed since",
        explanation=(f"{what} that later releases no longer raise is most often a bug of the older release, or a mismatch "
                     f"between the deepspeed version and the project that calls it. Check: the deepspeed version (`ds_report`, "
                     f"`pip show deepspeed`) and the version the project or its requirements pin."),
        fix=("Upgrade DeepSpeed (`pip install -U deepspeed`) and rerun; if the project pins a deepspeed version, install "
             "exactly that one instead. Search the DeepSpeed issues and release notes for the message."))


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def engine_search(retriever: Any) -> Any:
    """The doctor's retrieval over a loaded retriever: `text -> [(title > heading, url)]`."""
    if retriever is None:
        return None

    def search(text: str) -> list[tuple[str, str]]:
        return [(f"{h.chunk.title} > {h.chunk.heading}", h.chunk.url) for h in retriever.search(text, 3).hits]

    return search


KNOWN_COSINE = 0.6  # a known cause closer than this in meaning leads when the log shows none; chosen on the tune logs
# (the first known cause by cosine was the thread's cause for 17 of the 25 tune logs at 0.6 or more, 26 of 43 at 0.5)


def closest_known_cause(retriever: Any, known: tuple[KnownCause, ...]) -> Any:
    """`text -> (known cause, cosine) | None` over the index's vectors of the known-errors note's passages
    (one query encode, and the note's passages looked up only then: most logs show a known cause's text);
    None without a retriever that holds them."""
    index, matrix, embedder = (getattr(retriever, name, None) for name in ("index", "matrix", "embedder"))
    if index is None or matrix is None or embedder is None or not known:
        return None

    def closest(text: str) -> tuple[KnownCause, float] | None:
        by_url = {k.url: k for k in known}
        rows = [i for i, c in enumerate(index.chunks) if c.url in by_url]
        if not rows:
            return None
        cos = matrix[rows] @ embedder.embed([text[:1000]])[0]
        best = int(cos.argmax())
        cause = by_url[index.chunks[rows[best]].url]
        return (cause, float(cos[best])) if cos[best] >= KNOWN_COSINE and not cause.harmless else None

    return closest


def raised_line(diagnosis: Diagnosis) -> str:
    """For an answer to a question that quotes an error: where the installed deepspeed raises it and the
    first cause's fix, when the message is one it raises word for word (else "")."""
    if diagnosis.matched != "exact" or not diagnosis.causes or not diagnosis.causes[0].source_url:
        return ""
    cause = diagnosis.causes[0]
    said = cause.explanation.removeprefix(f"{EXACT}: ").rstrip(".")
    fix = cause.fix.rstrip(".")
    return f"{said[0].upper()}{said[1:]}. Fix: {fix} (source: {cause.source_url}).\n"


def diagnose_with(index_path: Path | None, retriever: Any, log: str, notes_dir: Path | None = None) -> Diagnosis:
    """The one entry every front end calls: the index's error catalogue when it has one (else the
    installed deepspeed's, built now), retrieval over the index's passages when one is loaded, and
    the known causes of the notes directory."""
    known = read_known_causes(notes_dir) if notes_dir is not None else ()
    return diagnose(log, index_path, engine_search(retriever), known, closest_known_cause(retriever, known))
