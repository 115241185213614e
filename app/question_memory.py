"""Questions already answered: the `tune` split's questions and the passages that answer them, as a
retrieval signal for a new question that resembles one of them.

DeepSpeed users ask the same things again in other words (how much CPU RAM offload needs, why a
saved checkpoint is tiny, what ZeRO stage 2 shards). For each question of the `tune` split (and
each training-only question of `eval/training/`) the memory keeps the encoder's vector of the question and which chunks' passages hold its gold evidence
(`eval/memory_training.py`, `dsqa eval train-memory`). A new question's `seen` score of a chunk is
the best cosine between it and a remembered question answered by that chunk (0 for a chunk no
remembered question is answered by); the learned ranker reads it as one feature among the others.
Only a close resemblance counts: the score is the cosine's excess over SEEN_FLOOR. The floor was
chosen by the ranker's 5-fold cross-validated MRR@10 on tune: no memory 0.7324; the raw cosine
0.7429; floors 0.4 / 0.5 / 0.55 / 0.6 / 0.65 / 0.7: 0.7321 / 0.7435 / 0.7435 / 0.7473 / 0.7515 / 0.7464.

The same memory guides the answer: per entry it also keeps the keys of the text units (sentences,
list items, config rows) that hold one of the question's gold phrases, and a new question's
`seen_units` gives each such unit the best cosine with a remembered question it answered, less
UNIT_SEEN_FLOOR; the answer's unit scorer reads it (`app/answer.py`, "seen"). Its floor, by the unit
scorer's 5-fold cross-validated evidence-in-answer on tune: no unit memory 0.6925; floors 0.5 / 0.6:
0.7353 / 0.7219.

Besides the vector, a question is remembered by its words: the TF-IDF of its character n-grams
(`app/char_tfidf.py`), and a new question's `seen_lex` score of a chunk is the best such cosine with a
remembered question that chunk answers, less LEXICAL_FLOOR. It hears what the encoder's vector blurs:
the identifiers, error texts and Chinese terms two questions share. Chosen by the same cross-validated
MRR@10 (ranker rows of stop 48; 0.7521 with the vector memory alone): floors 0 / 0.1 / 0.15 / 0.2 / 0.25
/ 0.3 / 0.4 / 0.5: 0.7739 / 0.7795 / 0.7733 / 0.7862 / 0.7818 / 0.7737 / 0.7560 / 0.7551.

What is stored is ours: our questions' vectors and character n-grams (not their text) and, per question, 16 hex digits of
the sha256 of each answering chunk's normalised text, resolved against the loaded index's chunks (a
chunk whose text changed in another docs version no longer matches, and its entry just drops). Each
entry keeps its question's origin (the GitHub thread it came from), so an evaluation can leave out
the remembered questions of the same thread as the question scored. Pure numpy at query time (one
product with a few hundred vectors). Shipped in `app/question_memory.npz`, for the encoder whose
vectors it holds only.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from app.char_tfidf import CharTfidf
from app.stored_arrays import save_npz

MEMORY_FILE = Path(__file__).resolve().parent / "question_memory.npz"
_ALNUM = re.compile(r"[^\W_]+")
SEEN_FLOOR = 0.65  # a cosine with a remembered question at or below this is no resemblance
LEXICAL_FLOOR = 0.2  # the same for the cosine of the questions' character n-gram TF-IDF
LEXICAL_PREFIX = "lexical_"
UNIT_SEEN_FLOOR = 0.5  # the same for the units an answer quotes


@lru_cache(maxsize=1 << 16)
def chunk_key(text: str) -> str:
    """A chunk's (or a text unit's) identity across index builds: 16 hex digits of the sha256 of its
    normalised text (cached: an answer keys the same units query after query)."""
    norm = " ".join(_ALNUM.findall(text.lower()))
    return hashlib.sha256(norm.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class LexicalEntries:
    """The remembered questions' character n-gram TF-IDF rows, stored by n-gram (compressed columns):
    which entries hold each n-gram, and how much."""

    tfidf: CharTfidf
    indptr: np.ndarray  # (n-grams + 1,): where each n-gram's entries start in `rows` and `values`
    rows: np.ndarray  # the entry of each stored value
    values: np.ndarray

    def cosines(self, text: str, entries: int) -> np.ndarray:
        """The cosine of `text`'s row with each of the `entries` remembered rows."""
        cols, weights = self.tfidf.vector(text)
        if not len(cols):
            return np.zeros(entries)
        starts, ends = self.indptr[cols], self.indptr[cols + 1]
        lengths = ends - starts
        at = np.repeat(ends - np.cumsum(lengths), lengths) + np.arange(int(lengths.sum()))  # every stored value of those n-grams
        return np.bincount(self.rows[at], weights=self.values[at] * np.repeat(weights, lengths), minlength=entries)

    def arrays(self) -> dict[str, np.ndarray]:
        return {**self.tfidf.arrays(LEXICAL_PREFIX), f"{LEXICAL_PREFIX}indptr": self.indptr.astype(np.int64),
                f"{LEXICAL_PREFIX}rows": self.rows.astype(np.int32), f"{LEXICAL_PREFIX}values": self.values.astype(np.float32)}

    @classmethod
    def from_arrays(cls, data: Any, entries: int) -> LexicalEntries | None:
        tfidf = CharTfidf.from_arrays(data, LEXICAL_PREFIX)
        if tfidf is None:
            return None
        indptr, rows = data[f"{LEXICAL_PREFIX}indptr"].astype(np.int64), data[f"{LEXICAL_PREFIX}rows"].astype(np.int64)
        values = data[f"{LEXICAL_PREFIX}values"].astype(np.float64)
        if len(indptr) != len(tfidf.idf) + 1 or indptr[-1] != len(rows) or len(rows) != len(values) \
                or (len(rows) and not 0 <= rows.min() <= rows.max() < entries) or not np.isfinite(values).all():
            raise ValueError("its n-gram rows do not fit its entries")
        return cls(tfidf, indptr, rows, values)


@dataclass(frozen=True)
class QuestionMemory:
    vectors: np.ndarray  # (entries, dimension), unit length: the encoder's vector of each question
    answers: tuple[tuple[str, ...], ...]  # per entry, the chunk keys of the chunks that answer it
    ids: tuple[str, ...]  # per entry, the question's id in our set
    origins: tuple[str, ...]  # per entry, where the question came from ("" when unknown)
    encoder: str
    trained_on: str = ""
    active: np.ndarray | None = None  # per entry, whether it is searched (None: all)
    units: tuple[tuple[str, ...], ...] = ()  # per entry, the keys of the text units holding a gold phrase (() : none kept)
    lexical: LexicalEntries | None = None  # the entries' character n-gram TF-IDF (None: a memory stored before it)

    @property
    def dimension(self) -> int:
        return int(self.vectors.shape[1])

    def without(self, drop: Iterable[int]) -> QuestionMemory:
        """The same memory with some entries left out (an evaluation's own question, its thread)."""
        active = np.ones(len(self.origins), dtype=bool) if self.active is None else self.active.copy()
        active[list(drop)] = False
        return replace(self, active=active)

    def related(self, question_id: str, origin: str) -> list[int]:
        """The entries of this question and of other questions from the same thread (an origin naming
        one issue or discussion, `owner/repo#N`): what an evaluation of the question leaves out."""
        thread = "#" in origin
        return [i for i, (q, o) in enumerate(zip(self.ids, self.origins, strict=True))
                if q == question_id or (thread and o == origin)]

    def save(self, path: Path) -> Path:
        """Written beside itself and renamed into place, so a reader never sees half a file."""
        return save_npz(
            path,
            vectors=self.vectors.astype(np.float16),
            answers=np.array([" ".join(a) for a in self.answers]),
            unit_answers=np.array([" ".join(u) for u in self.units] if self.units else [""] * len(self.answers)),
            ids=np.array(self.ids),
            origins=np.array(self.origins),
            encoder=np.array(self.encoder),
            trained_on=np.array(self.trained_on),
            **(self.lexical.arrays() if self.lexical is not None else {}),
        )


class ChunkMemory:
    """A memory resolved against one index's chunks: per chunk, which entries it answers."""

    def __init__(self, memory: QuestionMemory, keys: Sequence[str]):
        self.memory = memory
        self.n_chunks = len(keys)
        where: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            where.setdefault(key, []).append(i)
        entry, chunk = [], []
        for e, answers in enumerate(memory.answers):
            for key in answers:
                for i in where.get(key, ()):
                    entry.append(e)
                    chunk.append(i)
        self.entry = np.array(entry, dtype=np.int64)
        self.chunk = np.array(chunk, dtype=np.int64)
        self.resolved = len(set(entry))  # entries with at least one answering chunk in this index
        self.has_units = any(memory.units)

    def without(self, drop: Iterable[int]) -> ChunkMemory:
        other = object.__new__(ChunkMemory)
        other.__dict__.update(self.__dict__)
        other.memory = self.memory.without(drop)
        return other

    def cosines(self, vector: np.ndarray) -> np.ndarray:
        """The cosine of `vector` with each entry, -1 (no resemblance) for a left-out one: the one
        product `best`, `seen` and `seen_units` all read."""
        sims = self.memory.vectors @ np.asarray(vector, dtype=np.float32)
        return sims if self.memory.active is None else np.where(self.memory.active, sims, np.float32(-1.0))

    def best(self, cosines: np.ndarray) -> float:
        """The best cosine with any active entry (how close the question comes to one already
        answered; the coverage decision reads it). 0 for an empty memory."""
        active = self.memory.active
        return float(cosines.max()) if len(cosines) and (active is None or active.any()) else 0.0

    def seen(self, cosines: np.ndarray) -> np.ndarray:
        """Per chunk, the best cosine with an active entry that chunk answers, less SEEN_FLOOR (0 for
        none and for any at or below the floor)."""
        return self._best_per_chunk(cosines, SEEN_FLOOR)

    def seen_lexical(self, question: str) -> np.ndarray | None:
        """Per chunk, the best character n-gram cosine of `question` with an active entry that chunk
        answers, less LEXICAL_FLOOR (None for a memory without the n-grams)."""
        lexical = self.memory.lexical
        if lexical is None:
            return None
        sims = lexical.cosines(question, len(self.memory.ids))
        if self.memory.active is not None:
            sims = np.where(self.memory.active, sims, 0.0)
        return self._best_per_chunk(sims, LEXICAL_FLOOR)

    def _best_per_chunk(self, sims: np.ndarray, floor: float) -> np.ndarray:
        """Per chunk, the best of the entries' `sims` over the entries that chunk answers, less `floor`
        (0 for none and for any at or below the floor)."""
        out = np.zeros(self.n_chunks, dtype=np.float32)
        if len(self.entry):
            np.maximum.at(out, self.chunk, np.maximum(sims - floor, 0.0)[self.entry].astype(np.float32))
        return out

    def seen_units(self, cosines: np.ndarray) -> dict[str, float]:
        """Per text unit key, the best cosine with an active entry that unit answers, less
        UNIT_SEEN_FLOOR; units of no entry above the floor are left out."""
        if not self.has_units:
            return {}
        sims = cosines - UNIT_SEEN_FLOOR
        out: dict[str, float] = {}
        for e in np.flatnonzero(sims > 0.0):
            for key in self.memory.units[e]:
                out[key] = max(out.get(key, 0.0), float(sims[e]))
        return out


def load_question_memory(path: Path = MEMORY_FILE) -> QuestionMemory | None:
    """The shipped memory, or None without the file."""
    if not Path(path).is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        vectors = data["vectors"].astype(np.float32)
        answers = tuple(tuple(str(a).split()) for a in data["answers"])
        ids = tuple(str(q) for q in data["ids"])
        origins = tuple(str(o) for o in data["origins"])
        units = tuple(tuple(str(u).split()) for u in data["unit_answers"]) if "unit_answers" in data else ((),) * len(answers)
        if vectors.ndim != 2 or not np.isfinite(vectors).all() or not len(vectors) == len(answers) == len(ids) == len(origins) == len(units):
            raise ValueError(f"{path}: the question memory is not one finite vector, answer list, id and origin per entry: retrain it")
        try:
            lexical = LexicalEntries.from_arrays(data, len(ids))
        except ValueError as exc:
            raise ValueError(f"{path}: the question memory's n-grams: {exc}: retrain it") from exc
        return QuestionMemory(vectors, answers, ids, origins, str(data["encoder"]), str(data["trained_on"]), units=units, lexical=lexical)
