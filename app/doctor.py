"""The error doctor: a pasted DeepSpeed log or traceback -> the error, the lines of deepspeed that
raise it, what they check, and where the docs and our notes speak of it.

The error is read from the log by `app/error_log.py` and matched against the error catalogue of the
installed deepspeed by `app/catalogue_match.py`: exact patterns first (the longest fixed text wins),
then a message cut after its first sentences, then the nearest messages, then retrieval over the docs
and notes. A known cause whose text the log shows comes first; when none does, the known cause closest
in meaning to the error (the index's vectors of the known-errors note) comes first if it is close enough.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.catalogue_match import catalogue_for, exact_matches, leading_matches, nearest, raised_where
from app.error_log import (
    MAX_MESSAGE_CHARS,
    clean_log,
    cut_off_frame,
    deepspeed_frames,
    last_error,
    prose_lines,
    versions_in,
)
from app.known_cause_search import closest_known_cause
from indexer.error_catalogue import RaisedError
from indexer.known_causes import KnownCause, read_known_causes

EXACT = "this exact message"  # how a cause matched word for word begins its explanation (`raised_line` reads past it)
# a log that says the job stopped making progress, with no error of its own: in words, or a py-spy stack dump
_HANG = re.compile(r"\b(?:hangs?|hung|hanging|stuck|freez(?:es|ing)|froze|frozen|deadlock(?:ed|s)?|never (?:returns?|finish(?:es)?|"
                   r"starts?|completes?|progress(?:es)?)|no (?:further )?output|stops? (?:making )?progress(?:ing)?)\b|"
                   r"\(most recent call first\)", re.I)
_PATH = re.compile(r"\S*/\S*")
HANG_SLOTS = 2  # known causes of a stall put first for a log that only says it hangs
# the batch assertion with its figures: "... world_size 32 != 4 * 2 * 8"
_BATCH_FIGURES = re.compile(r"train_batch_size is not equal to micro_batch_per_gpu \* gradient_acc_step \* world_size\s+"
                            r"(\d+)\s*!=\s*(\d+)\s*\*\s*(\d+)\s*\*\s*(\d+)")


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


KNOWN_TITLE = "Known causes > "  # how a known cause names the passage of our notes it comes from


def _known_cause(k: KnownCause, source_url: str, found: str) -> Cause:
    """`found`: how the log led to it (the text it shows, or how close its message comes)."""
    fix = k.fix + (f" Config: {json.dumps(k.config)}" if k.config else "")
    return Cause(title=k.title, explanation=f"{k.why} Check: {k.check}".strip() + f" ({found})", fix=fix,
                 source_url=source_url, doc_urls=[k.url], doc_titles=[f"{KNOWN_TITLE}{k.title}"])


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
    # longest first; between causes the message names by the same text, the one whose other texts the log
    # shows too ("--auto_find_batch_size" beside "'NoneType' object has no attribute 'backward'")
    in_message.sort(key=lambda t: (-len(t[1]), -t[0].texts_in(whole)))
    elsewhere.sort(key=lambda t: (t[1] in t[0].follow_ups, -len(t[1])))  # a follow-up after what the log shows beside it
    specific = [t for t in elsewhere if t[1] not in t[0].follow_ups and not t[0].harmless]
    if in_message and all(seen in k.follow_ups for k, seen in in_message):
        # a cause the message names only by a follow-up that also shows its own line in the log stands with the
        # other causes the log shows, so the one nearest the error leads
        shown = [(k, own) for k, _ in in_message if (own := k.found_in(whole, follow_ups=False))]
        specific += shown
        if specific:
            specific.sort(key=lambda t: -whole.rfind(t[1].lower()))  # the line nearest the error first
            named = {id(k) for k, _ in shown}
            return [], specific + [t for t in in_message if id(t[0]) not in named] + [t for t in elsewhere if t not in specific]
    # a cause known by the frame the traceback passes through ("in compute_liger_loss"): that function is
    # where the failure starts, whatever generic message it ends in
    framed = [t for t in elsewhere if _FRAME_MARKER.search(t[1]) and not t[0].harmless]
    if framed:
        return framed + in_message, [t for t in elsewhere if t not in framed]
    return in_message, elsewhere


_FRAME_MARKER = re.compile(r"^in [A-Za-z_]\w*$")  # a known cause's text naming a traceback frame's function


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


KNOWN_SLOTS = 2  # known causes before the catalogue's raising lines


def diagnose(log: str, index_dir: Path | None = None, search: Any = None, known: tuple[KnownCause, ...] = (),
             closest_known: Any = None) -> Diagnosis:
    """`search(text) -> list[(title, url)]`: retrieval over the docs and notes (optional); `known`: the
    known causes of frequent failures (`indexer/known_causes.py`), put first when the log shows them;
    `closest_known(text) -> (cause, cosine) | None`: the known cause nearest in meaning (optional)."""
    text = clean_log(log)
    exception, message = last_error(text)
    seen = versions_in(log)
    error = {"type": exception, "message": message[:1000]}
    if not message and not exception:
        return Diagnosis(error, seen, "none", [Cause("no error found", "the text holds no exception line or message", "paste the traceback or the last lines of the log")])
    version, catalogue = catalogue_for(index_dir)
    flat = " ".join(message[:MAX_MESSAGE_CHARS].split())  # patterns have holes: keep the text they scan short
    exact = exact_matches(flat, catalogue)
    causes: list[Cause]
    frame = None if exact or exception else cut_off_frame(text)
    where: list[RaisedError] = []
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
    elif closest_known is not None and (near_known := closest_known(f"{prose_lines(text)} {exception}: {flat}")) is not None:
        # the message with what the writer said around it (the set-up, the command): "not enough values to unpack"
        # is a pipeline batch's shape when the log says it came from `train_batch`. Before a close text and a
        # release's bug: a known failure near in meaning is more often the one (`app.known_cause_search`)
        k, cosine = near_known
        causes = [_known_cause(k, line, f"the closest known failure to this message, cosine {cosine:.2f}")] + causes
    elif (close := close_known_match(known, flat)) is not None:
        k, seen_text = close
        causes = [_known_cause(k, line, f"the message is close to `{seen_text}`")] + causes
    elif matched in ("none", "retrieval") and (release := _release_bug(text, seen, version)) is not None:
        # before the passages retrieval found for a message no note or line explains
        causes = [release] + causes
    if not causes and docs:
        causes = [Cause(title, "not a message the installed deepspeed raises; the closest passage of the docs and notes", "read the passage",
                        doc_urls=[url], doc_titles=[title]) for title, url in docs[:3]]
    if not causes:
        causes = [Cause("no DeepSpeed error recognised", "the message is not one the installed deepspeed raises, and no passage matched",
                        "paste the traceback's last lines (the exception and its message), or ask the question in words")]
    causes[0].fix = batch_fix(flat, causes[0].fix)
    causes += benign[:1]
    if seen.get("deepspeed") and seen["deepspeed"] != version:
        for cause in causes:
            cause.explanation += f"; note: the log is from deepspeed {seen['deepspeed']}, the catalogue from {version}"
    return Diagnosis(error, seen, matched, causes)


_CONFIG_TAIL = re.compile(r" Config: \{.*\}$")  # a known cause's example config, as `_known_cause` appends it


def batch_fix(message: str, fix: str) -> str:
    """The fix of the batch assertion worked out on the message's figures (`batch_figures`), its config the
    `train_batch_size` they give in place of the note's example, which is for other figures; any other fix as it is."""
    values = _batch_values(message)
    if values is None:
        return fix
    _, micro, accum, world = values
    config = f" Config: {json.dumps({'train_batch_size': micro * accum * world})}" if world > 1 else ""
    return f"{_worked_out(*values)} {_CONFIG_TAIL.sub('', fix)}{config}"


def batch_figures(message: str) -> str:
    """For the batch assertion, the arithmetic on the log's own figures: the product the three values give
    and each single value that would make them agree ("" for any other message)."""
    values = _batch_values(message)
    return "" if values is None else _worked_out(*values)


def _batch_values(message: str) -> tuple[int, int, int, int] | None:
    """The batch assertion's figures (train batch, micro batch, accumulation steps, world size); None for any
    other message, or figures with a zero among the three factors."""
    m = _BATCH_FIGURES.search(message)
    if m is None:
        return None
    total, micro, accum, world = (int(g) for g in m.groups())
    return None if min(micro, accum, world) < 1 else (total, micro, accum, world)


def _worked_out(total: int, micro: int, accum: int, world: int) -> str:
    product = micro * accum * world
    ways = [f"`train_batch_size` {product}"]
    for key, other in (("gradient_accumulation_steps", micro * world), ("train_micro_batch_size_per_gpu", accum * world)):
        if total >= other and total % other == 0:
            ways.append(f"`{key}` {total // other}")
    one = " If the run has more than one GPU, the world size of 1 is what is wrong, not the values." if world == 1 else ""
    return (f"On this log's figures, {micro} (micro batch) x {accum} (accumulation steps) x {world} (GPUs) = {product}, "
            f"not {total}: any one of these makes them agree: {', or '.join(ways)}.{one} In general:")


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
    frames = deepspeed_frames(text)
    theirs = seen.get("deepspeed", "")
    older = bool(theirs) and _version_key(theirs) < _version_key(installed)
    if not frames and not older:
        return None
    release = f"deepspeed {theirs}" if theirs else "the deepspeed version the log comes from"
    if frames:
        what = (f"The traceback ends in {frames[-1][0]} ({frames[-1][1]}) with a message the installed deepspeed "
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


def raised_line(diagnosis: Diagnosis, *, known_failures: bool = True, nearest: bool = False) -> str:
    """For an answer to a question that quotes an error: where the installed deepspeed raises it and the first
    cause's fix, when the message is one it raises word for word, or (`known_failures`) a known failure whose text
    the message holds (torch's "CUDA out of memory", NCCL's watchdog timeout); a known failure is told by its name,
    the first sentence of why and its fix (the doctor gives the rest); with `nearest` (a pasted log), the doctor's
    first cause also when it matched the nearest way (the line a cut-off traceback stops at, a close message, a known
    failure the log shows beside its error), told as it matched; else ""."""
    if diagnosis.matched not in (("exact", "nearest") if nearest else ("exact",)) or not diagnosis.causes:
        return ""
    cause = diagnosis.causes[0]
    known = next((url for url, title in zip(cause.doc_urls, cause.doc_titles, strict=False) if title.startswith(KNOWN_TITLE)), "")
    source = cause.source_url or (known if known_failures else "")
    if not source:
        return ""
    said = cause.explanation.removeprefix(f"{EXACT}: ").rstrip(".")
    if known:  # the failure's name, and the first sentence of why when it is short (the doctor gives the rest)
        why = _SENTENCE_END.split(said.split(" Check: ")[0], 1)[0].rstrip(".")
        said = f"{cause.title}: {why}" if len(why.split()) <= WHY_WORDS else cause.title
    fix = cause.fix.rstrip(".")
    return f"{said[0].upper()}{said[1:]}. Fix: {fix} (source: {source}).\n"


WHY_WORDS = 40  # a known failure's first sentence of why longer than this leaves the answer's line to its name and fix
_SENTENCE_END = re.compile(r"(?<=[A-Za-z0-9)`'\"][.!?])\s+(?=[A-Z`(])")


def diagnose_with(index_path: Path | None, retriever: Any, log: str, notes_dir: Path | None = None) -> Diagnosis:
    """The one entry every front end calls: the index's error catalogue when it has one (else the
    installed deepspeed's, built now), retrieval over the index's passages when one is loaded, and
    the known causes of the notes directory."""
    known = read_known_causes(notes_dir) if notes_dir is not None else ()
    return diagnose(log, index_path, engine_search(retriever), known, closest_known_cause(retriever, known))
