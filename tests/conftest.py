"""Shared fixtures: the real docs, a tiny docs tree, the real model and index (built once)."""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` are skipped, and reported as skipped, where no CUDA GPU is present."""
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run eval/gpu_check.sh on a GPU host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _real_docs() -> Path | None:
    env = os.environ.get("DSQA_TEST_DOCS")
    for candidate in [Path(env)] if env else [REPO.parent / "shared" / "deepspeed-docs"]:
        if (candidate / "docs").is_dir():
            return candidate
    return None


@pytest.fixture(scope="session")
def real_docs() -> Path:
    docs = _real_docs()
    if docs is None:
        pytest.skip("DeepSpeed docs not found: set DSQA_TEST_DOCS to a DeepSpeed checkout")
    return docs


@pytest.fixture(scope="session")
def dev_questions() -> Path:
    path = REPO.parent / "shared" / "eval" / "dev.jsonl"
    if not path.is_file():
        pytest.skip("../shared/eval/dev.jsonl not found")
    return path


TUTORIAL = """---
title: "Tiny Tutorial"
tags: training
---

Intro paragraph about {% include note.html %} the ZeRO optimizer and `stage3_max_live_parameters`.

## Configure ZeRO

Set the stage in the config<i>**!**</i>:

```json
{
  "train_batch_size": 8,
  "zero_optimization": {"stage": 2, "overlap_comm": true}
}
```

| Field | Meaning |
| ----- | ------- |
| overlap\\_comm | overlaps reduction with backward |

### Launch

Run it:

```bash
deepspeed --num_gpus 2 train.py --deepspeed_config ds.json
```
"""

RST = """Pipeline Parallelism
====================

Intro to pipelines.

Model Specification
-------------------

Use ``PipelineModule`` to build it.

.. code-block:: python

    net = PipelineModule(layers=layers, num_stages=2)
    engine, _, _, _ = deepspeed.initialize(model=net)

.. autoclass:: deepspeed.pipe.PipelineModule
"""


@pytest.fixture()
def tiny_docs(tmp_path: Path) -> Path:
    root = tmp_path / "DeepSpeed"
    (root / "docs" / "_tutorials").mkdir(parents=True)
    (root / "docs" / "code-docs" / "source").mkdir(parents=True)
    (root / "docs" / "_config.yml").write_text("url: https://www.deepspeed.ai\ncollections:\n  tutorials:\n    permalink: /:collection/:path/\n")
    (root / "docs" / "_tutorials" / "tiny.md").write_text(TUTORIAL)
    (root / "docs" / "code-docs" / "source" / "pipeline.rst").write_text(RST)
    return root


@pytest.fixture(scope="session")
def embedder():  # the real model, loaded once
    from indexer.embedder import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


def _run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every test worker of this run shares (pytest-xdist gives each worker its own temp
    folder inside it); without workers, the run's own temp folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def index_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vector cache the real index is built with, one for all workers (DSQA_TEST_CACHE keeps one
    between sessions)."""
    return Path(os.environ.get("DSQA_TEST_CACHE", str(_run_folder(tmp_path_factory) / "vector-cache")))


@pytest.fixture(scope="session")
def real_index(real_docs: Path, index_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The index of the real docs + package + notes with the real model, built once a run the way
    `dsqa index` builds it: bf16 matrix products where the CPU has them natively (2x faster here; the
    fp32 `embedder` stays the query side's reference). The first worker to need it builds it under a
    lock; the others wait for it (their core goes to the build) and read the same folder."""
    from corpus import NOTES_DIR
    from indexer.build import build_index
    from indexer.embedder import SentenceTransformerEmbedder

    shared = _run_folder(tmp_path_factory)
    out = shared / "real-index"
    with open(shared / "real-index.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "manifest.json").is_file():
            building = shared / f"real-index.building-{os.getpid()}"
            build_index(building, SentenceTransformerEmbedder(bf16=None), docs_dir=real_docs, notes_dir=NOTES_DIR,
                        cache_dir=index_cache, progress=False)
            building.rename(out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """A real uvicorn server in a background thread, on a free loopback port."""

    def __init__(self, app, header_timeout_s: float = 10.0) -> None:
        import uvicorn

        from app.http_protocol import server_config

        self.port = free_port()
        self.server = uvicorn.Server(server_config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                   header_timeout_s=header_timeout_s))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def real_server(real_index: Path, embedder) -> Iterator[ServerThread]:
    from app.api import create_app
    from app.engine import load_engine
    from app.settings import Settings

    settings = Settings(index_dir=real_index)
    engine = load_engine(settings, embedder)
    with ServerThread(create_app(settings, engine)) as server:
        yield server
