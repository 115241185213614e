"""The stored tree ensemble (`app/tree_model.py`): the numpy walk gives scikit-learn's scores, through JSON
too, and a model stored for other features or of another kind is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier

from app.tree_model import TreeModel, load_tree_model

FEATURES = ("a", "b", "c", "d")


@pytest.fixture(scope="module")
def fitted() -> tuple[HistGradientBoostingClassifier, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(1500, 4))
    y = ((x[:, 0] * x[:, 1] > 0) ^ (x[:, 2] > 1)).astype(int)  # an interaction no linear model holds
    x[rng.random(x.shape) < 0.05] = np.nan  # missing values go where training sent them
    model = HistGradientBoostingClassifier(max_depth=3, max_iter=40, min_samples_leaf=20, random_state=0).fit(x, y)
    return model, x


def test_scores_equal_scikit_learns(fitted) -> None:
    model, x = fitted
    trees = TreeModel.from_sklearn(model, FEATURES, "test", encoder="enc")
    assert trees.depth == 3 and len(trees.feature) == 40
    assert np.abs(trees.score(x) - model.decision_function(x)).max() < 1e-9
    assert len(trees.score(x[:0])) == 0


def test_json_round_trip(fitted, tmp_path: Path) -> None:
    model, x = fitted
    path = tmp_path / "m.json"
    TreeModel.from_sklearn(model, FEATURES, "tune", encoder="enc").save(path)
    loaded = load_tree_model(path, FEATURES)
    assert loaded is not None and loaded.encoder == "enc" and loaded.trained_on == "tune"
    assert np.abs(loaded.score(x) - model.decision_function(x)).max() < 1e-6
    assert load_tree_model(tmp_path / "absent.json", FEATURES) is None


def test_other_features_or_kind_are_refused(fitted, tmp_path: Path) -> None:
    model, _ = fitted
    stored = TreeModel.from_sklearn(model, FEATURES).to_json()
    with pytest.raises(ValueError, match="do not match"):
        TreeModel.from_json(stored, ("a", "b", "c", "e"))
    linear = {"features": list(FEATURES), "mean": [0] * 4, "scale": [1] * 4, "weights": [1] * 4, "bias": 0}
    (tmp_path / "linear.json").write_text(json.dumps(linear), encoding="utf-8")
    with pytest.raises(ValueError, match="not a tree model"):
        load_tree_model(tmp_path / "linear.json", FEATURES)
