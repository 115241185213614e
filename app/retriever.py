"""Retrieval over the loaded index: the `Retriever` protocol and the shipped hybrid.

`HybridRetriever` (shipped): BM25 with identifier-aware tokens and MiniLM cosines, each over the
whole question and over its ask (`app/query.py`); the union of both top lists is re-ranked by the
learned linear model (`app/ranking.py`, trained on the `tune` split) or, without one, by the
weighted fusion; a passage grows with its section's neighbouring chunks (one passage per
section, and a section whose chunks did not fit one passage still shows once), near-duplicates are
dropped, and one of our notes at most stands fifth, unless the ranker puts it far ahead of the docs
(`note_leads`). The peers measured beside it in the same run live in `app/peer_retrievers.py`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np

from app.batching import submit_one
from app.coverage import coverage_features
from app.fusion import near_duplicate, shingles, weighted_fusion
from app.glossary import Glossary, has_cjk
from app.linear_model import LinearModel
from app.passages import PassageSpans, section_of
from app.query import (
    asks_first_release,
    asks_other_library,
    asks_plan_or_figure,
    asks_unknowable,
    coverage_group,
    identifiers,
    keyword_calls,
    settings_named,
    split_question,
    without_config_blocks,
)
from app.query_adapter import QueryAdapter
from app.question_memory import ChunkMemory
from app.ranking import ChunkTerms, FeatureTable, QuerySignals, candidate_features, chunk_terms
from app.refusal_memory import RefusalMemory
from indexer.documents import Chunk
from indexer.embedder import Embedder
from indexer.known_causes import KNOWN_ERRORS_NOTE
from indexer.store import LoadedIndex
from indexer.tokenize import tokenize


@dataclass(frozen=True)
class Hit:
    chunk: Chunk
    score: float  # ranking score, comparable within one query
    bm25: float
    dense: float  # cosine similarity of the query and the passage
    span: tuple[int, ...] = ()  # the index's chunks the passage joins (its own first when alone)


@dataclass(frozen=True)
class SearchResult:
    hits: list[Hit]
    query: str  # the text actually searched (a Chinese question's English expansion)
    relevance: float  # best cosine among the hits: how well the docs cover the question
    covered: bool | None = None  # the retriever's own coverage decision; None: the caller judges `relevance`
    query_vector: np.ndarray | None = None  # the encoder's vector of the question
    unknown_settings: tuple[str, ...] = ()  # config keys, flags or keyword arguments the question writes out that nothing indexed names
    unaccepted_arguments: tuple[tuple[str, str], ...] = ()  # (function, keyword) the question passes that the installed function does not take
    seen_units: Mapping[str, float] = field(default_factory=dict)  # `ChunkMemory.seen_units` of the question ({}: no memory)


class Retriever(Protocol):
    def search(self, question: str, k: int = 5, *, topic: str | None = None, source: str | None = None) -> SearchResult: ...


def matches_filter(chunk: Chunk, topic: str | None, source: str | None) -> bool:
    if source and chunk.source != source:
        return False
    if topic:
        t = topic.lower()
        return t == chunk.topic.lower() or t in chunk.path.lower() or t in chunk.title.lower()
    return True


def bm25_scores(index: LoadedIndex, tokens: list[str]) -> np.ndarray:
    """BM25 of the tokens against every chunk (zeros for no tokens)."""
    if not tokens:
        return np.zeros(len(index.chunks), dtype=np.float32)
    return np.asarray(index.bm25.get_scores(tokens), dtype=np.float32)


def dense_matrix(index: LoadedIndex) -> np.ndarray:
    """The index's unit vectors as one matrix: a matrix product gives every cosine at once."""
    n = index.vectors.ntotal
    return index.vectors.reconstruct_n(0, n) if n else np.zeros((0, index.vectors.d), dtype=np.float32)


COVERAGE_DEPTH = 5  # the coverage decision looks at the first five passages, whatever k is
NOTE_SLOT = 5  # the highest place one of our notes takes among the passages (1-based)
# ... unless the ranker scores it this much above DeepSpeed's own first passage: the docs do not hold what it says
# (torch.compile, FP8, the Hugging Face Trainer: 5.6 to 8.6 above). Our question sets cannot reward a note (their gold
# phrases are the docs' own text); 4 is midway between the largest tune gaps, 5.8 and 2.2; the 5.8 one is a section of
# the known-errors note, which never leads by score (its failures lead when a message shows their texts)
NOTE_LEAD_MARGIN = 4.0


@dataclass(frozen=True)
class RetrievalOptions:
    """Every retrieval choice in one place; each was kept because the `tune` split said so."""

    bm25_share: float = 0.6  # weighted fusion (used when no ranker is loaded)
    cjk_bm25_scale: float = 1.25  # a Chinese question's English is a bag of glossary terms: lean on BM25
    source_priors: dict[str, float] = field(default_factory=lambda: {"notes": 0.7, "news": 0.9})
    depth: int = 100  # candidates from each of BM25 and dense
    split_ask: bool = True  # score the ask apart from the chatty context
    ranker: LinearModel | None = None  # the learned re-ranking; None: weighted fusion and priors
    abstention: LinearModel | None = None  # the coverage decision (`app/coverage.py`); None: no decision
    section_words: int = 350  # grow a passage with its section's neighbouring chunks up to this many words (0: off)
    # where a passage grows, in turn, while its words fit: its own section, then that section's
    # subsections, then its parent section (all on its page; see `app.passages.PASSAGE_SCOPES`)
    passage_scopes: tuple[str, ...] = ("section", "subsections", "parent")
    notes_last: bool = True  # at most one of our notes, never above fifth place (see `select`)...
    note_lead_margin: float = NOTE_LEAD_MARGIN  # ...unless the ranker puts it this far ahead of the docs (`note_leads`)
    dedupe: bool = True
    sentence_cosine: bool = True  # the ranker reads each chunk's best sentence cosine (off: its whole-chunk cosine)
    one_per_section: bool = True  # a second chunk of a section already shown (same page and headings) is skipped
    query_adapter: QueryAdapter | None = None  # the learned query-vector correction (`app/query_adapter.py`)
    question_memory: ChunkMemory | None = None  # the tune questions and their answering chunks (`app/question_memory.py`)
    refusal_memory: RefusalMemory | None = None  # tune questions the docs do not answer (`app/refusal_memory.py`)


class HybridRetriever:
    def __init__(
        self,
        index: LoadedIndex,
        embedder: Embedder,
        glossary: Glossary | None = None,
        options: RetrievalOptions | None = None,
        *,
        bm25_tokens: Callable[[str], list[str]] = tokenize,
    ):
        self.index = index
        self.embedder = embedder
        self.glossary = glossary or Glossary({})
        self.options = options or RetrievalOptions()
        self.bm25_tokens = bm25_tokens  # must match how the index's BM25 was built
        self.matrix = dense_matrix(index)
        self._shingles: dict[int, np.ndarray] = {}

    def with_options(self, **changes: object) -> HybridRetriever:
        """The same retriever with some options changed, sharing the loaded vectors, chunk terms and
        shingles (training and the bench score variants without loading anything again)."""
        other = copy.copy(self)
        other.options = replace(self.options, **changes)  # type: ignore[arg-type]
        if (other.options.section_words, other.options.passage_scopes) != (self.options.section_words, self.options.passage_scopes):
            other.__dict__.pop("spans", None)  # spans depend on `section_words` and `passage_scopes`
            other.__dict__.pop("feature_table", None)  # and so do the passages' posting lists
        return other

    @cached_property
    def terms(self) -> list[ChunkTerms]:
        stored = self.index.terms
        return [chunk_terms(c, stored[i] if stored is not None else None) for i, c in enumerate(self.index.chunks)]

    @cached_property
    def feature_table(self) -> FeatureTable:
        """The ranker's per-chunk arrays and posting lists (passages as `section_words` grows them)."""
        return FeatureTable(self.terms, [self.section_span(i) for i in range(len(self.index.chunks))])

    def _bm25(self, text: str) -> np.ndarray:
        return bm25_scores(self.index, self.bm25_tokens(text))

    def signals(self, question: str) -> tuple[str, QuerySignals]:
        """The searched text and the question's scores over every chunk."""
        parts = split_question(question)
        query = self.glossary.expand(question)
        ask = self.glossary.expand(parts.ask) if self.options.split_ask and parts.has_context else query
        # one embedding of the whole question: a second one of the ask alone cost ~5 ms a query and
        # moved no metric on the tune split beyond one question either way. The words' scores are
        # computed while the encoder runs.
        pending = submit_one(self.embedder, query)
        bm25 = self._bm25(query)
        bm25_ask = bm25 if ask == query else self._bm25(ask)
        named = frozenset(identifiers(query))
        ask_terms = frozenset(tokenize(ask))
        vector = pending.result()
        adapter = self.options.query_adapter
        memory = self.options.question_memory
        if memory is not None and memory.memory.dimension != len(vector):
            memory = None
        searched = adapter.apply(vector) if adapter is not None and adapter.dimension == len(vector) else vector
        seen: np.ndarray | None = None
        seen_lex: np.ndarray | None = None
        seen_best: float | None = None
        seen_units: dict[str, float] | None = None
        if memory is not None:  # one product with the remembered questions for the memory's three reads
            # a pasted config block tells the set-up, not what is asked: remembered questions are matched by the words
            worded = without_config_blocks(question)
            own = vector if worded == question or not worded else self.embedder.embed([self.glossary.expand(worded)])[0]
            resemblance = memory.cosines(own)
            seen, seen_best, seen_units = memory.seen(resemblance), memory.best(resemblance), memory.seen_units(resemblance)
            seen_lex = memory.seen_lexical(worded or question)
        refusals = self.options.refusal_memory
        refused_best: float | None = None
        refused_leaning: float | None = None
        refused_wording: float | None = None
        if refusals is not None and refusals.dimension == len(vector):
            refused_best, refused_leaning = refusals.resemblance(vector), refusals.leaning(vector)
            refused_wording = refusals.wording_leaning(question)
        cos = self.matrix @ searched if len(self.matrix) else np.zeros(0, dtype=np.float32)
        signals = QuerySignals(
            bm25=bm25,
            bm25_ask=bm25_ask,
            cos=cos,
            ask_terms=ask_terms,
            identifiers=named,
            cjk=has_cjk(question),
            query_vector=searched,  # the answer's units are scored with it too (tune CV evidence 0.585 -> 0.622 over the base vector)
            query_terms=max(len(set(self.bm25_tokens(query))), 1),
            ask_identifiers=named if ask == query else frozenset(identifiers(ask)),
            unknown_identifiers=frozenset(t for t in named if not self.feature_table.knows(t)),
            unknowable=asks_unknowable(question),
            plan_or_figure=asks_plan_or_figure(question),
            first_release=asks_first_release(question),
            other_library=asks_other_library(question),
            unknown_settings=tuple(dict.fromkeys(n for n in settings_named(question) if not self.knows_setting(n))),
            unaccepted_arguments=self.unaccepted_arguments(question),
            unseen_terms=sum(1 for t in ask_terms if not self.feature_table.knows(t)),
            seen=seen,
            seen_lex=seen_lex,
            seen_best=seen_best,
            seen_units=seen_units,
            refused_best=refused_best,
            refused_leaning=refused_leaning,
            refused_wording=refused_wording,
            pool=(pool := self.pool(bm25, cos, bm25_ask)),
            unit_cos=self.unit_cosines(searched, cos, pool) if self.options.sentence_cosine else None,
        )
        return query, signals

    def unaccepted_arguments(self, question: str) -> tuple[tuple[str, str], ...]:
        """(function, keyword) for each keyword argument the question passes that the installed function
        it names does not take (`deepspeed.initialize(..., seed=1)`)."""
        found = [(sig.qualified, keyword) for callee, keyword in keyword_calls(question)
                 if (sig := self.index.signatures.unaccepted(callee, keyword)) is not None]
        return tuple(dict.fromkeys(found))

    def knows_setting(self, name: str) -> bool:
        """Whether a chunk or heading names a setting, spelt with `_` or `-` (`--num_gpus`, `num-gpus`)."""
        return any(self.feature_table.knows(v) for v in {name, name.replace("-", "_"), name.replace("_", "-")})

    def unit_cosines(self, vector: np.ndarray, cos: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        """Per chunk, the best cosine of `vector` over its text units (a chunk without units: its own);
        with `ids`, only those chunks' units are scored (the candidate pool: a tenth of the units)."""
        vectors, offsets = self.index.unit_vectors, self.index.unit_offsets
        best = cos.astype(np.float32).copy()
        if vectors is None or len(offsets) != len(cos) + 1 or len(vectors) != offsets[-1]:
            return best
        ids = np.arange(len(cos)) if ids is None else ids
        owners = ids[offsets[ids + 1] > offsets[ids]]
        if not len(owners):
            return best
        lo, sizes = offsets[owners], offsets[owners + 1] - offsets[owners]
        firsts = np.cumsum(sizes) - sizes  # where each owner's units start among the gathered rows
        rows = np.arange(int(sizes.sum())) + np.repeat(lo - firsts, sizes)
        best[owners] = np.maximum.reduceat(vectors[rows] @ vector, firsts)
        return best

    def pool(self, bm25: np.ndarray, cos: np.ndarray, bm25_ask: np.ndarray) -> np.ndarray:
        """The chunks worth ranking, sorted: the `depth` best by BM25 and by cosine, half as many by the ask's BM25."""
        d = self.options.depth
        pools = [np.argsort(-bm25)[:d], np.argsort(-cos)[:d]]
        if bm25_ask is not bm25:
            pools.append(np.argsort(-bm25_ask)[: d // 2])
        return np.unique(np.concatenate(pools)).astype(np.int64)

    def candidates(self, q: QuerySignals, topic: str | None = None, source: str | None = None) -> np.ndarray:
        cand = q.pool if q.pool is not None else self.pool(q.bm25, q.cos, q.bm25_ask)
        if topic is not None or source is not None:
            cand = np.array([i for i in cand.tolist() if matches_filter(self.index.chunks[i], topic, source)], dtype=np.int64)
        return cand

    def score(self, ids: np.ndarray, q: QuerySignals) -> np.ndarray:
        o = self.options
        if o.ranker is not None:
            return o.ranker.score(candidate_features(ids, q, self.feature_table))
        share = min(1.0, o.bm25_share * (o.cjk_bm25_scale if q.cjk else 1.0))
        fused = weighted_fusion(q.bm25[ids], q.cos[ids], share, 1.0 - share)
        if o.source_priors:
            fused = fused * np.array([self._prior(self.index.chunks[int(i)]) for i in ids])
        return fused

    def search(self, question: str, k: int = 5, *, topic: str | None = None, source: str | None = None) -> SearchResult:
        query, q = self.signals(question)
        ids = self.candidates(q, topic, source)
        if not len(ids):
            return SearchResult(hits=[], query=query, relevance=0.0)
        scores = self.score(ids, q)
        chosen = self.select(ids, scores, k)
        hits = [
            Hit(chunk=self.passage(i), score=s, bm25=float(q.bm25[i]), dense=float(q.cos[i]), span=self.section_span(i))
            for i, s in chosen
        ]
        relevance = max((h.dense for h in hits), default=0.0)
        covered = None
        model = self.options.abstention
        if model is not None and chosen:
            top = chosen if k >= COVERAGE_DEPTH else self.select(ids, scores, COVERAGE_DEPTH)
            row = self.coverage_row(q, ids, top)
            covered = bool(model.score(row[None, :])[0] >= model.threshold_for(coverage_group(question)))
        hits = self.note_leads(hits)  # after the coverage decision, which was trained on the notes' fifth place
        return SearchResult(hits=hits, query=query, relevance=relevance, covered=covered, query_vector=q.query_vector,
                            unknown_settings=q.unknown_settings, unaccepted_arguments=q.unaccepted_arguments,
                            seen_units=q.seen_units or {})

    def coverage_row(self, q: QuerySignals, ids: np.ndarray, top: list[tuple[int, float]]) -> np.ndarray:
        """The coverage signals of a search whose first passages are `top` (chunk id, score)."""
        first = [i for i, _ in top[:COVERAGE_DEPTH]]
        texts = [self.index.chunks[i].text for i in first]
        return coverage_features(q, q.cos[ids], first, top[0][1], self.terms, texts)

    def select(self, ids: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The k best by score; a chunk inside a section passage already taken, or a near-duplicate
        of a taken passage, is skipped.

        With `notes_last`, DeepSpeed's own pages fill the slots and our best note, when it ranks
        among the k best, stands no higher than fifth (the last slot of the default five): a note
        summarises and adds what the installed version changed, but never stands before the docs
        it summarises, and one note is enough."""
        if not self.options.notes_last:
            return self._select(ids, scores, k, skip_notes=False)
        chosen = self._select(ids, scores, k, skip_notes=True)
        notes = [int(p) for p in np.argsort(-scores, kind="stable") if self.index.chunks[int(ids[p])].source == "notes"]
        if notes and k > 0:
            best = notes[0]
            rank = sum(1 for _, s in chosen if s > scores[best])
            if rank < k:
                slot = min(max(rank, min(k, NOTE_SLOT) - 1), len(chosen))
                chosen = (chosen[:slot] + [(int(ids[best]), float(scores[best]))] + chosen[slot:])[:k]
        return chosen

    def note_leads(self, hits: list[Hit]) -> list[Hit]:
        """The hits with our note first when the ranker scores it `note_lead_margin` above the best of DeepSpeed's
        own passages: a question the docs hardly touch (how to use torch.compile) is answered from the note that
        covers it, not from pages that only share its words. Ranker scores only (the fusion's are on another scale)."""
        o = self.options
        if not o.notes_last or o.ranker is None or len(hits) < 2:
            return hits
        note = next((n for n, h in enumerate(hits) if h.chunk.source == "notes"), None)
        if note is not None and Path(hits[note].chunk.path).name == KNOWN_ERRORS_NOTE:
            return hits  # a known failure leads when the message shows its text (`app.doctor.raised_line`), not by score
        docs = max((h.score for h in hits if h.chunk.source != "notes"), default=None)
        if note is None or note == 0 or docs is None or hits[note].score - docs <= o.note_lead_margin:
            return hits
        return [hits[note], *hits[:note], *hits[note + 1:]]

    def _select(self, ids: np.ndarray, scores: np.ndarray, k: int, *, skip_notes: bool) -> list[tuple[int, float]]:
        chosen: list[tuple[int, float]] = []
        inside: set[int] = set()  # chunks within the passages taken
        sections: set[tuple[str, tuple[str, ...]]] = set()
        for p in np.argsort(-scores, kind="stable"):
            if len(chosen) >= k:
                break
            idx = int(ids[p])
            if skip_notes and self.index.chunks[idx].source == "notes":
                continue
            if idx in inside:
                continue  # already inside a passage taken: one passage per section span
            if self.options.one_per_section and section_of(self.index.chunks[idx]) in sections:
                continue
            if self.options.dedupe and any(near_duplicate(self._shingle(idx), self._shingle(j)) for j, _ in chosen):
                continue
            chosen.append((idx, float(scores[p])))
            inside.update(self.section_span(idx))
            sections.add(section_of(self.index.chunks[idx]))
        return chosen

    @cached_property
    def spans(self) -> PassageSpans:
        return PassageSpans(self.index.chunks, [t.words for t in self.terms], self.options.section_words, self.options.passage_scopes)

    def section_span(self, idx: int) -> tuple[int, ...]:
        """The chunk and the neighbours its passage grows into (`app/passages.py`)."""
        return self.spans.span(idx)

    def passage(self, idx: int) -> Chunk:
        """What a hit returns: the chunk, or its section span joined (its id, anchor and headings)."""
        return self.spans.passage(idx)

    def warm(self) -> None:
        """Every chunk's section span and shingles now, not on the first questions that rank it
        (a server does this before it says ready: a new question then costs what a repeated one does)."""
        for i in range(len(self.index.chunks)):
            self.section_span(i)
            self._shingle(i)

    def _prior(self, chunk: Chunk) -> float:
        priors = self.options.source_priors
        prior = priors.get(chunk.source, 1.0)
        if chunk.path.startswith(("blogs/", "docs/_posts/")):
            prior *= priors.get("news", 1.0)
        return prior

    def _shingle(self, idx: int) -> np.ndarray:
        if idx not in self._shingles:
            self._shingles[idx] = shingles(self.index.chunks[idx].text)
        return self._shingles[idx]
