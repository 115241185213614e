"""A small index of the tiny docs tree with the hash embedder (seconds, no model): for front-end tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.api import create_app
from app.engine import load_engine
from app.settings import Settings
from indexer.build import build_index
from indexer.embedder import HashEmbedder

HASH_MODEL = "hash-64"


def build_small_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import RST, TUTORIAL

    root = tmp_path_factory.mktemp("docs") / "DeepSpeed"
    (root / "docs/_tutorials").mkdir(parents=True)
    (root / "docs/code-docs/source").mkdir(parents=True)
    (root / "docs/_tutorials/tiny.md").write_text(TUTORIAL)
    (root / "docs/code-docs/source/pipeline.rst").write_text(RST)
    out = tmp_path_factory.mktemp("idx") / "index"
    build_index(out, HashEmbedder(), docs_dir=root, notes_dir=None, cache_dir=None, progress=False)
    return out


def small_settings(index: Path, **extra: object) -> Settings:
    return Settings(index_dir=index, no_answer_threshold=0.0, embedding_model=HASH_MODEL, **extra)  # type: ignore[arg-type]


def small_app(index: Path, **extra: object):  # noqa: ANN201 - a FastAPI app
    settings = small_settings(index, **extra)
    return create_app(settings, load_engine(settings, HashEmbedder()))
