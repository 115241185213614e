"""Markdown and reST parsing, chunking and snippet classification on small inputs."""

from __future__ import annotations

from pathlib import Path

from indexer.chunker import ChunkBudget, chunk_document
from indexer.docs_source import page_url, read_docs_dir
from indexer.documents import Block, Document, Section
from indexer.markdown import clean_prose, parse_markdown, split_front_matter
from indexer.rst import parse_rst
from indexer.snippet_kinds import classify_snippet


def test_front_matter_and_noise_removed(tiny_docs: Path) -> None:
    text = (tiny_docs / "docs/_tutorials/tiny.md").read_text()
    meta, body = split_front_matter(text)
    assert meta["title"] == "Tiny Tutorial"
    sections = parse_markdown(body, title=meta["title"])
    prose = " ".join(b.text for s in sections for b in s.blocks if b.kind == "text")
    assert "{%" not in prose and "<i>" not in prose
    assert "stage3_max_live_parameters" in prose
    assert "overlap_comm; overlaps reduction with backward" in prose  # table row flattened, escape removed
    assert "-----" not in prose


def test_heading_trail_anchor_and_code_whole(tiny_docs: Path) -> None:
    docs = read_docs_dir(tiny_docs)
    tiny = next(d for d in docs if d.path == "docs/_tutorials/tiny.md")
    assert tiny.url == "https://www.deepspeed.ai/tutorials/tiny/"
    launch = next(s for s in tiny.sections if s.heading == "Launch")
    assert launch.trail == ("Tiny Tutorial", "Configure ZeRO", "Launch")
    assert launch.anchor == "launch"
    code = [b for s in tiny.sections for b in s.blocks if b.kind == "code"]
    assert [b.language for b in code] == ["json", "bash"]
    assert code[0].text.count("\n") == 3  # the JSON block is one block, unsplit


def test_rst_headings_code_and_autodoc(tiny_docs: Path) -> None:
    title, sections = parse_rst((tiny_docs / "docs/code-docs/source/pipeline.rst").read_text(), "pipeline")
    assert title == "Pipeline Parallelism"
    spec = next(s for s in sections if s.heading == "Model Specification")
    assert spec.anchor == "model-specification"
    assert spec.trail == ("Pipeline Parallelism", "Model Specification")
    kinds = [(b.kind, b.language) for b in spec.blocks]
    assert ("code", "python") in kinds
    code = next(b for b in spec.blocks if b.kind == "code")
    assert code.text.startswith("net = PipelineModule") and "deepspeed.initialize" in code.text
    assert any("deepspeed.pipe.PipelineModule" in b.text for b in spec.blocks if b.kind == "text")
    assert "``" not in " ".join(b.text for b in spec.blocks if b.kind == "text")


def test_rst_url_and_post_url() -> None:
    assert page_url("docs/code-docs/source/zero3.rst", {}, {}) == "https://deepspeed.readthedocs.io/en/latest/zero3.html"
    assert page_url("docs/_posts/2020-02-13-release.md", {}, {}) == "https://www.deepspeed.ai/2020/02/13/release.html"
    assert page_url("docs/_pages/config-json.md", {}, {}) == "https://www.deepspeed.ai/docs/config-json/"
    assert page_url("docs/_tutorials/x.md", {"permalink": "/getting-started/"}, {}) == "https://www.deepspeed.ai/getting-started/"


def _doc(blocks: list[Block]) -> Document:
    return Document(path="p.md", title="T", url="https://x/", source="docs", sections=[Section("H", ("T", "H"), "h", blocks)])


def test_chunker_budget_keeps_code_with_its_prose() -> None:
    para = " ".join(["word"] * 90)
    code = "\n".join(f"line_{i} = {i}" for i in range(300))  # far over budget, never split
    blocks = [Block("text", para), Block("text", "Use this config:"), Block("code", code, "python"), Block("text", para)]
    chunks, snippets = chunk_document(_doc(blocks), ChunkBudget(max_words=120))
    holder = next(c for c in chunks if "line_299" in c.text)
    assert "line_0 = 0" in holder.text and "Use this config:" in holder.text
    assert all(len(c.text.split()) <= 120 for c in chunks if "line_0" not in c.text)
    assert len(snippets) == 1 and snippets[0].chunk_id == holder.id
    assert holder.snippet_ids == (snippets[0].id,)
    assert holder.url == "https://x/#h"


def test_long_paragraph_split_at_sentences() -> None:
    sentence = "DeepSpeed partitions optimizer states across ranks. "
    chunks, _ = chunk_document(_doc([Block("text", sentence * 60)]), ChunkBudget(max_words=100))
    assert len(chunks) >= 3
    assert all(c.text.rstrip().endswith(".") for c in chunks)


def test_clean_prose_drops_html_and_liquid() -> None:
    assert clean_prose("A <b>bold</b> {{ site.url }} [link](http://x) text {: .notice}") == "A bold link text"
    # a power stays a power: "the loss scale is 2<sup>initial_scale_power</sup>" once read "2initial_scale_power"
    assert clean_prose("The loss scale is 2<sup>initial_scale_power</sup>.") == "The loss scale is 2^initial_scale_power."
    assert clean_prose("computed as 2<sup><i>**initial_scale_power**</i></sup>.") == "computed as 2^initial_scale_power."


def test_footnote_markers_dropped_their_text_kept() -> None:
    # a blog's footnote definition once led an answer as "[^multi_gpu_pcie]: For multiple GPU runs, ..."
    text = "Throughput on two GPUs[^multi_gpu_pcie] grows.\n\n[^multi_gpu_pcie]: For multiple GPU runs, we pick GPUs with their own PCIe links."
    assert clean_prose(text) == "Throughput on two GPUs grows.\nFor multiple GPU runs, we pick GPUs with their own PCIe links."
    assert clean_prose("a [link][ref] and [b](http://x)") == "a link and b"


def test_snippet_kinds() -> None:
    assert classify_snippet('{"train_batch_size": 8, "fp16": {"enabled": true}}', "json")[0] == "ds_config"
    assert classify_snippet('ds_config = {"zero_optimization": {"stage": 3}}', "python")[0] == "ds_config"
    assert classify_snippet('{\n  "zero_optimization": {\n    "stage": 2,\n    ...\n  }\n}', "")[0] == "ds_config"
    assert classify_snippet("deepspeed --num_gpus 2 train.py --deepspeed", "bash")[0] == "launcher"
    assert classify_snippet("NCCL_DEBUG=INFO deepspeed --hostfile=hosts train.py", "")[0] == "launcher"
    assert classify_snippet("worker-1 slots=4\nworker-2 slots=4", "")[0] == "hostfile"
    assert classify_snippet("pip install deepspeed\nds_report", "")[0] == "shell"
    assert classify_snippet("import deepspeed\nengine, *_ = deepspeed.initialize(model=m)", "")[0] == "python"
    assert classify_snippet("Traceback (most recent call last):\n  File x\nValueError: bad", "")[0] == "output"
    assert classify_snippet("key: value\nother: 2", "yaml")[0] == "yaml"
    assert classify_snippet("#include <cuda.h>", "cpp")[0] == "other"
