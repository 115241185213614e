"""The index on disk: FAISS vectors, a BM25 index, the chunk and snippet stores and a manifest.

Written into a temporary sibling folder and renamed into place, so a reader never sees a
half-written index and a failed build leaves the previous one untouched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bm25s
import faiss
import numpy as np

from app.errors import IndexUnusable
from indexer.documents import Chunk, Snippet
from indexer.snippet_status import LEDGER, read_ledger, write_ledger_rows
from indexer.text_units import Unit
from indexer.tokenize import tokenize

FORMAT_VERSION = 2  # 2: BM25 tokens carry the words of abbreviated identifier parts; text unit vectors
MANIFEST = "manifest.json"
UNIT_VECTORS = "units.npy"
UNITS = "units.jsonl"  # one line per chunk: its units as [text, block]


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
    ledger_stamp: tuple[int, int] = (0, 0)  # the ledger file's (mtime_ns, size) when last read

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
        self._unit_offsets = np.cumsum([0, *sizes]).astype(np.int64)

    def chunk_units(self, i: int) -> tuple[list[Unit], np.ndarray | None]:
        """A chunk's text units as indexed, with their vectors (None when the index has none)."""
        units = self.units[i] if i < len(self.units) else []
        if self.unit_vectors is None or i >= len(self.units):
            return units, None
        return units, self.unit_vectors[int(self._unit_offsets[i]) : int(self._unit_offsets[i + 1])]

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
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        _write_jsonl(tmp / "chunks.jsonl", [c.to_json() for c in chunks])
        _write_jsonl(tmp / "snippets.jsonl", [s.to_json() for s in snippets])
        index = faiss.IndexFlatIP(int(vectors.shape[1]))
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
        faiss.write_index(index, str(tmp / "vectors.faiss"))
        np.save(tmp / UNIT_VECTORS, np.ascontiguousarray(unit_vectors, dtype=np.float32))
        _write_jsonl(tmp / UNITS, [{"units": [[u.text, u.block] for u in row]} for row in chunk_units])
        bm25 = bm25s.BM25(k1=1.2, b=0.75)
        bm25.index([tokenize(c.search_text) for c in chunks], show_progress=False)
        bm25.save(str(tmp / "bm25"))
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {
            **manifest,
            "format_version": FORMAT_VERSION,
            "dimension": int(vectors.shape[1]),
            "checksums": {p.relative_to(tmp).as_posix(): _sha256(p) for p in files},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False), encoding="utf-8")
        _carry_ledger(out, tmp, {s.id for s in snippets})
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _carry_ledger(old: Path, new: Path, snippet_ids: set[str]) -> None:
    """Keep the verification runs of snippets that are still in the index (ids are content hashes)."""
    if old.is_dir() and read_ledger(old):
        write_ledger_rows(new, list(read_ledger(old).values()), keep=snippet_ids)


def _swap_into_place(tmp: Path, out: Path) -> None:
    old: Path | None = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except OSError:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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


def load_index(path: Path, verify: bool = True) -> LoadedIndex:
    path = Path(path)
    manifest = read_manifest(path)
    if verify:
        for rel, digest in manifest.get("checksums", {}).items():
            file = path / rel
            if not file.is_file() or _sha256(file) != digest:
                raise IndexError_(f"index at {path} is damaged: {rel} is missing or changed; rebuild it")
    with (path / "chunks.jsonl").open(encoding="utf-8") as f:
        chunks = [Chunk.from_json(json.loads(line)) for line in f if line.strip()]
    snippets: dict[str, Snippet] = {}
    with (path / "snippets.jsonl").open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                s = Snippet.from_json(json.loads(line))
                snippets[s.id] = s
    vectors = faiss.read_index(str(path / "vectors.faiss"))
    unit_vectors = np.load(path / UNIT_VECTORS)
    with (path / UNITS).open(encoding="utf-8") as f:
        units = [[Unit(str(t), int(b)) for t, b in json.loads(line)["units"]] for line in f if line.strip()]
    if len(units) != len(chunks) or sum(len(u) for u in units) != len(unit_vectors):
        raise IndexError_(f"index at {path} is damaged: the text units do not match the chunks; rebuild it")
    with contextlib.redirect_stdout(None):
        bm25 = bm25s.BM25.load(str(path / "bm25"))
    return LoadedIndex(
        path=path, manifest=manifest, chunks=chunks, snippets=snippets, vectors=vectors, bm25=bm25,
        verification=read_ledger(path), units=units, unit_vectors=unit_vectors,
    )
