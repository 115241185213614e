"""GPU-only checks: the notes snippets tagged requires=gpu, run on a CUDA device (skipped without one)."""

from __future__ import annotations

import pytest

from eval.runner import LocalRunner, RunRequest

pytestmark = pytest.mark.gpu


def test_gpu_tagged_notes_snippets_pass_on_a_gpu() -> None:
    from corpus import NOTES_DIR
    from indexer.chunker import chunk_document
    from indexer.docs_source import read_notes_dir

    snippets = [s for doc in read_notes_dir(NOTES_DIR) for s in chunk_document(doc)[1]]
    gpu = [s for s in snippets if s.kind in ("ds_config", "python") and s.requires == ("gpu",)]
    assert gpu, "the notes should carry GPU-tagged snippets"
    results = LocalRunner().run_many([RunRequest.from_snippet(s, timeout_s=600) for s in gpu], concurrency=1)
    bad = [f"{s.path} [{s.id}]: {r.status}: {r.reason}" for s, r in zip(gpu, results, strict=True) if r.status != "passed"]
    assert not bad, "\n".join(bad)
