"""What the index answers by itself whatever the coverage decision says: the question forms that decision
never learned (none of our labelled questions takes any of them, so no figure moves), each answered by
an entry of the index rather than by passages that happen to be close.

- a config key asked for nothing but what it is, does, defaults to or how to set it ("What does
  overlap_comm do?", "How do I set allgather_bucket_size?", "stage3_max_live_parameters 是什么意思"):
  the catalogue's entry (the decision refused 42% / 57% / 60% of 205 keys in those forms);
- an API symbol asked the same way ("What does TiledLinear do?", "How do I use GatheredParameters?")
  with its API page among the passages (47 and 33 of 60 refused);
- an API function or method asked what it returns ("What does deepspeed.initialize return?", "model_engine.
  load_checkpoint 返回什么"), which arguments it takes ("PipelineModule 有哪些参数？") or what one of them is ("What does
  the config argument of deepspeed.initialize do?"): its section, with the docstring's Returns section, its signature
  or the argument's line leading the answer (`api_line_asked`);
- a docs page's title or a config section's name asked the same way ("How do I enable Domino?", "What is
  the elasticity config for?") with that page among the passages (16 and 25 of 72 titles refused);
- a keyword search ("hostfile format", "ZeRO-Infinity") whose first passage holds every keyword (9 of 40);
- "was X removed?" about a key the installed deepspeed marks deprecated or removed;
- a message the installed deepspeed raises word for word ("I get ValueError: ..."): its raising line,
  condition and fix lead the answer (21 of 40 sampled catalogue messages refused); a covered question that
  is little but such a message gets the line too (`raised_message_line`); so does a message that holds a text
  of a known failure of our notes (torch's "CUDA out of memory", NCCL's watchdog timeout), its name, why and fix,
  in a covered answer only when nothing is asked beside the message; pasted alone, such a failure's why and fix are
  the whole answer (`told_alone`; also when nothing but its cause or fix is asked beside it), its note's passage
  first among the passages (`cited_failure_first`); a line pasted without an exception class ("[Rank 3] Watchdog
  caught collective operation timeout: ...", "Current loss scale already at minimum ...") that holds one of its
  texts of 4+ words is read the same way (`shows_known_failure`), and so is one that is a message deepspeed raises
  (`quotes_raised_message`) and a pasted log (the doctor's first cause, however it matched). How a question quotes
  an error (little but the message, a log, nothing asked beside it but a fix) is `app/pasted_error.py`'s reading.

And for a question that asks only what a named page is about ("What is ZeRO?"), covered or not, that page's
passage first and the answer's lead from it (`named_page_first`; an API symbol's page from the index when the
search did not return it, `asked_page_first`); for one that asks only what a config key is,
when the first passage does not name the key, the catalogue passage that holds the key's entry first, from
the index when the search ranked it below the passages it returns (`key_entry_first`: "What does overlap_comm
do?" was answered beside tensor_parallel's `tp_overlap_comm`, zero_optimization's entry seventh).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from app.answer_shapes import question_kind, returns_line, status_line
from app.catalogue_match import catalogue_for, exact_matches, fixed_chars
from app.doctor import diagnose_with, raised_line
from app.engine import Engine
from app.pasted_error import asks, asks_only_for_a_fix, little_but_message, pasted_log, speaks
from app.query import (
    SEARCH_WORDS,
    api_names_in,
    asked_what_arguments,
    asked_what_returns,
    asks_only_what_key_is,
    asks_unknowable,
    asks_what_argument_is,
    asks_whether_removed,
    is_keyword_query,
    mentions_argument,
    titles_in,
)
from app.retriever import Hit, SearchResult, matches_filter
from indexer.api_signatures import call_form
from indexer.documents import Chunk
from indexer.known_causes import KNOWN_ERRORS_URL, read_known_causes
from indexer.text_units import CATALOGUE_ENTRY, argument_unit, text_units
from indexer.tokenize import term_set


@dataclass(frozen=True)
class PagesAsked:
    """The pages a question asks nothing but what their subject is: by an API symbol it names, by a title."""

    api: frozenset[str]
    titled: frozenset[str]

    @property
    def any(self) -> frozenset[str]:
        return self.api | self.titled


def pages_asked(engine: Engine, question: str) -> PagesAsked:
    return PagesAsked(api_pages_asked(engine, question), titled_pages_asked(engine, question))


def answered_anyway(engine: Engine, question: str, result: SearchResult, asked: list[str], defined: list[str],
                    pages: PagesAsked) -> tuple[str | None, str]:
    """For a question the coverage decision refused: the rule that answers it anyway (None: none does) and,
    for a raised message, the line that leads the answer. `asked`: the config keys it names; `defined`:
    those it asks nothing but what they are; `pages`: the pages it asks about (`pages_asked`)."""
    if defined:
        return "config key", ""
    paths = {h.chunk.path for h in result.hits}
    if pages.api & paths:
        return "API symbol", ""
    if pages.titled & paths:
        return "page title", ""
    if is_keyword_query(question) and result.hits and not asks_unknowable(question):
        top = result.hits[0].chunk  # keywords the first passage holds every one of: a search, and it found them
        wanted = term_set(question) - SEARCH_WORDS
        if wanted and wanted <= term_set(" ".join((top.title, top.heading, top.text))):
            return "keyword search", ""
    if asks_whether_removed(question) and status_line(question, asked, engine.config_status):
        return "removed key", ""
    raised = raised_message_line(engine, question, asked)
    if raised:
        return "raised message", raised
    return None, ""


def raised_message_line(engine: Engine, question: str, asked: list[str], *, pasted_only: bool = False) -> str:
    """For a question that quotes a message the installed deepspeed raises word for word: the line that
    leads its answer (where it is raised, the condition, the fix); else "". `pasted_only`: only when the
    question is little but that message, asks nothing beside it but its cause or fix, or asks nothing at all (a
    covered question that asks more is answered from its passages; the line took the room of the docs' answer in 2
    of the 8 test questions that quote one)."""
    if (question_kind(question, asked) != "error" and not pasted_log(question)
            and not (shows_known_failure(engine, question) or quotes_raised_message(engine, question))):
        return ""
    fix_only = asks_only_for_a_fix(question)
    # a statement of the message ("my run stops with <message> after 2 hours") asks nothing else: it leads too
    if pasted_only and asks(question) and not (little_but_message(question) or fix_only):
        return ""  # checked before diagnosing: most covered questions stop here
    index, _ = engine.require()
    # a known failure our notes describe (no line of deepspeed raises it) leads a covered answer only when nothing
    # is asked beside the message but its cause or fix: its general cause and fix took the place of the docs' answer
    # to another question asked about it ("... does DeepSpeed have guidance on this kind of fragmentation OOM?")
    known = not pasted_only or not asks(question) or fix_only
    # a pasted log that asks nothing gets the doctor's first cause however it matched (its nearest catalogue line, a
    # known failure the log shows beside the error): on the tune-only logs, the answer named the thread's cause for
    # 54% of them with exact matches alone
    log = not asks(question) and little_but_message(question)
    return raised_line(diagnose_with(index.path, None, question, engine.settings.notes_dir), known_failures=known, nearest=log)


def shows_known_failure(engine: Engine, question: str) -> bool:
    """Whether a question that asks nothing quotes a message by which our notes know a failure, one with no exception
    class in it ("[Rank 3] Watchdog caught collective operation timeout: ...", "Current loss scale already at minimum":
    it reads as no error, and was refused or answered from passages that share its words); a text of at least
    KNOWN_MESSAGE_WORDS words, so that naming a symbol a known failure's log shows is not one."""
    if asks(question):
        return False
    low = question.lower()
    return any(len(c.found_in(low).split()) >= KNOWN_MESSAGE_WORDS for c in read_known_causes(engine.settings.notes_dir))


KNOWN_MESSAGE_WORDS = 4


def quotes_raised_message(engine: Engine, question: str) -> bool:
    """Whether a line pasted without its exception class is a message the installed deepspeed raises, nearly word for
    word: the fixed text of the catalogue message it matches is at least RAISED_SHARE of the line ("Only tuple of
    tensors is supported. Got Unsupported input type: ..." was answered from pipeline passages that share its words)."""
    if asks(question) or speaks(question):
        return False
    index, _ = engine.require()
    flat = " ".join(question.split())
    found = exact_matches(flat, catalogue_for(index.path)[1])
    return bool(found) and fixed_chars(found[0]) >= RAISED_SHARE * len(flat)


RAISED_SHARE = 0.5


def told_alone(question: str, lead: str) -> bool:
    """Whether a raised message's line is the whole answer: a known failure deepspeed does not raise (torch's out of
    memory, a missing module), cited from our notes, for a question that is little but its message and asks nothing
    beside it, or nothing but its cause or fix (`asks_only_for_a_fix`); the passages quoted after it were about the
    message's words, not the failure ("No module named 'deepspeed'" was followed by set_z3_leaf_modules, a CUDA out of
    memory by the CUDA version mismatch)."""
    alone = (not asks(question) and little_but_message(question)) or asks_only_for_a_fix(question)
    return f"(source: {KNOWN_ERRORS_URL}" in lead and alone


def api_pages_asked(engine: Engine, question: str) -> frozenset[str]:
    """The API pages of the symbols a question asks nothing but what they are or do ("What does TiledLinear do?")."""
    apis = api_names_in(question, engine.api_pages)
    return frozenset(engine.api_pages[a] for a in apis) if apis and asks_only_what_key_is(question, apis) else frozenset()


def api_line_asked(engine: Engine, question: str) -> tuple[str, str]:
    """The API function or method a question asks nothing but what it returns, which arguments it takes or what one
    of them is, and the line that answers (`api_returns_asked`, `api_arguments_asked`, `api_argument_asked`); ("", "")
    for any other question."""
    for asked in (api_returns_asked, api_arguments_asked, api_argument_asked):
        symbol, line = asked(engine, question)
        if symbol:
            return symbol, line
    return "", ""


def api_arguments_asked(engine: Engine, question: str) -> tuple[str, str]:
    """The API function, method or class a question asks nothing but which arguments it takes, and the line its
    signature in the installed deepspeed gives, the defaults beside ("`deepspeed.initialize` takes: `args=None`, ..."); ("", "") for
    any other question or a symbol the index has no signature of."""
    index, _ = engine.require()
    for symbol in asked_what_arguments(question, engine.api_sections):
        sig = next((s for s in index.signatures.by_name.get(symbol.rsplit(".", 1)[-1], ()) if s.qualified == symbol), None)
        if sig is not None and sig.parameters:
            more = ", and any other keyword argument" if sig.any_keyword else ""
            version = index.manifest.get("deepspeed_version") or "the installed deepspeed"
            return symbol, (f"`{symbol}` takes: {call_form(sig)}{more} "
                            f"(its signature in deepspeed {version}).")
    return "", ""


def api_returns_asked(engine: Engine, question: str) -> tuple[str, str]:
    """The API function or method a question asks nothing but what it returns ("What does deepspeed.initialize
    return?", "model_engine.load_checkpoint 返回什么"), the first whose docstring or signature says so, and what it
    says (`returns_line`); ("", "") for any other question."""
    for symbol in asked_what_returns(question, engine.api_sections):
        if said := returns_line(symbol, api_section_text(engine, symbol)):
            return symbol, said
    return "", ""


def api_argument_asked(engine: Engine, question: str) -> tuple[str, str]:
    """The API function or method whose argument a question asks nothing but what it is ("What does the config
    argument of deepspeed.initialize do?"), and that argument's line of its docstring (`text_units` reads one
    whole), told with the call ("`deepspeed.initialize(config=...)`: Optional: Instead of ..."); ("", "") for any
    other question."""
    if not mentions_argument(question):  # before the sections of the symbols it names are read into units
        return "", ""
    for symbol in api_names_in(question, engine.api_sections, after_any_object=True):
        for unit in text_units(api_section_text(engine, symbol)):
            arg = argument_unit(unit.text)
            if arg and arg[0] in question and asks_what_argument_is(question, symbol, arg[0]):
                return symbol, f"`{symbol}({arg[0]}=...)`{arg[1]}"
    return "", ""


def api_section_text(engine: Engine, symbol: str) -> str:
    """The text of an API symbol's section in the index, its chunks joined."""
    index, _ = engine.require()
    return "\n".join(index.chunks[i].text for i in engine.api_sections.get(symbol, ()))


def api_line_first(engine: Engine, result: SearchResult, question: str, *, topic: str | None = None,
                   source: str | None = None) -> tuple[SearchResult, str]:
    """For a question `api_line_asked` reads: the passage of the symbol's own section first (from the index when the
    search did not return it, unless the request's filters leave the API pages out) and the line that leads the
    answer; else the result as it is and ""."""
    symbol, line = api_line_asked(engine, question)
    first = _passage_first(engine, result, lambda c: c.source == "api" and c.heading == symbol, topic, source) if symbol else None
    return (result, "") if first is None else (first, line)


def titled_pages_asked(engine: Engine, question: str) -> frozenset[str]:
    """The pages whose title (or config section's name) a question asks nothing but what it is ("What is ZeRO?",
    "How do I enable Domino?")."""
    titles = titles_in(question, engine.page_titles)
    return frozenset().union(*(engine.page_titles[t] for t in titles)) if titles and asks_only_what_key_is(question, titles) else frozenset()


def named_page_first(result: SearchResult, pages: PagesAsked) -> tuple[SearchResult, bool]:
    """For a question that asks only what a named page's subject is (`pages`), that page's best passage
    first, and whether it is (then the answer's lead comes from it: "What is ZeRO?" led with ZeRO++, ranked
    above the page titled ZeRO)."""
    first = next((n for n, h in enumerate(result.hits) if h.chunk.path in pages.any), None)
    return (result, False) if first is None else (_moved_first(result, first), True)


def asked_page_first(engine: Engine, result: SearchResult, pages: PagesAsked, *, topic: str | None = None,
                     source: str | None = None) -> tuple[SearchResult, bool]:
    """`named_page_first`, and for a question that asks only what an API symbol is when the search returned no
    passage of the symbol's page: that page's first passage from the index, in place of the last passage, unless
    the request's filters leave it out ("What does zero.Init do?" once got three ZeRO tutorial passages)."""
    moved, first = named_page_first(result, pages)
    if first or not pages.api or not result.hits:
        return moved, first
    found = _passage_first(engine, result, lambda c: c.path in pages.api, topic, source)
    return (result, False) if found is None else (found, True)


def key_entry_first(engine: Engine, result: SearchResult, keys: list[str], *, topic: str | None = None,
                    source: str | None = None) -> tuple[SearchResult, bool]:
    """For a question that asks only what config keys are (`keys`, full dotted names) and whose first passage
    does not name the first of them: the catalogue passage holding its entry first, and whether it is; taken
    from the index (in place of the last passage) when the search did not return it, unless the request's
    filters leave the catalogue out."""
    if not keys or not result.hits or keys[0].rsplit(".", 1)[-1] in term_set(result.hits[0].chunk.text):
        return result, False  # the first passage names the key already (a tutorial's config that sets it)
    first = _passage_first(engine, result, lambda c: c.source == "config" and _holds_entry(c.text, keys[0]), topic, source)
    return (result, False) if first is None else (first, True)


def cited_failure_first(engine: Engine, result: SearchResult, lead: str, *, topic: str | None = None,
                        source: str | None = None) -> SearchResult:
    """The passage of our notes a known failure's line cites (`told_alone`) first among the passages, taken from the
    index (in place of the last passage) when the search did not return it, unless the request's filters leave the
    notes out: the reply's passages began with the docs the message's words matched, the note it quotes fifth or absent."""
    m = _CITED.search(lead)
    if m is None or not result.hits:
        return result
    return _passage_first(engine, result, lambda c: c.url == m.group(1), topic, source) or result


_CITED = re.compile(rf"\(source: ({re.escape(KNOWN_ERRORS_URL)}#[^)\s]+)\)")


def _passage_first(engine: Engine, result: SearchResult, wanted: Callable[[Chunk], bool], topic: str | None,
                   source: str | None) -> SearchResult | None:
    """The first passage `wanted` accepts moved first; else the index's first such chunk within the request's
    filters first, in place of the last passage; None when the index has none (`result.hits` not empty)."""
    held = next((n for n, h in enumerate(result.hits) if wanted(h.chunk)), None)
    if held is not None:
        return _moved_first(result, held)
    index, _ = engine.require()
    found = next((i for i, c in enumerate(index.chunks) if wanted(c) and matches_filter(c, topic, source)), None)
    if found is None:
        return None
    return replace(result, hits=[Hit(index.chunks[found], result.hits[0].score, 0.0, 0.0, (found,)), *result.hits[:-1]])


def _moved_first(result: SearchResult, n: int) -> SearchResult:
    return replace(result, hits=[result.hits[n], *result.hits[:n], *result.hits[n + 1:]])


def _holds_entry(text: str, key: str) -> bool:
    """Whether a catalogue passage holds the entry of `key` (a line `CATALOGUE_ENTRY` reads as that key's)."""
    return any(m is not None and m.group("key") == key for m in map(CATALOGUE_ENTRY.match, text.splitlines()))
