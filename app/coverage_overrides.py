"""What the index answers by itself whatever the coverage decision says: the question forms that decision
never learned (none of our labelled questions takes any of them, so no figure moves), each answered by
an entry of the index rather than by passages that happen to be close.

- a config key asked for nothing but what it is, does, defaults to or how to set it ("What does
  overlap_comm do?", "How do I set allgather_bucket_size?", "stage3_max_live_parameters 是什么意思"):
  the catalogue's entry (the decision refused 42% / 57% / 60% of 205 keys in those forms);
- an API symbol asked the same way ("What does TiledLinear do?", "How do I use GatheredParameters?")
  with its API page among the passages (47 and 33 of 60 refused);
- a docs page's title or a config section's name asked the same way ("How do I enable Domino?", "What is
  the elasticity config for?") with that page among the passages (16 and 25 of 72 titles refused);
- a keyword search ("hostfile format", "ZeRO-Infinity") whose first passage holds every keyword (9 of 40);
- "was X removed?" about a key the installed deepspeed marks deprecated or removed;
- a message the installed deepspeed raises word for word ("I get ValueError: ..."): its raising line,
  condition and fix lead the answer (21 of 40 sampled catalogue messages refused).
"""

from __future__ import annotations

from app.answer_shapes import question_kind, status_line
from app.doctor import diagnose_with, raised_line
from app.engine import Engine
from app.query import (
    SEARCH_WORDS,
    api_names_in,
    asks_only_what_key_is,
    asks_unknowable,
    asks_whether_removed,
    is_keyword_query,
    titles_in,
)
from app.retriever import SearchResult
from indexer.tokenize import term_set


def answered_anyway(engine: Engine, question: str, result: SearchResult, asked: list[str], defined: list[str]) -> tuple[str | None, str]:
    """For a question the coverage decision refused: the rule that answers it anyway (None: none does) and,
    for a raised message, the line that leads the answer. `asked`: the config keys it names; `defined`:
    those it asks nothing but what they are."""
    if defined:
        return "config key", ""
    paths = {h.chunk.path for h in result.hits}
    apis = api_names_in(question, engine.api_pages)
    if apis and asks_only_what_key_is(question, apis) and any(engine.api_pages[p] in paths for p in apis):
        return "API symbol", ""
    titles = titles_in(question, engine.page_titles)
    if titles and asks_only_what_key_is(question, titles) and any(engine.page_titles[t] & paths for t in titles):
        return "page title", ""
    if is_keyword_query(question) and result.hits and not asks_unknowable(question):
        top = result.hits[0].chunk  # keywords the first passage holds every one of: a search, and it found them
        wanted = term_set(question) - SEARCH_WORDS
        if wanted and wanted <= term_set(" ".join((top.title, top.heading, top.text))):
            return "keyword search", ""
    if asks_whether_removed(question) and status_line(question, asked, engine.config_status):
        return "removed key", ""
    if question_kind(question, asked) == "error":
        index, _ = engine.require()
        raised = raised_line(diagnose_with(index.path, None, question, engine.settings.notes_dir))
        if raised:
            return "raised message", raised
    return None, ""
