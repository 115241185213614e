"""The retriever's mechanics on a hand-made in-memory index (real FAISS and BM25, the hash embedder):
question clean-up, abbreviation words, section passages, notes placement,
the learned ranker's file, and the peers."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import bm25s
import faiss
import numpy as np
import pytest

from app.linear_model import LinearModel
from app.peer_retrievers import Bm25Retriever, DenseRetriever, RrfRetriever
from app.query import identifiers, split_question, without_config_blocks
from app.ranking import FEATURES, FeatureTable, QuerySignals, candidate_features, chunk_terms, load_ranker
from app.retriever import HybridRetriever, RetrievalOptions
from indexer.documents import Chunk
from indexer.embedder import HashEmbedder
from indexer.identifiers import ABBREVIATIONS, expansion
from indexer.store import LoadedIndex
from indexer.tokenize import tokenize


def _chunk(n: int, text: str, *, path: str = "docs/_tutorials/a.md", heading: str = "H", source: str = "docs") -> Chunk:
    return Chunk(id=f"c{n}", text=text, path=path, url="u", title="T", heading=heading, trail=("T", heading), source=source)


def _index(chunks: list[Chunk]) -> LoadedIndex:
    emb = HashEmbedder()
    vectors = emb.embed([c.search_text for c in chunks])
    flat = faiss.IndexFlatIP(emb.dimension)
    flat.add(vectors)
    bm25 = bm25s.BM25()
    with contextlib.redirect_stdout(None):
        bm25.index([tokenize(c.search_text) for c in chunks], show_progress=False)
    return LoadedIndex(path=Path("."), manifest={}, chunks=chunks, snippets={}, vectors=flat, bm25=bm25)


CHUNKS = [
    _chunk(0, "Pipeline parallelism splits layers into stages of a PipelineModule.", path="docs/_tutorials/pipe.md", heading="Pipeline"),
    _chunk(1, "Offload the optimizer states to the CPU with offload_optimizer.", heading="Offload"),
    _chunk(2, "The offload device can be cpu or nvme, and pin_memory pins the buffers.", heading="Offload"),
    _chunk(3, "Checkpoints are saved with save_checkpoint on every rank.", path="docs/_tutorials/ckpt.md", heading="Saving"),
    _chunk(4, "Our note: offload_optimizer to cpu needs the CPU Adam build.", path="corpus/notes/offload.md", heading="Offload", source="notes"),
    _chunk(5, "Tensor parallel (tp) sharding is set by tp_size in tensor_parallel.", path="docs/_tutorials/tp.md", heading="TP"),
]


def test_split_question_separates_the_ask_from_the_story() -> None:
    q = "We fine-tune a 13B model on 4 nodes of A100s. Training is fine otherwise. How do I offload the optimizer to CPU?"
    parts = split_question(q)
    assert parts.ask == "How do I offload the optimizer to CPU?"
    assert "13B model" in parts.context and parts.has_context
    assert split_question("What does overlap_comm do?").context == ""
    assert not split_question("Story one. Story two.").has_context  # nothing asks: all of it counts
    err = split_question("We use ZeRO-3 on 8 GPUs. RuntimeError: CUDA out of memory. Tried many things.")
    assert "RuntimeError" in err.ask
    zh = split_question("我们用 8 张 A100 训练。怎么开启 ZeRO-3 的 offload？")
    assert zh.ask.startswith("怎么") and "A100" in zh.context
    assert identifiers("set overlap_comm and deepspeed.zero.Init, not ZeRO") == {"overlap_comm", "deepspeed.zero.init", "zero.init"}


def test_a_config_block_written_inside_the_ask_is_context() -> None:
    """Its keys would outweigh the few words that ask: "With {...} how do I save the weights?" searched on the block
    ranked the page that says how below five config pages; written as a sentence of its own, the same block was context."""
    block = '{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "bf16": {"enabled": true}}'
    parts = split_question(f"With {block} how do I save the full model weights?")
    assert parts.ask == "With how do I save the full model weights?" and parts.context == block
    zh = split_question(f"用 {block} 的时候怎么保存完整的模型权重？")
    assert zh.ask == "用 的时候怎么保存完整的模型权重？" and zh.context == block
    story = split_question(f"My config is {block}. Training is slow. How do I save the weights?")
    assert story.ask == "How do I save the weights?" and block in story.context  # a block of the story stays where it is
    two = split_question("Is {'stage': 3} or {'stage': 2} faster for a 7B model?")  # a Python dict too, every block
    assert two.ask == "Is or faster for a 7B model?" and two.context == "{'stage': 3} {'stage': 2}"
    assert split_question(f"{block} why?").ask == f"{block} why?"  # too little else: the block is what is asked about
    assert split_question("How do I write {placeholders} in a path?").context == ""  # braces without keys are words
    cut = split_question('How do I fix this config {"fp16": {"enabled": true')  # pasted without its end
    assert cut.ask == "How do I fix this config" and cut.context.startswith('{"fp16"')
    # the path is what the text names, not its segments the tokenizer also gives
    assert identifiers("set zero_optimization.overlap_comm") == {"zero_optimization.overlap_comm"}
    # what the question memory is matched by: the question in words, every block out (a story's block too)
    assert without_config_blocks(f"My config is {block}. How do I save the weights?") == "My config is . How do I save the weights?"
    assert without_config_blocks("How do I write {placeholders} in a path?") == "How do I write {placeholders} in a path?"


def test_abbreviations_meet_their_words_both_ways() -> None:
    assert set(tokenize("gradient accumulation data type")) <= set(tokenize("grad_accum_dtype"))
    assert "checkpoint" in tokenize("ckpt") and {"tensor", "parallel"} <= set(tokenize("tp=8"))
    assert "checkpoint" not in tokenize("ckpt", expand=False)
    assert expansion("DP") == ["data", "parallel"] and expansion("zero") == []
    assert all(k == k.lower() and v for k, v in ABBREVIATIONS.items())


def test_notes_never_lead_and_only_one_is_shown() -> None:
    index = _index(CHUNKS)
    r = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(section_words=0))
    hits = r.search("offload_optimizer cpu note", 5).hits
    sources = [h.chunk.source for h in hits]
    assert sources.count("notes") == 1 and sources.index("notes") == 4  # the fifth of five
    assert [h.chunk.source for h in r.search("offload_optimizer cpu note", 3).hits].count("notes") <= 1
    free = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(section_words=0, notes_last=False))
    assert free.search("our note offload_optimizer cpu adam build", 5).hits[0].chunk.source == "notes"


def test_a_note_leads_only_when_the_ranker_puts_it_far_ahead_of_the_docs() -> None:
    """A question the docs hardly touch (torch.compile) was answered from pages that only share its words, the
    note that covers it fifth: with the ranker, a note scored more than the margin above the best of the docs
    leads; at or under the margin, or without a ranker (fused scores are on another scale), it stays where it is."""
    from app.retriever import Hit

    index = _index(CHUNKS)
    ranked = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(section_words=0, ranker=load_ranker()))

    def hits(note_score: float) -> list[Hit]:
        return [Hit(chunk=CHUNKS[i], score=s, bm25=0.0, dense=0.0) for i, s in ((1, 4.0), (3, 3.5), (4, note_score))]

    margin = ranked.options.note_lead_margin
    assert [h.chunk.source for h in ranked.note_leads(hits(4.0 + margin + 0.1))] == ["notes", "docs", "docs"]
    assert [h.chunk.id for h in ranked.note_leads(hits(4.0 + margin + 0.1))] == ["c4", "c1", "c3"]
    assert [h.chunk.source for h in ranked.note_leads(hits(4.0 + margin))] == ["docs", "docs", "notes"]
    fused = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(section_words=0))
    assert [h.chunk.source for h in fused.note_leads(hits(99.0))] == ["docs", "docs", "notes"]
    unplaced = ranked.with_options(notes_last=False)
    assert [h.chunk.source for h in unplaced.note_leads(hits(99.0))] == ["docs", "docs", "notes"]
    # a known failure of our notes leads when a message shows its text, never by score
    failure = replace(CHUNKS[4], path="corpus/notes/known-errors.md")
    known = [*hits(99.0)[:2], Hit(chunk=failure, score=99.0, bm25=0.0, dense=0.0)]
    assert [h.chunk.path for h in ranked.note_leads(known)][-1] == "corpus/notes/known-errors.md"


def test_section_passages_join_neighbours_within_the_budget() -> None:
    index = _index(CHUNKS)
    r = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(section_words=350))
    hits = r.search("pin_memory nvme offload device", 5).hits
    first = hits[0]
    assert "offload_optimizer" in first.chunk.text and "pin_memory" in first.chunk.text  # chunks 1 and 2 joined
    assert sum("pin_memory" in h.chunk.text for h in hits) == 1  # the neighbour is not returned again
    tight = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(section_words=15))
    assert tight.section_span(1) == (1,)
    assert r.section_span(3) == (3,)  # another section is never joined


def test_selection_skips_chunks_inside_a_taken_passage_and_near_duplicates() -> None:
    dup = _chunk(6, CHUNKS[3].text + " Again.", path="docs/_tutorials/other.md", heading="Copy")
    index = _index([*CHUNKS, dup])
    ids, scores = np.array([1, 2, 3, 6]), np.array([1.0, 0.9, 0.8, 0.7])
    joined = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(notes_last=False))
    assert [i for i, _ in joined.select(ids, scores, 4)] == [1, 3]  # 2 is inside 1's passage, 6 copies 3
    apart = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(section_words=0, notes_last=False, dedupe=False,
                                                                             one_per_section=False))
    assert [i for i, _ in apart.select(ids, scores, 4)] == [1, 2, 3, 6]
    # chunks 1 and 2 share page and headings: past the passage budget, one section still shows once
    capped = apart.with_options(one_per_section=True)
    assert [i for i, _ in capped.select(ids, scores, 4)] == [1, 3, 6]


def test_learned_ranker_file_round_trips_and_refuses_other_features(tmp_path: Path) -> None:
    n = len(FEATURES)
    ranker = LinearModel(FEATURES, np.zeros(n), np.ones(n), np.arange(n, dtype=float), 0.5, "test")
    path = tmp_path / "r.json"
    ranker.save(path)
    back = load_ranker(path)
    assert back is not None and np.allclose(back.weights, ranker.weights) and back.bias == 0.5
    rows = np.ones((2, n))
    assert np.allclose(back.score(rows), ranker.score(rows))
    path.write_text(path.read_text().replace('"bm25"', '"bm25_old"'))
    with pytest.raises(ValueError, match="retrain"):
        load_ranker(path)
    assert load_ranker(tmp_path / "absent.json") is None


def test_features_are_finite_and_shaped() -> None:
    index = _index(CHUNKS)
    terms = [chunk_terms(c) for c in CHUNKS]
    spans = [(0,), (1, 2), (1, 2), (3,), (4,), (5,)]  # chunks 1 and 2 share a section: one passage
    z = np.zeros(len(CHUNKS), dtype=np.float32)
    cos = np.array([0.1, 0.2, 0.6, 0.1, 0.3, 0.0], dtype=np.float32)
    q = QuerySignals(z + 1, z, cos, frozenset(tokenize("offload nvme")), frozenset({"offload_optimizer"}), False)
    rows = candidate_features(np.arange(len(index.chunks)), q, FeatureTable(terms, spans))
    assert rows.shape == (len(CHUNKS), len(FEATURES)) and np.isfinite(rows).all()
    assert rows[1, FEATURES.index("ident_match")] == 1.0 and rows[0, FEATURES.index("ident_match")] == 0.0
    col = FEATURES.index
    # chunk 1 lacks "nvme" but its passage (with chunk 2) holds it, and chunk 2's cosine is the passage's best
    assert rows[1, col("text_cover")] < rows[1, col("span_cover")] == rows[2, col("span_cover")] == 1.0
    assert rows[1, col("span_cos")] == rows[2, col("span_cos")] == 0.0 and rows[1, col("cos_gap")] < 0
    assert rows[4, col("span_cover")] == rows[4, col("text_cover")]  # a note is a passage of its own
    assert rows[1, col("src_api")] == 0 and rows[0, col("log_words")] == np.log1p(len(CHUNKS[0].text.split()))


def test_shipped_ranker_matches_this_version() -> None:
    assert load_ranker() is not None  # app/ranker.json: trained by `dsqa eval train-ranker`


def test_peers_stand_alone() -> None:
    index = _index(CHUNKS)
    for peer in (Bm25Retriever(index), DenseRetriever(index, HashEmbedder()), RrfRetriever(index, HashEmbedder())):
        assert not isinstance(peer, HybridRetriever)
        hits = peer.search("save_checkpoint on every rank", 3).hits
        assert hits and hits[0].chunk.id == "c3"
    assert Bm25Retriever(index).search("offload", 5, source="notes").hits[0].chunk.source == "notes"


def test_signals_name_the_identifiers_the_index_never_holds() -> None:
    """A key or `deepspeed.` path no chunk or heading names is marked unknown (the coverage decision
    reads it: the docs cannot cover what they never name); one the index holds is not."""
    r = HybridRetriever(_index(CHUNKS), HashEmbedder(), options=RetrievalOptions(section_words=0))
    _, q = r.signals("We train on 8 GPUs. How do I set offload_optimizer and deepspeed.init_auto_parallel together?")
    assert "offload_optimizer" in q.ask_identifiers and "deepspeed.init_auto_parallel" in q.ask_identifiers
    assert q.unknown_identifiers == frozenset({"deepspeed.init_auto_parallel"})
    _, known = r.signals("Where does tp_size go?")
    assert known.unknown_identifiers == frozenset()


def test_signals_count_the_ask_words_no_passage_holds() -> None:
    """The coverage decision reads how many of the ask's words appear nowhere in the index (a GPU or
    product the docs never name): words any chunk or heading holds do not count."""
    r = HybridRetriever(_index(CHUNKS), HashEmbedder(), options=RetrievalOptions(section_words=0))
    _, q = r.signals("Does offload to nvme work on a Gaudi3 with MI300X cards?")
    assert q.unseen_terms == sum(1 for t in q.ask_terms if t in {"gaudi3", "mi300x", "card", "work"})
    assert q.unseen_terms >= 2
    _, known = r.signals("How do I offload the optimizer to nvme?")
    assert known.unseen_terms == 0


def test_unit_cosines_take_each_chunks_best_sentence() -> None:
    """The ranker's `unit_cos`: per chunk, the best cosine over its own text units' vectors; a chunk
    without units keeps its whole-chunk cosine."""
    from indexer.text_units import Unit

    emb = HashEmbedder()
    texts = [["Pipeline parallelism splits layers.", "Stages of a PipelineModule."], [], ["The offload device can be cpu."], [], [], []]
    index = replace(_index(CHUNKS), units=[[Unit(t, 0) for t in row] for row in texts],
                    unit_vectors=emb.embed([t for row in texts for t in row]))
    r = HybridRetriever(index, emb, options=RetrievalOptions(section_words=0))
    v = emb.embed(["Stages of a PipelineModule."])[0]
    cos = r.matrix @ v
    best = r.unit_cosines(v, cos)
    assert best[0] == pytest.approx(float(max(index.unit_vectors[:2] @ v)))
    assert best[0] == pytest.approx(1.0, abs=1e-5)  # the second sentence is the query itself
    assert best[2] == pytest.approx(float(index.unit_vectors[2] @ v))
    assert all(best[i] == pytest.approx(cos[i]) for i in (1, 3, 4, 5))


@pytest.mark.parametrize(("question", "unknowable"), [
    ("When will DeepSpeed 1.0 be released?", True),
    ("How much does an 8x H100 node cost per hour?", True),
    ("Would you pick Megatron-LM over DeepSpeed for a 30B model?", True),
    ("How many tokens/s does ZenFlow reach on one 4090?", True),
    ("0.20.0 预计什么时候发？", True),
    ("买 4090 还是 L40S 更划算？", True),
    ("How do I enable ZeRO stage 3 with CPU offload?", False),
    ("zero_optimization.overlap_comm 有什么用？", False),
])
def test_asks_for_what_docs_never_hold(question: str, unknowable: bool) -> None:
    from app.query import asks_unknowable

    assert asks_unknowable(question) is unknowable


def test_query_adapter_moves_only_the_query_and_round_trips(tmp_path: Path) -> None:
    from app.query_adapter import QueryAdapter, load_query_adapter

    index = _index(CHUNKS)
    dim = HashEmbedder().dimension
    rng = np.random.default_rng(0)
    adapter = QueryAdapter((rng.standard_normal((dim, dim)) * 0.05).astype(np.float32), "hash-64", "test")
    moved = adapter.apply(np.ones((2, dim), dtype=np.float32))
    assert np.allclose(np.linalg.norm(moved, axis=1), 1.0, atol=1e-5)
    plain = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(section_words=0))
    adapted = plain.with_options(query_adapter=adapter)
    _, base = plain.signals("offload the optimizer to cpu")
    _, q = adapted.signals("offload the optimizer to cpu")
    assert base.query_vector is not None and q.query_vector is not None
    assert np.allclose(q.query_vector, adapter.apply(base.query_vector), atol=1e-5)  # what the answer's units are scored with
    assert np.allclose(q.cos, plain.matrix @ adapter.apply(base.query_vector), atol=1e-5)
    assert not np.allclose(q.cos, base.cos)
    assert np.array_equal(q.bm25, base.bm25)
    path = adapter.save(tmp_path / "a.npz")
    loaded = load_query_adapter(path)
    assert loaded is not None and loaded.encoder == "hash-64" and loaded.trained_on == "test"
    assert np.allclose(loaded.delta, adapter.delta, atol=1e-3)  # stored as float16
    assert load_query_adapter(tmp_path / "missing.npz") is None
    np.savez(tmp_path / "bad.npz", delta=np.ones((2, 3)), encoder=np.array("x"), trained_on=np.array(""))
    with pytest.raises(ValueError, match="square"):
        load_query_adapter(tmp_path / "bad.npz")
    wrong = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(
        section_words=0, query_adapter=QueryAdapter(np.zeros((8, 8), dtype=np.float32), "other")))
    assert np.allclose(wrong.signals("offload")[1].cos, plain.signals("offload")[1].cos)  # another size: not applied


def test_adapter_fit_moves_questions_toward_their_passages() -> None:
    """The fit on synthetic vectors: each question sits nearer a wrong chunk than its own, and after
    fitting on the others, its own passage ranks first more often than before."""
    from eval.adapter_training import fit_delta

    rng = np.random.default_rng(1)
    dim, n_chunks = 16, 40
    matrix = rng.standard_normal((n_chunks, dim)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    shift = rng.standard_normal(dim).astype(np.float32)  # the users' wording, the same for every question
    gold = rng.integers(0, n_chunks, 60)
    vectors = matrix[gold] + 1.5 * shift / np.linalg.norm(shift) + 0.1 * rng.standard_normal((60, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    pos = [[int(g)] for g in gold]
    delta = fit_delta(vectors[:40], pos[:40], matrix, lam=0.01)

    def first(vs: np.ndarray) -> int:
        return sum(int(np.argmax(matrix @ v) == g) for v, g in zip(vs, gold[40:], strict=True))

    from app.query_adapter import QueryAdapter

    before, after = first(vectors[40:]), first(QueryAdapter(delta, "x").apply(vectors[40:]))
    assert after > before + 5, (before, after)


def test_unit_adapter_fit_moves_questions_toward_their_answering_units() -> None:
    """The answer's unit adapter on synthetic vectors: each question has its own candidate units (a few
    per question, of different counts), its answering unit offset by the same shift as the wording of
    every question; after fitting on some questions, the answering unit of the others ranks first more
    often than before, and a question without an answering unit teaches nothing."""
    from app.query_adapter import QueryAdapter
    from eval.unit_adapter_training import fit_unit_delta

    rng = np.random.default_rng(2)
    dim = 16
    shift = rng.standard_normal(dim).astype(np.float32)
    queries, units, labels = [], [], []
    for i in range(80):
        cands = rng.standard_normal((5 + i % 4, dim)).astype(np.float32)
        cands /= np.linalg.norm(cands, axis=1, keepdims=True)
        gold = int(rng.integers(0, len(cands)))
        q = cands[gold] + 3.0 * shift / np.linalg.norm(shift) + 0.1 * rng.standard_normal(dim).astype(np.float32)
        queries.append(q / np.linalg.norm(q))
        units.append(cands)
        labels.append(np.eye(len(cands), dtype=np.int64)[gold])
    delta = fit_unit_delta(queries[:50], units[:50], labels[:50], lam=0.01)
    none = [np.zeros_like(y) for y in labels[:50]]
    with pytest.raises(ValueError, match="nothing to learn"):
        fit_unit_delta(queries[:50], units[:50], none)

    def first(move: bool) -> int:
        return sum(int(np.argmax(u @ (QueryAdapter(delta, "x").apply(q) if move else q)) == int(np.argmax(y)))
                   for q, u, y in zip(queries[50:], units[50:], labels[50:], strict=True))

    before, after = first(False), first(True)
    assert after > before + 8, (before, after)


def test_a_passage_grows_into_its_subsections_then_its_parent_section() -> None:
    def part(n: int, text: str, trail: tuple[str, ...], path: str = "docs/_tutorials/zero.md") -> Chunk:
        return Chunk(id=f"p{n}", text=text, path=path, url="u", title="ZeRO", heading=trail[-1], trail=trail, source="docs")

    chunks = [
        part(0, "ZeRO partitions the model states across the data parallel ranks.", ("ZeRO", "Stages")),
        part(1, "Stage 3 also partitions the parameters themselves.", ("ZeRO", "Stages", "Stage 3")),
        part(2, "Offload moves the optimizer states to CPU memory.", ("ZeRO", "Offload")),
        part(3, "Pipeline stages hold consecutive layers.", ("Pipeline",), path="docs/_tutorials/pipe.md"),
    ]
    index = _index(chunks)
    grown = HybridRetriever(index, HashEmbedder(), options=RetrievalOptions(section_words=350))
    assert grown.section_span(0) == (0, 1, 2)  # its subsection, then its sibling under the page's title
    assert grown.section_span(1) == (0, 1)  # a subsection grows up into the section that holds it, no further
    assert grown.section_span(2) == (0, 1, 2)  # a top-level section: its parent is the page
    assert grown.section_span(3) == (3,)  # another page is never joined
    text = grown.passage(0).text
    assert text.index("### Stage 3\n\nStage 3 also") < text.index("### Offload\n\nOffload moves")  # each part headed
    assert not text.startswith("###")  # the ranked chunk's own section opens unheaded
    own = grown.with_options(passage_scopes=("section",))
    assert own.section_span(0) == (0,) and own.passage(0).text == chunks[0].text
    sub = grown.with_options(passage_scopes=("section", "subsections"))
    assert sub.section_span(0) == (0, 1) and sub.section_span(2) == (2,)
    tight = grown.with_options(section_words=20)  # 10 + 7 words fit, the third part's 8 do not
    assert tight.section_span(0) == (0, 1)
