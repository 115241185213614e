"""The engine every front end and evaluation shares: the loaded index, the model and a retriever.

`load_engine` lives here, below the HTTP layer, so evaluation, benchmarks, the CLI and MCP can
search without importing FastAPI.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TypeVar

import httpx
from threadpoolctl import threadpool_limits

from app.answer import load_unit_model, warm_units
from app.batching import BatchingEmbedder
from app.catalogue_match import warm_catalogue
from app.coverage import load_abstention
from app.errors import IndexNotReady
from app.glossary import Glossary
from app.linear_model import LinearModel
from app.llm_client import LlmClient
from app.query_adapter import ADAPTER_FILE, UNIT_ADAPTER_FILE, QueryAdapter, load_query_adapter
from app.question_memory import ChunkMemory, chunk_key, load_question_memory
from app.ranking import load_ranker
from app.refusal_memory import RefusalMemory, load_refusal_memory
from app.retriever import HybridRetriever, RetrievalOptions, Retriever
from app.settings import Settings
from app.tree_model import TreeModel
from indexer.documents import Snippet
from indexer.embedder import Embedder, make_embedder
from indexer.onnx_encoder import ENCODER_DIR, INT8_FILE, MODEL_FILE, OnnxEmbedder, has_encoder
from indexer.package_source import API_PAGE_PREFIX, key_descriptions, key_facts, key_status
from indexer.snippet_status import FAILS
from indexer.store import IndexError_, LoadedIndex, load_index

log = logging.getLogger(__name__)
T = TypeVar("T")
_Model = TypeVar("_Model", LinearModel, TreeModel)  # a learned part that names the encoder it was trained with

# reasons of a failed static check that mean the installed deepspeed no longer has the feature
_STALE = ("removed", "missing in deepspeed", "neither one of deepspeed")


@dataclass
class Engine:
    """What a loaded service holds: settings, the index and a retriever over it."""

    settings: Settings
    index: LoadedIndex | None
    retriever: Retriever | None
    problem: str = ""  # why the index is not loaded, when it is not
    glossary: Glossary | None = None  # Chinese -> English terms (the answer names the ones it used)
    llm: LlmClient | None = None  # the generation endpoint, when DSQA_LLM_URL is set
    unit_model: TreeModel | None = None  # the learned choice of answer units (`app/answer.py`)
    unit_adapter: QueryAdapter | None = None  # moves the searched vector toward answering units (with unit_model only)

    def require(self) -> tuple[LoadedIndex, Retriever]:
        if self.index is None or self.retriever is None:
            raise IndexNotReady(self.problem or "the index is not loaded yet; build it with `dsqa index` or wait for start-up")
        return self.index, self.retriever

    def warm(self) -> None:
        """What the first questions would compute for the chunks they rank and the units they quote,
        computed now: a server calls it before it says ready (about a second on 2 cores)."""
        if self.index is None:
            return
        if isinstance(self.retriever, HybridRetriever):
            self.retriever.warm()
            if isinstance(self.retriever.embedder, BatchingEmbedder):
                self.retriever.embedder.warm()
        warm_units(u.text for units in self.index.units for u in units)
        _ = self.config_facts, self.config_docs, self.config_top_keys
        warm_catalogue(self.index.path)  # a pasted error's raising line (`coverage_overrides.raised_message_line`)

    def _read_config(self, read: Callable[[str], dict[str, T]]) -> dict[str, T]:
        """One reading of every config passage of the index, merged by key."""
        out: dict[str, T] = {}
        for chunk in self.index.chunks if self.index is not None else ():
            if chunk.source == "config":
                out.update(read(chunk.text))
        return out

    @cached_property
    def config_facts(self) -> dict[str, tuple[str, str]]:
        """Config key -> (type, default), read from the index's config passages (computed once)."""
        return self._read_config(key_facts)

    @cached_property
    def config_top_keys(self) -> frozenset[str]:
        """The config's top-level keys (`zero_optimization`, `train_batch_size`, ...): what a pasted config holds."""
        return frozenset(k.split(".", 1)[0] for k in self.config_facts)

    @cached_property
    def config_docs(self) -> dict[str, str]:
        """Config key -> what its config passage says it does (computed once)."""
        return self._read_config(key_descriptions)

    @cached_property
    def config_status(self) -> dict[str, str]:
        """Config key -> the installed deepspeed's word on it when deprecated or removed (computed once)."""
        return self._read_config(key_status)

    @cached_property
    def api_pages(self) -> dict[str, str]:
        """API symbol (dotted path) -> the path of its API page in the index (computed once)."""
        chunks = self.index.chunks if self.index is not None else ()
        return {c.path.removeprefix(API_PAGE_PREFIX): c.path for c in chunks if c.source == "api" and c.path.startswith(API_PAGE_PREFIX)}

    @cached_property
    def api_sections(self) -> dict[str, tuple[int, ...]]:
        """API symbol (dotted path: a function's, a class's or a method's section heading) -> its chunks in the
        index, in reading order (computed once)."""
        sections: dict[str, list[int]] = {}
        for i, c in enumerate(self.index.chunks if self.index is not None else ()):
            if c.source == "api" and c.path.startswith(API_PAGE_PREFIX) and "." in c.heading and " " not in c.heading:
                sections.setdefault(c.heading, []).append(i)
        return {symbol: tuple(rows) for symbol, rows in sections.items()}

    @cached_property
    def page_titles(self) -> dict[str, frozenset[str]]:
        """A docs page's title, or a config section's name (its passage's heading), -> the paths of the pages
        with that title (computed once)."""
        pages: dict[str, set[str]] = {}
        for c in self.index.chunks if self.index is not None else ():
            name = c.title if c.source == "docs" else c.heading if c.source == "config" else ""
            if name:
                pages.setdefault(name, set()).add(c.path)
        return {t: frozenset(p) for t, p in pages.items()}

    @cached_property
    def stale_pages(self) -> dict[str, Snippet]:
        """Page path -> one of its snippets that the installed deepspeed rejects (computed once)."""
        stale: dict[str, Snippet] = {}
        for s in self.index.snippets.values() if self.index is not None else ():
            if s.status == FAILS and any(m in s.reason for m in _STALE):
                stale.setdefault(s.path, s)
        return stale


def retrieval_options(settings: Settings, encoder: str) -> RetrievalOptions:
    """The shipped retrieval choices, with the settings' overrides. The learned models apply only to
    the encoder they were trained with (its cosines are among their inputs); with any other, the
    weighted fusion ranks and the best cosine against the threshold decides coverage."""
    share = settings.bm25_weight / ((settings.bm25_weight + settings.dense_weight) or 1.0)
    ranker = _for_encoder("ranker", load_ranker() if settings.learned_ranking else None, encoder)
    # the coverage decision reads the ranker's scores: it applies only together with the ranker
    abstention = _for_encoder("coverage decision", load_abstention() if settings.learned_abstention else None, encoder)
    # the ranker was trained on the adapted cosines: the adapter applies only together with it
    adapter = query_adapter_for(encoder) if ranker is not None else None
    # the decision was trained with the refusal memory's resemblance: the memory applies only together with it
    refusals = refusal_memory_for(encoder) if abstention is not None and ranker is not None else None
    return RetrievalOptions(
        bm25_share=share,
        depth=settings.candidate_depth,
        ranker=ranker,
        abstention=abstention if ranker is not None else None,
        section_words=settings.passage_words,
        query_adapter=adapter,
        refusal_memory=refusals,
    )


def query_adapter_for(encoder: str, path: Path = ADAPTER_FILE) -> QueryAdapter | None:
    """The shipped query adapter (or the answer's unit adapter) when it was fitted on this encoder's
    vectors, else None."""
    adapter = load_query_adapter(path)
    if adapter is not None and adapter.encoder != encoder:
        log.warning("the adapter %s was trained with %s, not %s: not used", path.name, adapter.encoder or "?", encoder)
        return None
    return adapter


def refusal_memory_for(encoder: str) -> RefusalMemory | None:
    """The shipped refusal memory when its vectors are this encoder's, else None."""
    memory = load_refusal_memory()
    if memory is not None and memory.encoder != encoder:
        log.warning("the refusal memory holds vectors of %s, not %s: not used", memory.encoder or "?", encoder)
        return None
    return memory


def question_memory_for(encoder: str, index: LoadedIndex) -> ChunkMemory | None:
    """The shipped question memory resolved against the index's chunks, when its vectors are this
    encoder's, else None."""
    memory = load_question_memory()
    if memory is None:
        return None
    if memory.encoder != encoder:
        log.warning("the question memory holds vectors of %s, not %s: not used", memory.encoder or "?", encoder)
        return None
    return ChunkMemory(memory, [chunk_key(c.text) for c in index.chunks])


def _for_encoder(name: str, model: _Model | None, encoder: str) -> _Model | None:
    if model is not None and model.encoder != encoder:
        log.warning("the learned %s was trained with %s, not %s: not used", name, model.encoder or "?", encoder)
        return None
    return model


def llm_client(settings: Settings, http: httpx.Client | None = None) -> LlmClient | None:
    if not settings.llm_url:
        return None
    return LlmClient(settings.llm_url, settings.llm_model, api_key=settings.llm_api_key,
                     timeout_s=settings.llm_timeout_s, http=http)


def query_embedder(settings: Settings, index_dir: Path) -> Embedder:
    """The index's ONNX encoder when it has one (no torch at query time; int8 weights when
    `query_encoder` is "onnx-int8"), else the model itself."""
    if settings.query_encoder in ("onnx", "onnx-int8") and settings.embedding_model is None and has_encoder(index_dir):
        folder = index_dir / ENCODER_DIR
        model_file = INT8_FILE if settings.query_encoder == "onnx-int8" and (folder / INT8_FILE).is_file() else MODEL_FILE
        try:
            return OnnxEmbedder(folder, threads=settings.encoder_threads, model_file=model_file)
        except Exception as exc:  # noqa: BLE001 - onnxruntime missing or the file unreadable: torch still answers
            log.warning("the ONNX query encoder did not load (%s): using sentence-transformers", exc)
    return make_embedder(settings.embedding_model)


def parallel_encoder(embedder: OnnxEmbedder) -> OnnxEmbedder | None:
    """A second session of the ONNX query encoder on one intra-op thread, for the batcher's lanes to
    encode concurrent questions side by side (about 95 MB more resident; made by the batcher when the
    server warms up or two questions first meet); None when it does not load."""
    try:
        return OnnxEmbedder(embedder.folder, threads=1, model_file=embedder.model_file)
    except Exception as exc:  # noqa: BLE001 - the main session still answers them all
        log.warning("the second ONNX session for concurrent questions did not load (%s): they share the main one", exc)
        return None


def load_engine(settings: Settings, embedder: Embedder | None = None, llm_http: httpx.Client | None = None,
                *, strict: bool = False) -> Engine:
    """Load the index and the model; an unusable index gives an engine that is not ready (with
    `strict`, IndexError_ is raised instead). `llm_http`: the client the generation endpoint is
    called with (tests pass a mock transport)."""
    try:
        index = load_index(settings.index_dir)
    except IndexError_ as exc:
        if strict:
            raise
        log.error("index not loaded: %s", exc)
        return Engine(settings=settings, index=None, retriever=None, problem=str(exc))
    # the query path multiplies small matrices: OpenBLAS threads that spin after each product would
    # take the cores from the encoder (measured: 108 ms per query embedding instead of 20 on 2 cores)
    threadpool_limits(1, user_api="blas")
    if embedder is None:
        embedder = query_embedder(settings, index.path)
        if settings.batch_queries:
            # lanes with two or more of them and the ONNX encoder; the torch encoder keeps its batches
            main = embedder
            parallel = (lambda: parallel_encoder(main)) if settings.encoder_lanes >= 2 and isinstance(main, OnnxEmbedder) else None
            embedder = BatchingEmbedder(main, max_cached=settings.query_cache_size, lanes=settings.encoder_lanes, parallel=parallel)
    if index.manifest.get("model") != embedder.name:
        problem = f"index at {settings.index_dir} was built with {index.manifest.get('model')}, the service loads {embedder.name}: rebuild it"
        if strict:
            raise IndexError_(problem)
        log.error("index not loaded: %s", problem)
        return Engine(settings=settings, index=None, retriever=None, problem=problem)
    glossary = Glossary.load(settings.glossary)
    retriever = HybridRetriever(
        index,
        embedder,
        glossary,
        retrieval_options(settings, embedder.name),
    )
    if retriever.options.ranker is not None:
        # the ranker was trained with the memory's `seen` feature: the memory applies only together with it
        memory = question_memory_for(embedder.name, index)
        if memory is not None:
            retriever = retriever.with_options(question_memory=memory)
        _ = retriever.feature_table  # the ranker's per-chunk terms and arrays: built at load, not on the first question
    unit_model = _for_encoder("answer unit scorer", load_unit_model() if settings.learned_answer else None, embedder.name)
    # the unit scorer was trained on the unit adapter's cosines: the adapter applies only together with it
    unit_adapter = query_adapter_for(embedder.name, UNIT_ADAPTER_FILE) if unit_model is not None else None
    return Engine(settings=settings, index=index, retriever=retriever, glossary=glossary, llm=llm_client(settings, llm_http),
                  unit_model=unit_model, unit_adapter=unit_adapter)
