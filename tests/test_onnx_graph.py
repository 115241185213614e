"""The exact simplification of the exported encoder graph, on a small graph built here with the same
patterns the tracer writes (the real export is checked in tests/test_query_encoder.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from indexer.onnx_graph import PROBE_SHAPES, _probe_inputs, _static_shape, is_simplified, simplify_encoder


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value, name))


def traced_like_graph(path: Path) -> Path:
    """Two 'layers', each with its own mask-to-bias Where and a softmax NaN guard, then a reshape whose
    target is computed at run time from the tensor's shape."""
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["x"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["keep"], to=TensorProto.BOOL),
    ]
    h = "x"
    for layer in (1, 2):
        nodes += [
            _constant(f"zero{layer}", np.array(0.0, dtype=np.float32)),
            _constant(f"low{layer}", np.array(-3.4e38, dtype=np.float32)),
            helper.make_node("Where", ["keep", f"zero{layer}", f"low{layer}"], [f"bias{layer}"]),
            _constant(f"scale{layer}", np.array(1e-4, dtype=np.float32)),
            helper.make_node("Mul", [h, f"scale{layer}"], [f"scaled{layer}"]),
            helper.make_node("Add", [f"scaled{layer}", f"bias{layer}"], [f"scores{layer}"]),
            helper.make_node("Softmax", [f"scores{layer}"], [f"p{layer}"], axis=-1),
            helper.make_node("IsNaN", [f"p{layer}"], [f"nan{layer}"]),
            _constant(f"nil{layer}", np.array(0.0, dtype=np.float32)),
            helper.make_node("Where", [f"nan{layer}", f"nil{layer}", f"p{layer}"], [f"guarded{layer}"]),
        ]
        h = f"guarded{layer}"
    nodes += [
        helper.make_node("Shape", [h], ["shape"]),
        _constant("i0", np.array(0, dtype=np.int64)),
        _constant("i1", np.array(1, dtype=np.int64)),
        _constant("axes", np.array([0], dtype=np.int64)),
        helper.make_node("Gather", ["shape", "i0"], ["batch"]),
        helper.make_node("Gather", ["shape", "i1"], ["tokens"]),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"]),
        helper.make_node("Unsqueeze", ["tokens", "axes"], ["tokens1"]),
        _constant("one", np.array([1], dtype=np.int64)),
        helper.make_node("Concat", ["batch1", "tokens1", "one"], ["target"], axis=0),
        helper.make_node("Reshape", [h, "target"], ["embedding"]),
    ]
    graph = helper.make_graph(
        nodes, "traced_like",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _outputs(path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feed)[0])


def test_guards_repeats_and_run_time_shapes_go_and_the_outputs_stay_to_the_bit(tmp_path: Path) -> None:
    path = traced_like_graph(tmp_path / "model.onnx")
    feeds = [_probe_inputs(shape, 7 + k) for k, shape in enumerate((*PROBE_SHAPES, (4, 11)))]
    before = [_outputs(path, f) for f in feeds]
    assert simplify_encoder(path)
    model = onnx.load(str(path))
    ops = [n.op_type for n in model.graph.node]
    assert is_simplified(model)
    assert "IsNaN" not in ops and ops.count("Where") == 1  # one mask Where kept, both guards gone
    assert not {"Shape", "Gather", "Concat", "Unsqueeze"} & set(ops)  # the reshape target is a constant
    for feed, expected in zip(feeds, before, strict=True):  # (4, 11): a shape the probes never saw
        assert np.array_equal(_outputs(path, feed), expected)
    assert not simplify_encoder(path)  # simplified before: left alone


def test_a_simplified_graph_that_cannot_be_written_leaves_the_export_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = traced_like_graph(tmp_path / "model.onnx")
    original = path.read_bytes()

    def full_disk(self: Path, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    assert not simplify_encoder(path)
    assert path.read_bytes() == original and not (tmp_path / "model.onnx.tmp").exists()


def test_a_reshape_target_is_kept_only_when_it_gives_every_probed_shape() -> None:
    heads = [((b, s, 384), (b, s, 12, 32)) for b, s in ((1, 5), (2, 13), (3, 29))]
    assert _static_shape(heads) == [0, 0, 12, 32]
    flat = [((b, s, 12, 32), (b * s, 384)) for b, s in ((1, 5), (2, 13))]
    assert _static_shape(flat) == [-1, 384]
    two_unknowns = [((b, s), (s, b)) for b, s in ((1, 5), (2, 13))]  # a transpose-like reshape: no constant gives it
    assert _static_shape(two_unknowns) is None
