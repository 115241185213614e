"""Build the index: read every source, chunk, embed (with the vector cache) and write it."""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from indexer.api_signatures import SIGNATURES_FILE, write_signatures
from indexer.chunker import ChunkBudget, chunk_document
from indexer.config_catalogue import deepspeed_version
from indexer.docs_source import find_docs_root, read_docs_dir, read_notes_dir
from indexer.documents import Chunk, Document, Snippet, content_hash
from indexer.embedder import Embedder, VectorCache, embed_with_cache
from indexer.error_catalogue import (
    CATALOGUE_VERSION,
    ERRORS_FILE,
    build_error_catalogue,
    write_error_catalogue,
)
from indexer.onnx_encoder import (
    ENCODER_DIR,
    INT8_FILE,
    MODEL_FILE,
    OnnxEmbedder,
    export_encoder,
    is_encoder_folder,
    quantize_encoder,
)
from indexer.onnx_graph import simplify_encoder
from indexer.package_source import api_signatures, documented_symbols, read_api_docs, read_config_catalogue
from indexer.snippet_check import check_snippet
from indexer.store import write_index
from indexer.text_units import unit_table

log = logging.getLogger(__name__)


@dataclass
class BuildReport:
    path: Path
    chunks: int
    snippets: int
    embedded: int
    seconds: float
    by_source: dict[str, int]
    missing: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "chunks": self.chunks,
            "snippets": self.snippets,
            "embedded": self.embedded,
            "seconds": round(self.seconds, 1),
            "by_source": self.by_source,
            "missing": self.missing,
        }


def gather_documents(docs_dir: Path | None, notes_dir: Path | None, include_package: bool = True) -> tuple[list[Document], list[str], Path | None]:
    """All source documents, plus plain sentences about what is missing."""
    documents: list[Document] = []
    missing: list[str] = []
    root: Path | None = None
    if docs_dir is not None:
        root = find_docs_root(docs_dir)
        documents += read_docs_dir(root)
    else:
        missing.append(
            "DeepSpeed's docs are not indexed: run `dsqa corpus fetch` (needs network) or set "
            "DSQA_DOCS_DIR to a DeepSpeed checkout, then rebuild with `dsqa index`."
        )
    if include_package:
        documents += read_api_docs(root)
        documents += read_config_catalogue(root)
    if notes_dir is not None:
        documents += read_notes_dir(notes_dir)
    return documents, missing, root


def chunk_all(documents: list[Document], budget: ChunkBudget | None = None) -> tuple[list[Chunk], list[Snippet]]:
    budget = budget or ChunkBudget()
    chunks: list[Chunk] = []
    snippets: dict[str, Snippet] = {}
    seen: set[str] = set()
    for doc in documents:
        doc_chunks, doc_snippets = chunk_document(doc, budget)
        for c in doc_chunks:
            if c.id not in seen:
                seen.add(c.id)
                chunks.append(c)
        for s in doc_snippets:
            snippets.setdefault(s.id, s)
    return chunks, list(snippets.values())


def error_catalogue(cache_dir: Path | None) -> Path | None:
    """The installed deepspeed's error catalogue, built once per version into the cache (None
    without a cache dir: test indexes; the doctor then builds it on first use)."""
    if cache_dir is None:
        return None
    file = cache_dir / f"errors-{deepspeed_version()}-v{CATALOGUE_VERSION}.jsonl"
    if not file.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(".tmp")
        write_error_catalogue(tmp, build_error_catalogue())
        tmp.replace(file)
    return file


def query_encoder(embedder: Embedder, cache_dir: Path | None) -> Path | None:
    """The embedder exported to ONNX for the torch-free query path (once per model, kept in the
    cache); None for an embedder that cannot be exported (the test fake) or when export fails."""
    model_path = getattr(embedder, "path", None)
    if model_path is None:
        return None
    folder = (cache_dir or Path(tempfile.gettempdir())) / f"encoder-{re.sub(r'[^A-Za-z0-9_.-]', '_', embedder.name)}"
    if is_encoder_folder(folder):  # exported by an earlier build
        try:
            if simplify_encoder(folder / MODEL_FILE):  # a folder exported before the graph was simplified
                (folder / INT8_FILE).unlink(missing_ok=True)  # quantized from the graph as it was
            quantize_encoder(folder)  # a folder cached before the int8 encoder existed
        except Exception as exc:  # noqa: BLE001 - the full-precision encoder still answers
            log.warning("could not quantize the query encoder (%s): queries will use the full-precision one", exc)
        return folder
    try:
        return export_encoder(model_path, folder, embedder.name, embedder.dimension)
    except Exception as exc:  # noqa: BLE001 - the index still works with the torch encoder
        log.warning("could not export the query encoder to ONNX (%s): queries will use torch", exc)
        shutil.rmtree(folder, ignore_errors=True)
        return None


def export_embedder(folder: Path | None, embedder: Embedder) -> Embedder | None:
    """The model's full-precision ONNX export as an embedder of a few new texts (vectors within 2e-7
    of the torch model's), or None when there is no export of this model."""
    if folder is None:
        return None
    try:
        onnx = OnnxEmbedder(folder, threads=2)
    except Exception as exc:  # noqa: BLE001 - the torch model embeds instead
        log.warning("could not load the exported encoder (%s): new texts go through torch", exc)
        return None
    return onnx if (onnx.name, onnx.dimension) == (embedder.name, embedder.dimension) else None


def build_index(
    out: Path,
    embedder: Embedder,
    *,
    docs_dir: Path | None,
    notes_dir: Path | None,
    cache_dir: Path | None,
    docs_ref: str | None = None,
    progress: bool = True,
    batch_size: int = 16,
) -> BuildReport:
    start = time.perf_counter()
    documents, missing, root = gather_documents(docs_dir, notes_dir)
    chunks, snippets = chunk_all(documents)
    snippets = [check_snippet(s) for s in snippets]
    if not chunks:
        raise ValueError("nothing to index: no documents were read")
    cache = VectorCache(cache_dir, embedder.name) if cache_dir is not None else None
    encoder = query_encoder(embedder, cache_dir)
    few = export_embedder(encoder, embedder)
    texts = [c.search_text for c in chunks]
    vectors, embedded = embed_with_cache(embedder, texts, [c.id for c in chunks], cache, progress=progress, few=few, batch_size=batch_size)
    units, offsets = unit_table(chunks)
    unit_texts = [u.text for chunk_units in units for u in chunk_units]
    keys = [content_hash("unit", t) for t in unit_texts]
    unit_vectors, embedded_units = embed_with_cache(embedder, unit_texts, keys, cache, progress=progress, few=few, batch_size=batch_size)
    embedded += embedded_units
    if cache is not None:
        cache.save()
    by_source = dict(Counter(c.source for c in chunks))
    seconds = time.perf_counter() - start
    manifest = {
        "model": embedder.name,
        "deepspeed_version": deepspeed_version(),
        "docs_ref": docs_ref or (f"dir:{root}" if root else None),
        "docs_dir": str(root) if root else None,
        "counts": {
            "documents": len(documents),
            "chunks": len(chunks),
            "text_units": len(unit_texts),
            "snippets": len(snippets),
            "by_source": by_source,
            "snippets_by_kind": dict(Counter(s.kind for s in snippets)),
            "snippets_by_status": dict(Counter(s.status for s in snippets)),
        },
        "missing": missing,
        "build_seconds": round(seconds, 1),
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if encoder is not None:
        manifest["query_encoder"] = f"onnx ({ENCODER_DIR}/{MODEL_FILE}, int8: {ENCODER_DIR}/{INT8_FILE})"
    errors = error_catalogue(cache_dir)
    if errors is not None:
        manifest["error_catalogue"] = ERRORS_FILE
    with tempfile.TemporaryDirectory() as work:
        signatures = Path(work) / SIGNATURES_FILE  # which keyword arguments the API functions take
        write_signatures(signatures, api_signatures(documented_symbols(root)))
        extra = {SIGNATURES_FILE: signatures} | ({ERRORS_FILE: errors} if errors is not None else {})
        write_index(out, chunks, snippets, vectors, manifest, units=(units, unit_vectors),
                    extra_dirs={ENCODER_DIR: encoder} if encoder else None, extra_files=extra)
    return BuildReport(out, len(chunks), len(snippets), embedded, time.perf_counter() - start, by_source, missing)
