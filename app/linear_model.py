"""A linear model over named, standardised features, stored as JSON beside the code: the learned
re-ranking (`app/ranker.json`) and the coverage decision (`app/abstention.json`) are both one.
The stored feature names must equal the code's, so a model never scores the wrong columns."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class LinearModel:
    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: float
    trained_on: str = ""
    threshold: float = 0.0  # for a decision: scores at or above it say yes
    encoder: str = ""  # the embedding model whose cosines it was trained on
    group_thresholds: dict[str, float] = field(default_factory=dict)  # a decision's own threshold for a group of inputs

    def threshold_for(self, group: str) -> float:
        """The threshold of `group` ("" or one the model has none for: the model's one threshold)."""
        return self.group_thresholds.get(group, self.threshold)

    def score(self, rows: np.ndarray) -> np.ndarray:
        """A missing feature (NaN) counts as its training mean: it moves the score neither way."""
        rows = np.where(np.isnan(rows), self.mean, rows)
        return ((rows - self.mean) / self.scale) @ self.weights + self.bias

    def to_json(self) -> dict[str, object]:
        return {
            "features": list(self.features),
            "mean": self.mean.round(6).tolist(),
            "scale": self.scale.round(6).tolist(),
            "weights": self.weights.round(6).tolist(),
            "bias": round(self.bias, 6),
            "threshold": round(self.threshold, 6),
            "trained_on": self.trained_on,
            "encoder": self.encoder,
            **({"group_thresholds": {g: round(t, 6) for g, t in self.group_thresholds.items()}} if self.group_thresholds else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, object], features: tuple[str, ...]) -> LinearModel:
        stored = tuple(str(f) for f in d["features"])  # type: ignore[attr-defined]
        if stored != features:
            raise ValueError(f"model features {stored} do not match this version's {features}: retrain it")
        return cls(
            features=stored,
            mean=np.asarray(d["mean"], dtype=np.float64),
            scale=np.asarray(d["scale"], dtype=np.float64),
            weights=np.asarray(d["weights"], dtype=np.float64),
            bias=float(d["bias"]),  # type: ignore[arg-type]
            trained_on=str(d.get("trained_on", "")),
            threshold=float(d.get("threshold", 0.0)),  # type: ignore[arg-type]
            encoder=str(d.get("encoder", "")),
            group_thresholds={str(g): float(t) for g, t in dict(d.get("group_thresholds", {})).items()},  # type: ignore[call-overload]
        )

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)


def load_linear_model(path: Path, features: tuple[str, ...]) -> LinearModel | None:
    """The model stored at path, or None when there is no file."""
    if not path.is_file():
        return None
    return LinearModel.from_json(json.loads(path.read_text(encoding="utf-8")), features)
