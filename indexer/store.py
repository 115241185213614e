"""The index on disk: FAISS vectors, a BM25 index, the chunk and snippet stores and a manifest.

Written into a temporary sibling folder and renamed into place, so a reader never sees a
half-written index and a failed build leaves the previous one untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bm25s
import faiss
import numpy as np

from app.errors import IndexUnusable
from indexer.api_signatures import SIGNATURES_FILE, ApiSignatures
from indexer.documents import Chunk, Snippet
from indexer.index_folder import MANIFEST, index_present, recover_swap, remove_stale_builds, swap_into_place  # noqa: F401 - re-exported
from indexer.quiet import captured
from indexer.snippet_status import LEDGER, read_ledger, write_ledger_rows
from indexer.text_units import Unit
from indexer.tokenize import chunk_term_sets, tokenize

FORMAT_VERSION = 2  # 2: BM25 tokens carry the words of abbreviated identifier parts; text unit vectors
UNIT_VECTORS = "units.npy"
UNITS = "units.jsonl"  # one line per chunk: its units as [text, block]
TERMS = "terms.jsonl"  # one line per chunk: the distinct tokens of its text and of its heading trail


class IndexError_(IndexUnusable):
    """The index folder is missing, incomplete or of another format."""


@dataclass
class LoadedIndex:
    path: Path
    manifest: dict[str, Any]
    chunks: list[Chunk]
    snippets: dict[str, Snippet]
    vectors: faiss.Index
    bm25: bm25s.BM25
    by_id: dict[str, int] = field(default_factory=dict)
    verification: dict[str, dict[str, Any]] = field(default_factory=dict)  # snippet id -> latest run
    units: list[list[Unit]] = field(default_factory=list)  # each chunk's text units (indexer/text_units.py)
    unit_vectors: np.ndarray | None = None  # one row per unit, chunk by chunk
    terms: list[tuple[frozenset[str], frozenset[str]]] | None = None  # per chunk (text, trail) tokens; None: not stored
    ledger_stamp: tuple[int, int] = (0, 0)  # the ledger file's (mtime_ns, size) when last read
    signatures: ApiSignatures = field(default_factory=ApiSignatures)  # the API functions' keyword arguments (empty: an index built before)

    def refresh_verification(self) -> bool:
        """Re-read the ledger when a verify run (in the background, or another process) changed it;
        one stat per call. True when it was re-read."""
        try:
            st = (self.path / LEDGER).stat()
        except OSError:
            return False
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self.ledger_stamp:
            return False
        self.verification = read_ledger(self.path)
        self.ledger_stamp = stamp
        return True

    def __post_init__(self) -> None:
        self.by_id = {c.id: i for i, c in enumerate(self.chunks)}
        sizes = [len(u) for u in self.units]
        self.unit_offsets = np.cumsum([0, *sizes]).astype(np.int64)  # where each chunk's units start in unit_vectors

    def chunk_units(self, i: int) -> tuple[list[Unit], np.ndarray | None]:
        """A chunk's text units as indexed, with their vectors (None when the index has none)."""
        units = self.units[i] if i < len(self.units) else []
        if self.unit_vectors is None or i >= len(self.units):
            return units, None
        return units, self.unit_vectors[int(self.unit_offsets[i]) : int(self.unit_offsets[i + 1])]

    def summary(self) -> dict[str, Any]:
        keys = ("model", "dimension", "deepspeed_version", "docs_ref", "counts", "built_at")
        return {k: self.manifest.get(k) for k in keys}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_index(
    out: Path,
    chunks: list[Chunk],
    snippets: list[Snippet],
    vectors: np.ndarray,
    manifest: dict[str, Any],
    *,
    units: tuple[list[list[Unit]], np.ndarray] | None = None,
    extra_dirs: dict[str, Path] | None = None,
    extra_files: dict[str, Path] | None = None,
) -> Path:
    """Write everything into a temp dir beside `out`, then swap it into place. `units`: each chunk's
    text units and one vector per unit, chunk by chunk."""
    if len(chunks) != len(vectors):
        raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
    if units is None:
        units = ([[] for _ in chunks], np.zeros((0, vectors.shape[1]), dtype=np.float32))
    chunk_units, unit_vectors = units
    if len(chunk_units) != len(chunks) or sum(len(u) for u in chunk_units) != len(unit_vectors):
        raise ValueError("text units do not match the chunks and the unit vectors")
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    recover_swap(out)
    remove_stale_builds(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-{os.getpid()}-", dir=out.parent))
    try:
        _write_jsonl(tmp / "chunks.jsonl", [c.to_json() for c in chunks])
        _write_jsonl(tmp / "snippets.jsonl", [s.to_json() for s in snippets])
        index = faiss.IndexFlatIP(int(vectors.shape[1]))
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
        faiss.write_index(index, str(tmp / "vectors.faiss"))
        np.save(tmp / UNIT_VECTORS, np.ascontiguousarray(unit_vectors, dtype=np.float32))
        _write_jsonl(tmp / UNITS, [{"units": [[u.text, u.block] for u in row]} for row in chunk_units])
        _write_jsonl(tmp / TERMS, [{"text": sorted(text), "trail": sorted(trail)}
                                   for text, trail in (chunk_term_sets(c.text, c.trail) for c in chunks)])
        bm25 = bm25s.BM25(k1=1.2, b=0.75)
        bm25.index([tokenize(c.search_text) for c in chunks], show_progress=False)
        bm25.save(str(tmp / "bm25"))
        for name, source in (extra_dirs or {}).items():  # e.g. the ONNX query encoder: checksummed like the rest
            shutil.copytree(source, tmp / name)
        for name, file in (extra_files or {}).items():  # e.g. the error catalogue
            shutil.copyfile(file, tmp / name)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {
            **manifest,
            "format_version": FORMAT_VERSION,
            "dimension": int(vectors.shape[1]),
            "checksums": {p.relative_to(tmp).as_posix(): _sha256(p) for p in files},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False), encoding="utf-8")
        _carry_ledger(out, tmp, {s.id for s in snippets})
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _carry_ledger(old: Path, new: Path, snippet_ids: set[str]) -> None:
    """Keep the verification runs of snippets that are still in the index (ids are content hashes)."""
    if old.is_dir() and read_ledger(old):
        write_ledger_rows(new, list(read_ledger(old).values()), keep=snippet_ids)


def read_manifest(path: Path) -> dict[str, Any]:
    file = path / MANIFEST
    if not file.is_file():
        raise IndexError_(f"no index at {path}: {MANIFEST} is missing (build one with `dsqa index`)")
    try:
        manifest: dict[str, Any] = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise IndexError_(f"unreadable {file}: {exc}") from exc
    if manifest.get("format_version") != FORMAT_VERSION:
        raise IndexError_(f"index at {path} has format {manifest.get('format_version')}, expected {FORMAT_VERSION}: rebuild it")
    return manifest


def check_index(path: Path) -> dict[str, Any]:
    """The manifest of a whole index; raises IndexError_ naming the file and the problem when there
    is none or it is damaged: a manifest without checksums, a file missing or changed."""
    path = Path(path)
    recover_swap(path)
    manifest = read_manifest(path)
    checksums = manifest.get("checksums")
    if not isinstance(checksums, dict) or not checksums:
        raise IndexError_(f"index at {path} is damaged: {MANIFEST} has no checksums; rebuild it")
    for rel, digest in checksums.items():
        file = path / rel
        if not file.is_file() or _sha256(file) != digest:
            raise IndexError_(f"index at {path} is damaged: {rel} is missing or changed; rebuild it")
    return manifest


def _read(path: Path, rel: str, reader: Any) -> Any:
    """One index file read, any failure as IndexError_ naming the file."""
    try:
        return reader(path / rel)
    except IndexError_:
        raise
    except Exception as exc:  # noqa: BLE001 - a truncated or garbled file, whatever the library raises
        raise IndexError_(f"index at {path} is damaged: {rel} cannot be read ({type(exc).__name__}: {str(exc)[:120]}); rebuild it") from exc


def _jsonl(file: Path) -> list[dict[str, Any]]:
    with file.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _terms(file: Path) -> list[tuple[frozenset[str], frozenset[str]]]:
    # each term once in memory (interned), not once per chunk that holds it: ~10 MB less a worker
    return [(frozenset(map(sys.intern, row["text"])), frozenset(map(sys.intern, row["trail"]))) for row in _jsonl(file)]


def _bm25(file: Path) -> bm25s.BM25:
    with captured():
        return bm25s.BM25.load(str(file))


def load_index(path: Path, verify: bool = True) -> LoadedIndex:
    path = Path(path)
    manifest = check_index(path) if verify else read_manifest(path)
    chunks: list[Chunk] = _read(path, "chunks.jsonl", lambda f: [Chunk.from_json(row) for row in _jsonl(f)])
    snippets: dict[str, Snippet] = {s.id: s for s in _read(path, "snippets.jsonl", lambda f: [Snippet.from_json(r) for r in _jsonl(f)])}
    vectors = _read(path, "vectors.faiss", lambda f: faiss.read_index(str(f)))
    # memory-mapped, read-only: the workers of one server share its pages (the index is replaced as a
    # whole by a rebuild, never written in place); held as a plain array over the mapping, since indexing
    # an np.memmap costs its subclass hooks on every slice (0.3 ms a query)
    unit_vectors = _read(path, UNIT_VECTORS, lambda f: np.asarray(np.load(f, mmap_mode="r")))
    units = _read(path, UNITS, lambda f: [[Unit(str(t), int(b)) for t, b in row["units"]] for row in _jsonl(f)])
    terms = _read(path, TERMS, _terms) if (path / TERMS).is_file() else None  # an index built before: tokenized on load
    counted = (manifest.get("counts") or {}).get("chunks")
    problems = [
        (vectors.ntotal != len(chunks), f"vectors.faiss holds {vectors.ntotal} vectors for {len(chunks)} chunks"),
        (vectors.d != manifest.get("dimension"), f"the manifest says dimension {manifest.get('dimension')}, the vectors have {vectors.d}"),
        (counted is not None and counted != len(chunks), f"the manifest counts {counted} chunks, chunks.jsonl holds {len(chunks)}"),
        (len(units) != len(chunks) or sum(len(u) for u in units) != len(unit_vectors), "the text units do not match the chunks"),
        (terms is not None and len(terms) != len(chunks), f"{TERMS} holds {len(terms or [])} rows for {len(chunks)} chunks"),
    ]
    for bad, what in problems:
        if bad:
            raise IndexError_(f"index at {path} is damaged: {what}; rebuild it")
    bm25 = _read(path, "bm25", _bm25)
    return LoadedIndex(
        path=path, manifest=manifest, chunks=chunks, snippets=snippets, vectors=vectors, bm25=bm25,
        verification=read_ledger(path), units=units, unit_vectors=unit_vectors, terms=terms,
        signatures=_read(path, SIGNATURES_FILE, ApiSignatures.read),
    )
