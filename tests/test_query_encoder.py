"""The torch-free query path: the index carries the model exported to ONNX, the service loads it
instead of sentence-transformers, and retrieval is the same to the passage (slow: real model)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.engine import load_engine
from app.settings import Settings
from eval.metrics import load_questions
from indexer.onnx_encoder import ENCODER_DIR, INT8_FILE, MODEL_FILE, OnnxEmbedder, has_encoder

pytestmark = pytest.mark.slow


def test_onnx_encoder_gives_the_same_top_10_as_torch(real_index: Path, embedder, dev_questions: Path) -> None:
    assert has_encoder(real_index)
    onnx = load_engine(Settings(index_dir=real_index, query_encoder="onnx"))
    torch = load_engine(Settings(index_dir=real_index), embedder)
    assert onnx.retriever is not None and torch.retriever is not None
    assert isinstance(onnx.retriever.embedder.inner, OnnxEmbedder)  # type: ignore[attr-defined]  # behind the batcher
    questions = load_questions(dev_questions)
    vectors = onnx.retriever.embedder.embed([q.question for q in questions])  # type: ignore[attr-defined]
    assert np.abs(vectors - embedder.embed([q.question for q in questions])).max() < 1e-4
    # the lanes' one-thread session (concurrent questions) gives the main session's vectors to the bit
    lanes = onnx.retriever.embedder.parallel()  # type: ignore[attr-defined]
    assert isinstance(lanes, OnnxEmbedder) and lanes.session.get_session_options().intra_op_num_threads == 1
    one_by_one = [q.question for q in questions]
    assert np.array_equal(np.concatenate([lanes.embed([q], batch_size=1) for q in one_by_one]),
                          np.concatenate([onnx.retriever.embedder.inner.embed([q], batch_size=1) for q in one_by_one]))  # type: ignore[attr-defined]
    for q in questions:
        a = [h.chunk.id for h in onnx.retriever.search(q.question, 10).hits]
        b = [h.chunk.id for h in torch.retriever.search(q.question, 10).hits]
        assert a == b, q.id


def test_answering_imports_neither_torch_nor_deepspeed(real_index: Path) -> None:
    """Nor does a server's warm-up: importing deepspeed there (to check pasted configs faster) took a one-worker
    server's peak RSS from ~480 MB to ~660 MB (stop 63, reverted)."""
    code = (
        "import sys\n"
        "from app.ask import ask\nfrom app.engine import load_engine\nfrom app.schemas import AskRequest\nfrom app.settings import Settings\n"
        f"engine = load_engine(Settings(index_dir={str(real_index)!r}))\nengine.warm()\n"
        "reply = ask(engine, AskRequest(question='How do I offload optimizer states to NVMe?'))\n"
        "assert reply.covered and reply.passages\n"
        "print(sorted(m for m in ('torch', 'sentence_transformers', 'transformers', 'deepspeed') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert (real_index / ENCODER_DIR / "model.onnx").stat().st_size > 1_000_000


def test_int8_query_encoder_keeps_the_tune_figures(real_index: Path, embedder) -> None:
    """The int8 query encoder (`query_encoder="onnx-int8"`, faster than full precision) keeps the tune split's
    hit@5 and MRR@10 within one question of full precision. It is not the default: it moved the hit@5 of
    8 test and 13 outside_b questions against the torch model (stop 42), and issue 13 wants none moved."""
    from eval.metrics import evaluate
    from eval.question_set import load_split
    from eval.retrieval_eval import search_fn

    served = load_engine(Settings(index_dir=real_index, batch_queries=False, query_encoder="onnx-int8"))
    full = load_engine(Settings(index_dir=real_index), embedder)
    assert isinstance(served.retriever.embedder, OnnxEmbedder) and served.retriever.embedder.model_file == INT8_FILE  # type: ignore[union-attr]
    default = load_engine(Settings(index_dir=real_index, batch_queries=False))
    assert isinstance(default.retriever.embedder, OnnxEmbedder) and default.retriever.embedder.model_file == MODEL_FILE  # type: ignore[union-attr]
    tune = load_split("tune")
    a = evaluate(tune, search_fn(served.retriever, served.index))[1]["all"]  # type: ignore[arg-type]
    b = evaluate(tune, search_fn(full.retriever, full.index))[1]["all"]  # type: ignore[arg-type]
    print({m: (a[m], b[m]) for m in ("hit@1", "hit@5", "mrr@10")})
    assert a["hit@5"] >= b["hit@5"] - 1 / len(tune) and a["mrr@10"] >= b["mrr@10"] - 0.01


def test_a_rebuild_with_few_new_texts_embeds_them_through_the_export(real_index: Path, embedder, index_cache: Path, tmp_path: Path) -> None:
    """A few new texts go through the cached ONNX export (no sentence-transformers import), with the
    torch model's vectors to 1e-5; many go through torch."""
    from indexer.build import export_embedder, query_encoder
    from indexer.embedder import FEW_TEXTS, SentenceTransformerEmbedder, VectorCache, embed_with_cache

    folder = query_encoder(embedder, index_cache)
    few = export_embedder(folder, embedder)
    assert isinstance(few, OnnxEmbedder)
    texts = ["ZeRO stage 3 partitions the parameters.", "Offload the optimizer states to NVMe with aio tuned."]
    lazy = SentenceTransformerEmbedder()
    vectors, embedded = embed_with_cache(lazy, texts, ["k1", "k2"], VectorCache(tmp_path, lazy.name), few=few)
    assert embedded == 2 and "_model" not in vars(lazy)  # the torch model was never loaded
    assert lazy.dimension == embedder.dimension == 384
    assert np.abs(vectors - embedder.embed(texts)).max() < 1e-5
    many = [f"passage number {i} about pipeline stages" for i in range(FEW_TEXTS + 1)]
    embed_with_cache(lazy, many, [str(i) for i in range(len(many))], None, few=few)
    assert "_model" in vars(lazy)  # more than a few: the torch model, faster in batches


def test_bf16_build_vectors_stay_within_fp32s_cosine(embedder) -> None:
    """The build's bf16 passages (where the CPU has native bf16) against the fp32 model queries are
    encoded with: every vector within cosine 0.9999, so one index serves either."""
    from indexer.embedder import SentenceTransformerEmbedder

    texts = ["ZeRO stage 3 partitions the parameters, gradients and optimizer states across data-parallel ranks.",
             "Set offload_optimizer.device to nvme and give nvme_path a fast local disk.", "流水线并行的 micro batch 数怎么设置？",
             "deepspeed --num_gpus 2 train.py --deepspeed_config ds_config.json"]
    bulk = SentenceTransformerEmbedder(bf16=True)
    fp32 = embedder.embed(texts)
    half = bulk.embed(texts)
    assert embedder.bf16 is False and half.dtype == np.float32
    assert np.allclose(np.linalg.norm(half, axis=1), 1.0, atol=1e-5)
    assert float((fp32 * half).sum(axis=1).min()) > 0.9999
    assert not np.array_equal(fp32, half)  # bf16 did run: the vectors are not fp32's bit for bit


def test_the_build_embedders_lanes_give_encodes_vectors_to_the_bit(embedder, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dsqa index` runs sentence-transformers' batches on lanes (threads on their share of torch's
    threads): the vectors equal `encode`'s to the bit in bf16 where the CPU has it, in fp32 within a last
    bit (on a Xeon with AMX, fp32 matrix products of one thread and of two round differently: 1.3e-7 at
    most, seen in stop 52), in the order of the texts; a lane's failure reaches the caller, the other lanes stop, and torch's
    thread count is what it was."""
    import torch

    from indexer.embedder import SentenceTransformerEmbedder

    texts = ["ZeRO stage 3 partitions the parameters.", "  offload the optimizer states to NVMe  ", "pipeline " * 600, "bf16",
             "How do I set the gradient accumulation steps in the config?", "activation checkpointing", "MoE expert parallel size"]
    threads = torch.get_num_threads()
    got = {}
    for name, build in (("bf16", SentenceTransformerEmbedder(bf16=None)), ("fp32", embedder)):  # bf16 where native
        got[name] = build.embed(texts, batch_size=2)  # four batches: more than one lane where there are 2 threads
        with build._precision():
            want = build._model.encode(texts, batch_size=2, convert_to_numpy=True, normalize_embeddings=True)
        want = np.asarray(want, dtype=np.float32)
        assert got[name].dtype == np.float32 and (np.array_equal(got[name], want) if name == "bf16" else np.abs(got[name] - want).max() < 1e-6)
        assert torch.get_num_threads() == threads
    assert (got["bf16"] * got["fp32"]).sum(1).min() > 0.9998  # bf16 (where native) against fp32, each in its text's row
    assert ((got["bf16"] @ got["fp32"].T).argmax(1) == np.arange(len(texts))).all()

    calls = []
    preprocess = embedder._model.preprocess

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory in a lane")
        return preprocess(*args, **kwargs)

    monkeypatch.setattr(embedder._model, "preprocess", failing)
    with pytest.raises(RuntimeError, match="out of memory in a lane"):
        embedder.embed(texts, batch_size=1)
    assert len(calls) < len(texts) and torch.get_num_threads() == threads  # not every batch ran


def test_the_simplified_graph_gives_the_traced_exports_vectors_to_the_bit(real_index: Path, embedder, dev_questions: Path,
                                                                          tmp_path: Path) -> None:
    """The index's encoder graph is simplified (no softmax NaN guards, one mask `Where`, no reshape
    target computed at run time) and gives the vectors of the export as traced to the bit, one question
    at a time and in padded batches; a graph whose outputs differ is not accepted."""
    import onnx
    from onnx import numpy_helper

    from indexer.onnx_encoder import export_encoder
    from indexer.onnx_graph import is_simplified, same_outputs, simplify_encoder

    shipped = onnx.load(str(real_index / ENCODER_DIR / MODEL_FILE))
    ops = [n.op_type for n in shipped.graph.node]
    assert is_simplified(shipped) and "IsNaN" not in ops
    assert ops.count("Where") < 6 and ops.count("Shape") < 20  # 6 and 40 as traced
    traced_dir = export_encoder(embedder.path, tmp_path / "traced", embedder.name, embedder.dimension, simplify=False)
    traced_model = onnx.load(str(traced_dir / MODEL_FILE))
    assert not is_simplified(traced_model) and len(traced_model.graph.node) > len(shipped.graph.node) + 200
    questions = [q.question for q in load_questions(dev_questions)]
    traced, simple = OnnxEmbedder(traced_dir, threads=2), OnnxEmbedder(real_index / ENCODER_DIR, threads=2)
    for batch_size in (1, 16):
        assert np.array_equal(traced.embed(questions, batch_size=batch_size), simple.embed(questions, batch_size=batch_size))
    broken = onnx.ModelProto.FromString(shipped.SerializeToString())
    weight = next(i for i in broken.graph.initializer if i.name.endswith("attention.output.dense.bias"))
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) + 1e-3, weight.name))
    assert same_outputs(shipped.SerializeToString(), shipped.SerializeToString())
    assert not same_outputs(shipped.SerializeToString(), broken.SerializeToString())
    assert simplify_encoder(traced_dir / MODEL_FILE) and not simplify_encoder(traced_dir / MODEL_FILE)
    assert is_simplified(onnx.load(str(traced_dir / MODEL_FILE)))
