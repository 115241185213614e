"""Index build and atomic store, and `corpus fetch` against a local HTTP server."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from indexer.build import build_index
from indexer.embedder import (
    HashEmbedder,
    SentenceTransformerEmbedder,
    VectorCache,
    cpu_has_native_bf16,
    embed_with_cache,
)
from indexer.fetch import FetchError, current_docs_dir, fetch_docs
from indexer.store import IndexError_, load_index
from indexer.tokenize import chunk_term_sets


def test_bf16_is_used_only_where_the_cpu_has_it_natively(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    assert not cpu_has_native_bf16(info)  # AVX-512 without its bf16 unit: emulated bf16 is slower than fp32
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_tile\n")
    assert cpu_has_native_bf16(info)
    info.write_text("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert cpu_has_native_bf16(info)
    assert not cpu_has_native_bf16(tmp_path / "absent")
    assert SentenceTransformerEmbedder().bf16 is False  # queries and tests: fp32 unless the build asks
    auto = SentenceTransformerEmbedder(bf16=None)
    auto._precision()
    assert auto.bf16 is cpu_has_native_bf16()


def test_build_writes_manifest_and_reuses_vectors(tiny_docs: Path, tmp_path: Path) -> None:
    emb = HashEmbedder()
    out, cache = tmp_path / "index", tmp_path / "cache"
    first = build_index(out, emb, docs_dir=tiny_docs, notes_dir=None, cache_dir=cache, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"] == "hash-64" and manifest["dimension"] == 64
    assert manifest["counts"]["chunks"] == first.chunks > 0
    assert manifest["deepspeed_version"] and manifest["checksums"]["chunks.jsonl"]
    assert {"docs", "api", "config"} <= set(manifest["counts"]["by_source"])
    second = build_index(out, emb, docs_dir=tiny_docs, notes_dir=None, cache_dir=cache, progress=False)
    assert second.embedded == 0  # everything came from the vector cache
    idx = load_index(out)
    assert idx.terms is not None  # the ranker's term sets are stored, not tokenized again on every load
    assert [idx.terms[i] for i in range(len(idx.chunks))] == [chunk_term_sets(c.text, c.trail) for c in idx.chunks]
    assert len(idx.chunks) == first.chunks and idx.vectors.ntotal == first.chunks
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".index")]  # no temp dirs left
    # the installed API's keyword arguments are stored (the search asks them without importing deepspeed)
    assert idx.signatures.unaccepted("deepspeed.initialize", "seed") is not None
    assert idx.signatures.unaccepted("deepspeed.initialize", "config") is None
    (out / "signatures.json").unlink()  # an index built before the table: nothing is judged, nothing fails
    _recheck(out, drop="signatures.json")
    assert load_index(out).signatures.unaccepted("deepspeed.initialize", "seed") is None


def test_vector_cache_keeps_vectors_writes_only_news_and_reads_the_old_layout(tmp_path: Path) -> None:
    cache = VectorCache(tmp_path, "m")
    a, b = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    cache.put("a", a)
    cache.save()
    stamp = cache.path.stat().st_mtime_ns
    again = VectorCache(tmp_path, "m")
    assert np.array_equal(again.get("a"), a) and again.get("b") is None
    again.save()  # nothing added: the file is not rewritten
    assert cache.path.stat().st_mtime_ns == stamp
    again.put("b", b)
    again.save()
    third = VectorCache(tmp_path, "m")
    assert np.array_equal(third.get("a"), a) and np.array_equal(third.get("b"), b)
    np.savez(tmp_path / "vectors-old.npz", x=a, y=b)  # the layout before: one array per key
    old = VectorCache(tmp_path, "old")
    assert np.array_equal(old.get("y"), b)
    old.save()
    assert np.array_equal(VectorCache(tmp_path, "old").get("x"), a)
    (tmp_path / "vectors-bad.npz").write_bytes(b"not a zip")
    assert VectorCache(tmp_path, "bad").get("a") is None  # unreadable: ignored, rebuilt


def test_a_recurring_text_is_embedded_once(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    class Counting(HashEmbedder):
        def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
            seen.append(list(texts))
            return super().embed(texts)

    emb = Counting()
    texts = ["same sentence", "other one", "same sentence"]
    vectors, embedded = embed_with_cache(emb, texts, ["k1", "k2", "k1"], VectorCache(tmp_path, emb.name))
    assert embedded == 2 and seen == [["same sentence", "other one"]]
    assert np.array_equal(vectors[0], vectors[2]) and np.array_equal(vectors, emb.embed(texts))


def test_failed_build_keeps_previous_index(tiny_docs: Path, tmp_path: Path) -> None:
    out = tmp_path / "index"
    build_index(out, HashEmbedder(), docs_dir=tiny_docs, notes_dir=None, cache_dir=None, progress=False)
    before = (out / "manifest.json").read_text()

    class Broken(HashEmbedder):
        def embed(self, texts, *, batch_size=32, progress=False):  # type: ignore[no-untyped-def]
            raise RuntimeError("model crashed mid-build")

    with pytest.raises(RuntimeError):
        build_index(out, Broken(), docs_dir=tiny_docs, notes_dir=None, cache_dir=None, progress=False)
    assert (out / "manifest.json").read_text() == before
    load_index(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DeepSpeed", "index"]  # no temp dir left


def test_damaged_index_is_refused(tiny_docs: Path, tmp_path: Path) -> None:
    out = tmp_path / "index"
    build_index(out, HashEmbedder(), docs_dir=tiny_docs, notes_dir=None, cache_dir=None, progress=False)
    with (out / "chunks.jsonl").open("a") as f:
        f.write("{}\n")
    with pytest.raises(IndexError_, match="damaged"):
        load_index(out)
    with pytest.raises(IndexError_, match="manifest.json is missing"):
        load_index(tmp_path / "nowhere")


def _rewrite_manifest(out: Path, **changes: object) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    for key, value in changes.items():
        if value is None:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    (out / "manifest.json").write_text(json.dumps(manifest))


def _recheck(out: Path, drop: str = "") -> None:
    """Recompute the checksums, as a careless hand edit of the manifest would (`drop`: a file removed)."""
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["checksums"] = {rel: hashlib.sha256((out / rel).read_bytes()).hexdigest() for rel in manifest["checksums"] if rel != drop}
    (out / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("no-checksums", "manifest.json has no checksums"),
        ("half-the-chunks", "chunks.jsonl is missing or changed"),
        ("half-the-chunks-rechecked", "vectors for "),  # the vectors no longer match the chunks
        ("dimension", "the manifest says dimension 768"),
        ("truncated-faiss-rechecked", "vectors.faiss cannot be read"),
        ("bad-json-rechecked", "chunks.jsonl cannot be read"),
    ],
)
def test_every_damaged_index_is_refused_with_one_line(tiny_docs: Path, tmp_path: Path, damage: str, message: str) -> None:
    out = tmp_path / "index"
    build_index(out, HashEmbedder(), docs_dir=tiny_docs, notes_dir=None, cache_dir=None, progress=False)
    if damage == "no-checksums":
        _rewrite_manifest(out, checksums=None)
    elif damage.startswith("half-the-chunks"):
        lines = (out / "chunks.jsonl").read_text().splitlines(keepends=True)
        (out / "chunks.jsonl").write_text("".join(lines[: len(lines) // 2]))
    elif damage == "dimension":
        _rewrite_manifest(out, dimension=768)
    elif damage.startswith("truncated-faiss"):
        data = (out / "vectors.faiss").read_bytes()
        (out / "vectors.faiss").write_bytes(data[: len(data) // 3])
    elif damage.startswith("bad-json"):
        with (out / "chunks.jsonl").open("a") as f:
            f.write("{not json\n")
    if damage.endswith("rechecked"):
        _recheck(out)
    with pytest.raises(IndexError_) as caught:
        load_index(out)
    text = str(caught.value)
    assert message in text and "\n" not in text and text.endswith("rebuild it")
    env = {**os.environ, "DSQA_INDEX_DIR": str(out), "DSQA_EMBEDDING_MODEL": "hash-64"}
    serve = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--port", "9"], env=env, capture_output=True, text=True, timeout=120)
    assert serve.returncode == 3 and serve.stderr.strip().startswith("dsqa: index at") and "Traceback" not in serve.stderr


def test_a_build_killed_between_the_two_renames_is_recovered(tiny_docs: Path, tmp_path: Path) -> None:
    out = tmp_path / "index"
    build_index(out, HashEmbedder(), docs_dir=tiny_docs, notes_dir=None, cache_dir=None, progress=False)
    chunks = (out / "chunks.jsonl").read_text()
    # the state a kill leaves after `index -> .index.old-PID` and before `.building -> index`
    dead_pid = 2**22 + 17
    os.replace(out, tmp_path / f".index.old-{dead_pid}")
    (tmp_path / f".index.building-{dead_pid}-abc").mkdir()
    assert load_index(out).chunks and (out / "chunks.jsonl").read_text() == chunks  # the previous index is back
    build_index(out, HashEmbedder(), docs_dir=tiny_docs, notes_dir=None, cache_dir=None, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".index")) == []  # leftovers removed


def _tarball(docs: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for sub in ["docs", "blogs", "README.md"]:
            if (docs / sub).exists():
                tar.add(docs / sub, arcname=f"DeepSpeed-0.19.8/{sub}")
        extra = b"print('not docs')\n"
        info = tarfile.TarInfo("DeepSpeed-0.19.8/setup.py")
        info.size = len(extra)
        tar.addfile(info, io.BytesIO(extra))
    return buf.getvalue()


@pytest.fixture(scope="module")
def tarball_server(real_docs: Path) -> Iterator[tuple[str, bytes]]:
    body = _tarball(real_docs)
    hits: dict[str, int] = {"flaky": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            if self.path.endswith("/v0.19.8"):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path.endswith("/truncated"):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
            elif self.path.endswith("/flaky"):
                hits["flaky"] += 1
                if hits["flaky"] < 2:
                    self.send_response(503)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_response(404)
                self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/tar/{{ref}}", body
    server.shutdown()


def test_fetch_extracts_only_docs_and_sets_default(tarball_server: tuple[str, bytes], tmp_path: Path) -> None:
    url, body = tarball_server
    digest = hashlib.sha256(body).hexdigest()
    result = fetch_docs(tmp_path, "v0.19.8", url, sha256=digest, progress=False)
    assert result.sha256 == digest and not result.from_cache
    assert (result.docs_dir / "docs/_tutorials/zero.md").is_file()
    assert not (result.docs_dir / "setup.py").exists()
    assert current_docs_dir(tmp_path) == result.docs_dir
    again = fetch_docs(tmp_path, "v0.19.8", url, progress=False)
    assert again.from_cache


def test_partial_download_leaves_no_cache(tarball_server: tuple[str, bytes], tmp_path: Path) -> None:
    url, _ = tarball_server
    with pytest.raises(FetchError):
        fetch_docs(tmp_path, "truncated", url, progress=False, retries=2)
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert leftovers == [] and current_docs_dir(tmp_path) is None


def test_fetch_errors_are_clear(tarball_server: tuple[str, bytes], tmp_path: Path) -> None:
    url, _ = tarball_server
    with pytest.raises(FetchError, match="404"):
        fetch_docs(tmp_path, "v9.9.9", url, progress=False)
    with pytest.raises(FetchError, match="checksum mismatch"):
        fetch_docs(tmp_path, "v0.19.8", url, sha256="0" * 64, progress=False)
    assert current_docs_dir(tmp_path) is None
    assert fetch_docs(tmp_path, "flaky", url, progress=False, retries=3).bytes > 0  # retried after a 503


def test_rebuild_keeps_verification_runs_of_unchanged_snippets(tiny_docs: Path, tmp_path: Path) -> None:
    out = tmp_path / "index"
    build_index(out, HashEmbedder(), docs_dir=tiny_docs, notes_dir=None, cache_dir=None, progress=False)
    ids = list(load_index(out).snippets)
    rows = [{"id": ids[0], "status": "passed", "device": "cpu"}, {"id": "gone-snippet", "status": "failed"}]
    (out / "verification.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_index(out, HashEmbedder(), docs_dir=tiny_docs, notes_dir=None, cache_dir=None, progress=False)
    assert set(load_index(out).verification) == {ids[0]}


def test_serve_refuses_an_index_of_another_model_with_one_line(tiny_docs: Path, tmp_path: Path) -> None:
    out = tmp_path / "index"
    build_index(out, HashEmbedder(), docs_dir=tiny_docs, notes_dir=None, cache_dir=None, progress=False)
    env = {**os.environ, "DSQA_INDEX_DIR": str(out)}  # the service loads the real model
    env.pop("DSQA_EMBEDDING_MODEL", None)
    serve = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--port", "9"], env=env, capture_output=True, text=True, timeout=180)
    assert serve.returncode == 3 and "was built with hash-64" in serve.stderr and "Traceback" not in serve.stderr
