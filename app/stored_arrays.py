"""The learned arrays shipped beside the code (`app/*.npz`: the query and unit adapters, the question
and refusal memories), written so that a reader never sees half a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def save_npz(path: Path, **arrays: np.ndarray) -> Path:
    """Compressed, written beside itself and renamed into place."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)  # type: ignore[arg-type]
    tmp.replace(path)
    return path
