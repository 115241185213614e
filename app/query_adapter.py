"""A learned correction of the query vector: the encoder's vector of a question, moved toward the
passages that answer such questions in these docs.

The base MiniLM was trained on web pairs; DeepSpeed users ask in symptoms ("hangs after a few hundred
steps", "the saved model is 900 KB") while the docs answer in mechanisms. A linear map fitted on the
`tune` split (`eval/adapter_training.py`, `dsqa eval train-adapter`) learns that shift: the adapted
query is `normalise(q + q @ delta)`, with `delta` kept small by an L2 penalty so that an unseen
question stays close to its base vector. Only the query side changes: the stored passage and unit
vectors and the dense peer keep the base encoder; the adapted vector is searched with and scores the
units the answer quotes. Pure numpy at query time
(one 384 x 384 product, ~0.05 ms). Shipped in `app/query_adapter.npz`, for the encoder it was
trained with only.

A second adapter of the same form, `app/unit_adapter.npz`, moves the searched vector once more, within
the passages found, toward the units that hold the answer (`eval/unit_adapter_training.py`); the answer's
unit scorer reads its cosines and applies only together with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.stored_arrays import save_npz

ADAPTER_FILE = Path(__file__).resolve().parent / "query_adapter.npz"
UNIT_ADAPTER_FILE = Path(__file__).resolve().parent / "unit_adapter.npz"


@dataclass(frozen=True)
class QueryAdapter:
    delta: np.ndarray  # (dimension, dimension)
    encoder: str  # the encoder whose query vectors it was fitted on
    trained_on: str = ""

    @property
    def dimension(self) -> int:
        return int(self.delta.shape[0])

    def apply(self, vectors: np.ndarray) -> np.ndarray:
        """The adapted, unit-length vector(s) of one vector or a batch."""
        v = np.asarray(vectors, dtype=np.float32)
        moved = v + v @ self.delta
        norms = np.linalg.norm(moved, axis=-1, keepdims=True)
        return (moved / np.maximum(norms, 1e-12)).astype(np.float32)

    def save(self, path: Path) -> Path:
        """Written beside itself and renamed into place, so a reader never sees half a file."""
        return save_npz(path, delta=self.delta.astype(np.float16), encoder=np.array(self.encoder),
                        trained_on=np.array(self.trained_on))


def load_query_adapter(path: Path = ADAPTER_FILE) -> QueryAdapter | None:
    """The shipped adapter, or None without the file."""
    if not Path(path).is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        delta = data["delta"].astype(np.float32)
        if delta.ndim != 2 or delta.shape[0] != delta.shape[1] or not np.isfinite(delta).all():
            raise ValueError(f"{path}: the query adapter is not a finite square matrix: retrain it")
        return QueryAdapter(delta, str(data["encoder"]), str(data["trained_on"]))
