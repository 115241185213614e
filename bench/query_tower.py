"""A fine-tuned query tower, measured (not shipped): LoRA on MiniLM's query side only, the stored passage
vectors kept, against the base encoder, each inside the whole learned pipeline (question memory, query
adapter and ranker rebuilt on `tune` for each encoder), on every question set, in one run.

    .venv/bin/python bench/query_tower.py [--rank 8] [--epochs 4] [--lr 5e-4] [--doc-pairs 0] [--docs-only]
                                          [--scale 1.0] [--skip-base]
                                          [--index var/index] [--out var/cache/query-tower] [--dev ../shared/eval/dev.jsonl]

Training: the adapter's loss (`eval/adapter_training.py`: softmax cross-entropy of the question's cosines
over every chunk's stored vector, temperature 0.03, the passages holding a gold phrase as positives) on
the tune questions and the training-only ones, optionally with `--doc-pairs` heading trails -> their
section's chunks; LoRA of rank `--rank` on the query, value, attention-output and both feed-forward
projections of all six layers (~300k weights), AdamW, batches of 32, warm-up then linear decay, seed 0,
2 threads (~80 s a model for 4 epochs on 2 cores). Six models: one without each tune fold, and one on
everything. A tune question is encoded by the model that never saw its fold (so the memory, the adapter
and the ranker learn from the vectors a new question would get); every other text by the last one.
Both encoders run in fp32 torch here (the service runs the base model's int8 export, within 0.003 of
these figures).

Measured 2026-12-05 (hit@1 / hit@5 / MRR@10; the ranker's 5-fold CV MRR@10 on tune decides):

| query tower | ranker CV | tune | test | outside | outside_b |
|---|---|---|---|---|---|
| base | 0.758 | .682/.890/.770 | .678/.893/.772 | .625/.863/.723 | .531/.782/.647 |
| LoRA, 4 epochs | 0.770 | .682/.890/.771 | .715/.923/.797 | .575/.875/.705 | .500/.782/.630 |
| LoRA, 2 epochs | 0.765 | .682/.893/.774 | .690/.914/.783 | .600/.863/.716 | .531/.788/.643 |
| LoRA, 3 epochs, 600 doc pairs | 0.775 | .687/.882/.774 | .706/.902/.791 | .600/.875/.713 | .509/.788/.636 |
| LoRA, 3 epochs, 1141 doc pairs alone | 0.770 | .701/.880/.779 | .693/.896/.782 | .588/.838/.697 | .509/.788/.638 |
| LoRA, 4 epochs, halved (`--scale 0.5`, WiSE-FT) | 0.764 | .684/.890/.773 | .693/.911/.784 | .625/.863/.724 | .524/.782/.643 |

Every variant gains on tune's cross-validated ranker and on test's MRR (test is written like tune); every
full-strength one loses MRR on both sets of real-user questions written elsewhere (-0.004 to -0.026), and the
tower that never saw a question also loses Chinese hit@5 (test 0.870 -> 0.830, outside 0.857 -> 0.800).
Halving the trained LoRA (weight-space interpolation toward the base model, chosen before measuring)
keeps the outside set level (MRR 0.723 -> 0.724) but still loses a little on outside_b (0.647 -> 0.643,
Chinese hit@5 0.748 -> 0.733) and gains 1-2 points on test: too little for what shipping it would take
(a second query encoder exported with the LoRA merged, every learned part retrained on held-out vectors).
Not shipped.

The same tower trained for the answer's units instead (stop 55: each tune question against the candidate units of
its first passages, softmax at temperature 0.05 with the units holding a gold phrase as positives; rank 16, 12
epochs, lr 1e-3, the best of three settings on tune CV), its cosines in place of the unit adapter's: tune CV
evidence in answer 287 -> 293 of 374, but test 70.9% -> 69.9% (zh 63.0% -> 59.0%) and outside 68.75% -> 65.0%.
Not shipped either.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.engine import load_engine  # noqa: E402
from app.query_adapter import load_query_adapter  # noqa: E402
from app.ranking import load_ranker  # noqa: E402
from app.retriever import HybridRetriever  # noqa: E402
from app.settings import Settings  # noqa: E402
from eval.adapter_training import FOLDS, passage_loss, positive_mask, positives, train_adapter  # noqa: E402
from eval.memory_training import build_memory, resolve  # noqa: E402
from eval.question_set import (  # noqa: E402
    OUTSIDE_B_QUESTIONS,
    OUTSIDE_QUESTIONS,
    hash_fold,
    load_split,
    load_training_questions,
)
from eval.ranker_training import train_ranker  # noqa: E402
from eval.retrieval_eval import format_table, question_sets, score_sets  # noqa: E402
from indexer.embedder import default_model_path  # noqa: E402
from indexer.onnx_encoder import MAX_TOKENS, mean_pooled  # noqa: E402

BATCH = 32


class LoRA(torch.nn.Module):
    """A frozen linear layer plus a trainable low-rank update (zero at the start)."""

    def __init__(self, base: torch.nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base
        self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.T) @ self.b.T


class QueryTower:
    """MiniLM (mean pooling, unit length) with optional LoRA on its projections; fp32 torch."""

    def __init__(self, rank: int) -> None:
        from transformers import AutoModel, AutoTokenizer

        torch.manual_seed(0)
        self.tokenizer = AutoTokenizer.from_pretrained(default_model_path())
        self.model = AutoModel.from_pretrained(default_model_path())
        for p in self.model.parameters():
            p.requires_grad_(False)
        if rank > 0:
            for layer in self.model.encoder.layer:
                att = layer.attention.self
                att.query, att.value = LoRA(att.query, rank), LoRA(att.value, rank)
                layer.attention.output.dense = LoRA(layer.attention.output.dense, rank)
                layer.intermediate.dense = LoRA(layer.intermediate.dense, rank)
                layer.output.dense = LoRA(layer.output.dense, rank)
        self.model.eval()

    @property
    def dimension(self) -> int:
        return int(self.model.config.hidden_size)

    def encode(self, texts: list[str]) -> torch.Tensor:
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
        return mean_pooled(self.model(**enc).last_hidden_state, enc["attention_mask"])

    def vectors(self, texts: list[str]) -> np.ndarray:
        with torch.no_grad():
            rows = [self.encode(texts[k:k + BATCH]).numpy() for k in range(0, len(texts), BATCH)]
        return np.vstack(rows).astype(np.float32) if rows else np.zeros((0, self.dimension), np.float32)


def train_tower(texts: list[str], pos: list[list[int]], matrix: np.ndarray, args: argparse.Namespace) -> QueryTower:
    tower = QueryTower(args.rank)
    params = [p for p in tower.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    m = torch.tensor(matrix.astype(np.float32))
    idx = [i for i in range(len(texts)) if pos[i]]
    steps = args.epochs * math.ceil(len(idx) / BATCH)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10) * max(0.0, 1 - s / steps))
    rng = np.random.default_rng(0)
    tower.model.train()
    for _ in range(args.epochs):
        order = rng.permutation(idx)
        for k in range(0, len(order), BATCH):
            batch = order[k:k + BATCH]
            loss = passage_loss(tower.encode([texts[i] for i in batch]), m, positive_mask([pos[i] for i in batch], len(m)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    tower.model.eval()
    return tower


class TableEmbedder:
    """An `Embedder`: the vector a table holds for a text (a tune question's held-out vector), else the
    tower's."""

    def __init__(self, name: str, tower: QueryTower, table: dict[str, np.ndarray]) -> None:
        self.name, self.tower, self.cache = name, tower, dict(table)

    @property
    def dimension(self) -> int:
        return self.tower.dimension

    def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        self.cache.update(zip(missing, self.tower.vectors(missing), strict=True))
        return np.vstack([self.cache[t] for t in texts]).astype(np.float32)


def doc_pairs(chunks: list[Any], n: int) -> tuple[list[str], list[list[int]]]:
    """`n` sections at random: the heading trail -> the section's chunks."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(chunks):
        if c.source != "notes":
            groups.setdefault((c.path, c.heading), []).append(i)
    keys = sorted(groups)
    texts, pos = [], []
    for k in np.random.default_rng(1).permutation(len(keys))[:n]:
        c = chunks[groups[keys[k]][0]]
        texts.append(" > ".join(t for t in c.trail if t) or c.title)
        pos.append(groups[keys[k]])
    return texts, pos


def towers(retriever: HybridRetriever, args: argparse.Namespace) -> tuple[dict[str, np.ndarray], QueryTower]:
    """The held-out vectors of the tune questions' searched texts, and the tower trained on everything
    (`--docs-only`: one tower on the doc pairs alone, no question, so no fold needs its own)."""
    torch.set_num_threads(2)
    tune, extra = ([], []) if args.docs_only else (load_split("tune"), load_training_questions(retriever.index.chunks))
    both = tune + extra
    pos = positives(retriever, both)
    texts = [retriever.glossary.expand(q.question) for q in both]
    folds = np.array([hash_fold(q.id, FOLDS) for q in tune] + [-1] * len(extra))
    dtexts, dpos = doc_pairs(retriever.index.chunks, args.doc_pairs)
    # a tower is cached for these passage vectors and questions (another index or question set retrains)
    data = hashlib.sha1(retriever.matrix.tobytes() + "\n".join(texts + dtexts).encode()).hexdigest()[:12]
    tag = f"r{args.rank}e{args.epochs}lr{args.lr}d{args.doc_pairs}" + ("-docs-only" if args.docs_only else "") + f"-{data}"
    args.out.mkdir(parents=True, exist_ok=True)
    table: dict[str, np.ndarray] = {}
    last = None
    for fold in ["all"] if args.docs_only else [*range(FOLDS), "all"]:
        saved = args.out / f"{tag}_{fold}.pt"
        if saved.is_file():
            tower = QueryTower(args.rank)
            tower.model.load_state_dict(torch.load(saved), strict=False)
        else:
            t0 = time.time()
            inside = [i for i in range(len(both)) if fold == "all" or folds[i] != fold]
            tower = train_tower([texts[i] for i in inside] + dtexts, [pos[i] for i in inside] + dpos, retriever.matrix, args)
            torch.save({k: v for k, v in tower.model.state_dict().items() if k.endswith((".a", ".b"))}, saved)
            print(f"trained the tower without fold {fold} in {time.time() - t0:.0f} s", flush=True)
        if args.scale != 1.0:  # weight-space interpolation toward the base model (WiSE-FT)
            with torch.no_grad():
                for key, p in tower.model.named_parameters():
                    if key.endswith(".b"):
                        p.mul_(args.scale)
        if fold == "all":
            last = tower
        else:
            held = [i for i in range(len(tune)) if folds[i] == fold]
            table.update(zip([texts[i] for i in held], tower.vectors([texts[i] for i in held]), strict=True))
    assert last is not None
    return table, last


def pipeline(settings: Settings, embedder: TableEmbedder, work: Path, dev: Path) -> dict[str, Any]:
    """The memory, adapter and ranker rebuilt on tune with this encoder; the retrieval report and the
    ranker's CV."""
    engine = load_engine(settings.model_copy(update={"learned_ranking": False}), embedder=embedder)
    retriever = engine.retriever
    assert isinstance(retriever, HybridRetriever) and engine.index is not None
    tune = load_split("tune")
    retriever = retriever.with_options(question_memory=resolve(build_memory(retriever, tune), retriever))
    train_adapter(retriever, tune, work / "adapter.npz")
    retriever = retriever.with_options(query_adapter=load_query_adapter(work / "adapter.npz"))
    report = train_ranker(retriever, tune, work / "ranker.json")
    retriever = retriever.with_options(ranker=load_ranker(work / "ranker.json"))
    sets = question_sets(dev=dev, extra=[p for p in (OUTSIDE_QUESTIONS, OUTSIDE_B_QUESTIONS) if p.is_file()], chunks=engine.index.chunks)
    return {"cv": max(report["cv_mrr@10"].values()), "table": score_sets({"tower": retriever}, engine.index, sets)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=Path, default=Path("var/index"))
    ap.add_argument("--out", type=Path, default=Path("var/cache/query-tower"))
    ap.add_argument("--dev", type=Path, default=Path("../shared/eval/dev.jsonl"))
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--doc-pairs", type=int, default=0)
    ap.add_argument("--docs-only", action="store_true", help="train on the doc pairs alone (no question)")
    ap.add_argument("--scale", type=float, default=1.0, help="a trained tower's LoRA scaled by this (0: the base model)")
    ap.add_argument("--skip-base", action="store_true", help="measure the LoRA tower only")
    args = ap.parse_args()
    settings = Settings(index_dir=args.index)
    base = load_engine(settings.model_copy(update={"learned_ranking": False}))
    assert isinstance(base.retriever, HybridRetriever)
    name = base.retriever.embedder.name
    table, tower = towers(base.retriever, args)
    encoders = {"LoRA": TableEmbedder(name, tower, table)}
    if not args.skip_base:
        encoders = {"base": TableEmbedder(name, QueryTower(0), {}), **encoders}
    with tempfile.TemporaryDirectory() as tmp:
        for label, embedder in encoders.items():
            work = Path(tmp) / label
            work.mkdir()
            result = pipeline(settings, embedder, work, args.dev)
            print(f"== {label}: the ranker's tune CV MRR@10 {result['cv']:.4f}")
            print(format_table(result["table"]), flush=True)


if __name__ == "__main__":
    main()
