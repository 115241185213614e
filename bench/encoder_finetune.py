"""Domain-adapted encoder, measured (not shipped): fine-tune MiniLM on pairs the docs give for free and
compare it with the base model, dense alone and inside the hybrid (ranker retrained on `tune` for each
encoder), on the tune and test splits and the dev set, in one run.

    .venv/bin/python bench/encoder_finetune.py [--steps 80] [--index var/index] [--out var/cache/ft-bench]

Pairs: a chunk's last two headings -> its text, and inverse cloze (a sentence of a chunk -> the chunk
without it, 90% of the time), two sentences per chunk; in-batch negatives (symmetric multiple-negatives
ranking loss, scale 20), at most one pair per chunk in a batch; seed 0, 2 threads, max 128 tokens.
Measured at 80 steps (4.7 min on 2 cores): see the closing note of issue 9 and the table this prints.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import faiss  # noqa: E402

from app.engine import load_engine  # noqa: E402
from app.peer_retrievers import DenseRetriever  # noqa: E402
from app.ranking import load_ranker  # noqa: E402
from app.retriever import HybridRetriever, Retriever  # noqa: E402
from app.settings import Settings  # noqa: E402
from eval.ranker_training import train_ranker  # noqa: E402
from eval.retrieval_eval import format_table, question_sets, score_sets  # noqa: E402
from indexer.embedder import SentenceTransformerEmbedder, default_model_path  # noqa: E402
from indexer.store import LoadedIndex  # noqa: E402
from indexer.text_units import text_units  # noqa: E402


def doc_pairs(index: LoadedIndex, seed: int = 0) -> list[tuple[str, str, int]]:
    """(anchor, positive, chunk number) pairs from the index's own chunks."""
    rng = random.Random(seed)
    pairs: list[tuple[str, str, int]] = []
    for i, chunk in enumerate(index.chunks):
        if chunk.trail:
            pairs.append((" ".join(t for t in chunk.trail[-2:] if t), chunk.text, i))
        sentences = [u.text for u in text_units(chunk.text) if len(u.text.split()) >= 6]
        for s in rng.sample(sentences, min(2, len(sentences))):
            pairs.append((s, chunk.search_text.replace(s, "") if rng.random() < 0.9 else chunk.search_text, i))
    rng.shuffle(pairs)
    return pairs


def fine_tune(pairs: list[tuple[str, str, int]], steps: int, out: Path, batch: int = 32) -> float:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = SentenceTransformer(default_model_path(), device="cpu")
    model.max_seq_length = 128
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-5)
    model.train()

    def encode(texts: list[str]) -> torch.Tensor:
        features = model.preprocess(texts)
        return torch.nn.functional.normalize(model(features)["sentence_embedding"], dim=-1)

    started, pos = time.perf_counter(), 0
    for step in range(steps):
        chosen: list[tuple[str, str]] = []
        seen: set[int] = set()
        while len(chosen) < batch:
            anchor, positive, i = pairs[pos % len(pairs)]
            pos += 1
            if i not in seen:
                seen.add(i)
                chosen.append((anchor, positive))
        sim = encode([a for a, _ in chosen]) @ encode([p for _, p in chosen]).T * 20.0
        target = torch.arange(len(chosen))
        loss = (torch.nn.functional.cross_entropy(sim, target) + torch.nn.functional.cross_entropy(sim.T, target)) / 2
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if step % 10 == 9:
            print(f"step {step + 1}/{steps} loss {loss.item():.3f} {time.perf_counter() - started:.0f} s", flush=True)
    model.save(str(out))
    return time.perf_counter() - started


def with_encoder(index: LoadedIndex, shipped: HybridRetriever, embedder: SentenceTransformerEmbedder, tune: list,  # type: ignore[type-arg]
                 work: Path) -> tuple[dict[str, Retriever], LoadedIndex]:
    vectors = embedder.embed([c.search_text for c in index.chunks], batch_size=64)
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    idx = replace(index, vectors=flat)
    base = HybridRetriever(idx, embedder, shipped.glossary, replace(shipped.options, ranker=None, abstention=None))
    out = work / f"ranker-{embedder.name}.json"
    train_ranker(base, tune, out)
    return {"dense": DenseRetriever(idx, embedder, shipped.glossary),
            "hybrid": base.with_options(ranker=load_ranker(out))}, idx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=Path, default=Path("var/index"))
    ap.add_argument("--dev", type=Path, default=Path("../shared/eval/dev.jsonl"))
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    engine = load_engine(Settings(index_dir=args.index))
    index, shipped = engine.require()
    assert isinstance(shipped, HybridRetriever)
    sets = question_sets(dev=args.dev)
    work = Path(tempfile.mkdtemp(prefix="dsqa-ft-"))
    out = args.out or work / "model"
    pairs = doc_pairs(index)
    print(f"{len(pairs)} pairs from {len(index.chunks)} chunks; {args.steps} steps")
    seconds = fine_tune(pairs, args.steps, out)
    print(f"fine-tuned in {seconds:.0f} s -> {out}")
    for label, path in (("base", None), ("tuned", str(out))):
        embedder = SentenceTransformerEmbedder(path)
        embedder.name = f"{label}-encoder"
        retrievers, idx = with_encoder(index, shipped, embedder, sets["tune"], work)
        print(f"\n{label} encoder")
        print(format_table(score_sets(retrievers, idx, sets)))


if __name__ == "__main__":
    main()
