"""A gradient-boosted tree ensemble over named features, stored as JSON beside the code: the answer
unit scorer (`app/answer_units.json`). Where a linear model adds up what each feature says, the trees
read features together (a unit's cosine counts for more when its passage ranks first).

Trees are fitted by scikit-learn at training time (`eval/answer_training.py` converts them with
`TreeModel.from_sklearn`); here they are plain arrays walked with numpy, so serving needs no pickle and
no training library. The stored feature names must equal the code's, so a model never scores the wrong
columns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

KIND = "gradient-boosted trees"


@dataclass(frozen=True)
class TreeModel:
    features: tuple[str, ...]
    # one row per tree, one column per node (padded with leaves of value 0): the feature a node splits on,
    # its threshold (a value at or under it goes left), where a missing value (NaN) goes, the children, whether
    # it is a leaf, and a leaf's value (the learning rate already applied)
    feature: np.ndarray
    threshold: np.ndarray
    missing_left: np.ndarray
    left: np.ndarray
    right: np.ndarray
    leaf: np.ndarray
    value: np.ndarray
    bias: float  # the score before any tree (the log-odds of the weighted training labels)
    depth: int
    trained_on: str = ""
    encoder: str = ""  # the embedding model whose cosines it was trained on

    def score(self, rows: np.ndarray) -> np.ndarray:
        """The log-odds of each row: the bias plus one leaf's value per tree."""
        rows = np.asarray(rows, dtype=np.float64)
        n, trees = len(rows), len(self.feature)
        if n == 0 or trees == 0:
            return np.full(n, self.bias)
        tree = np.arange(trees)[None, :]
        node = np.zeros((n, trees), dtype=np.int64)
        for _ in range(self.depth):
            x = rows[np.arange(n)[:, None], self.feature[tree, node]]
            go_left = np.where(np.isnan(x), self.missing_left[tree, node], x <= self.threshold[tree, node])
            step = np.where(go_left, self.left[tree, node], self.right[tree, node])
            node = np.where(self.leaf[tree, node], node, step)
        return self.bias + self.value[tree, node].sum(axis=1)

    @classmethod
    def from_sklearn(cls, model: Any, features: tuple[str, ...], trained_on: str = "", encoder: str = "") -> TreeModel:
        """The trees of a fitted binary `HistGradientBoostingClassifier` (numeric features only)."""
        nodes = [p[0].nodes for p in model._predictors]
        if any(n["is_categorical"].any() for n in nodes):
            raise ValueError("categorical splits are not supported")
        width = max(len(n) for n in nodes)

        def column(field: str, dtype: type, fill: float = 0) -> np.ndarray:
            out: np.ndarray = np.full((len(nodes), width), fill, dtype=dtype)
            for i, n in enumerate(nodes):
                out[i, :len(n)] = n[field]
            return out

        return cls(features, column("feature_idx", np.int64), column("num_threshold", np.float64),
                   column("missing_go_to_left", np.bool_), column("left", np.int64), column("right", np.int64),
                   column("is_leaf", np.bool_, 1), np.where(column("is_leaf", np.bool_, 1), column("value", np.float64), 0.0),
                   float(np.ravel(model._baseline_prediction)[0]), int(max(n["depth"].max() for n in nodes)),
                   trained_on, encoder)

    def to_json(self) -> dict[str, object]:
        return {
            "kind": KIND,
            "features": list(self.features),
            "bias": round(self.bias, 8),
            "depth": self.depth,
            "trained_on": self.trained_on,
            "encoder": self.encoder,
            # one list per tree: [feature, threshold, missing goes left, left, right, leaf, value] per node
            "trees": [[[int(self.feature[t, j]), float(self.threshold[t, j]), int(self.missing_left[t, j]), int(self.left[t, j]),
                        int(self.right[t, j]), int(self.leaf[t, j]), round(float(self.value[t, j]), 8)]
                       for j in range(self.feature.shape[1])] for t in range(len(self.feature))],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], features: tuple[str, ...]) -> TreeModel:
        if d.get("kind") != KIND:
            raise ValueError(f"not a tree model (kind {d.get('kind')!r}): retrain it")
        stored = tuple(str(f) for f in d["features"])
        if stored != features:
            raise ValueError(f"model features {stored} do not match this version's {features}: retrain it")
        nodes = np.asarray(d["trees"], dtype=np.float64).reshape(len(d["trees"]), -1, 7)
        return cls(stored, nodes[..., 0].astype(np.int64), nodes[..., 1], nodes[..., 2].astype(np.bool_),
                   nodes[..., 3].astype(np.int64), nodes[..., 4].astype(np.int64), nodes[..., 5].astype(np.bool_),
                   nodes[..., 6], float(d["bias"]), int(d["depth"]), str(d.get("trained_on", "")), str(d.get("encoder", "")))

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n", encoding="utf-8")
        tmp.replace(path)


def load_tree_model(path: Path, features: tuple[str, ...]) -> TreeModel | None:
    """The model stored at path, or None when there is no file."""
    if not path.is_file():
        return None
    return TreeModel.from_json(json.loads(path.read_text(encoding="utf-8")), features)
