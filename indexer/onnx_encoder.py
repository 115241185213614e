"""The query encoder without torch: the same MiniLM exported to ONNX once per index build (stored
in the index, checksummed with it) and run on onnxruntime with the model's own `tokenizer.json`.

`export_encoder` (index time, needs torch) traces the transformer with mean pooling and L2
normalisation inside the graph, so a query is tokenize -> one session run -> done.
`OnnxEmbedder` (query time) imports only onnxruntime, tokenizers and numpy: `dsqa ask`, the
service and the MCP server answer without loading torch or sentence-transformers. Its vectors
match the torch encoder's (a test compares the top-10 passages on the dev questions).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from indexer.onnx_graph import simplify_encoder
from indexer.quiet import export_quiet

ENCODER_DIR = "encoder"  # inside an index folder
MODEL_FILE = "model.onnx"
INT8_FILE = "model-int8.onnx"  # the same graph with int8 weights (dynamic quantization): the default query encoder
TOKENIZER_FILE = "tokenizer.json"
INFO_FILE = "encoder.json"
MAX_TOKENS = 256  # the sentence-transformers embedder's max_seq_length


def mean_pooled(tokens: Any, attention_mask: Any) -> Any:
    """The sentence-transformers model's vector from its token states (torch tensors): the mean over
    unmasked tokens, normalised to unit length."""
    import torch

    mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
    mean = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1)


def export_encoder(model_path: str, out_dir: Path, name: str, dimension: int, *, simplify: bool = True) -> Path:
    """Write model.onnx, tokenizer.json and encoder.json for the sentence-transformers model at
    `model_path` (a BERT-style transformer + mean pooling + normalisation) into out_dir; the graph
    simplified (`indexer/onnx_graph.py`) unless `simplify` is False."""
    import torch
    from transformers import AutoModel

    out_dir.mkdir(parents=True, exist_ok=True)
    model = AutoModel.from_pretrained(model_path)
    model.eval()

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return mean_pooled(self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state, attention_mask)

    ids = torch.ones((1, 8), dtype=torch.int64)
    with torch.no_grad(), export_quiet():
        torch.onnx.export(
            Pooled(), (ids, torch.ones_like(ids)), str(out_dir / MODEL_FILE),
            input_names=["input_ids", "attention_mask"], output_names=["embedding"],
            dynamic_axes={"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"}, "embedding": {0: "batch"}},
            opset_version=17, dynamo=False,
        )
    if simplify:
        simplify_encoder(out_dir / MODEL_FILE)
    shutil.copyfile(Path(model_path) / TOKENIZER_FILE, out_dir / TOKENIZER_FILE)
    (out_dir / INFO_FILE).write_text(json.dumps({"name": name, "dimension": dimension, "max_tokens": MAX_TOKENS}), encoding="utf-8")
    quantize_encoder(out_dir)
    return out_dir


def quantize_encoder(folder: Path) -> Path:
    """Write INT8_FILE beside the exported model (once): its MatMul weights as int8 with dynamic
    activation scales. Measured on 2 cores: 6.7 ms a query against 14.2; the passages stay encoded by
    the full-precision model, and the tune split's hit@5 and MRR@10 did not drop (a test compares)."""
    target = folder / INT8_FILE
    if not target.is_file():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        tmp = folder / (INT8_FILE + ".tmp")
        with export_quiet():
            quantize_dynamic(str(folder / MODEL_FILE), str(tmp), weight_type=QuantType.QInt8)
        tmp.replace(target)
    return target


class OnnxEmbedder:
    """The `Embedder` of an exported encoder folder."""

    def __init__(self, folder: Path, threads: int = 1, model_file: str = MODEL_FILE) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        info = json.loads((folder / INFO_FILE).read_text(encoding="utf-8"))
        self.name = str(info["name"])
        self.dimension = int(info["dimension"])
        self.tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        self.tokenizer.enable_truncation(max_length=int(info.get("max_tokens", MAX_TOKENS)))
        self.tokenizer.enable_padding()  # to the longest text of a batch, not a fixed length
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # the intra-op threads spin between the graph's operators within a run and sleep once it ends:
        # left spinning after a run they took the CPU from the server's Python and the other requests,
        # never spinning they woke up for every operator. One question at a time with 2 ms between
        # (as between requests): 3.6 ms and 6.7 ms of CPU each, against 4.0 / 9.8 spinning throughout
        # and 4.8 / 7.8 never spinning
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
        options.add_session_config_entry("session.force_spinning_stop", "1")
        self.folder = folder
        self.model_file = model_file
        self.session = onnxruntime.InferenceSession(str(folder / model_file), options, providers=["CPUExecutionProvider"])

    def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        out = []
        for start in range(0, len(texts), batch_size):
            encodings = self.tokenizer.encode_batch(texts[start:start + batch_size])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            out.append(self.session.run(["embedding"], {"input_ids": ids, "attention_mask": mask})[0])
        return np.ascontiguousarray(np.concatenate(out), dtype=np.float32)


def has_encoder(index_dir: Path) -> bool:
    """The index carries an exported encoder."""
    return is_encoder_folder(Path(index_dir) / ENCODER_DIR)


def is_encoder_folder(folder: Path) -> bool:
    """The folder holds a whole export (the model, its tokenizer and its info)."""
    return all((folder / f).is_file() for f in (MODEL_FILE, TOKENIZER_FILE, INFO_FILE))
