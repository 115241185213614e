"""Questions the docs do not answer, remembered: a signal for the coverage decision.

Users ask again what the docs never hold, in other words: a GPU's price, a release's date, another
library's flag, an opinion, a config key DeepSpeed never had. The coverage decision (`app/coverage.py`)
reads, besides what the search found, how closely a new question resembles one of the `tune` half of
`eval/unanswerable.jsonl`: the best cosine between the encoder's base vectors, less REFUSAL_FLOOR (0
below it). Only a close resemblance counts: MiniLM's cosine is mostly about the topic (a hostfile
question sits at 0.55-0.7 from an unanswerable one about hostfiles), so a low floor taught the decision
to refuse answerable questions on the same topic.

The floor was chosen by 5-fold cross-validation on tune (four fold assignments; 374 answerable, 210
unanswerable; each fold's memory holds only its training negatives, a negative never sees itself),
as the highest refusal of unanswerable questions whose false refusal of answerable ones stays at or
under the decision without the memory (2.34% / 77.5%): floor 0 2.81% / 81.6%; 0.5 2.81% / 81.9%;
0.6 2.21% / 79.6%; 0.65 2.14% / 78.3%; 0.7 2.34% / 78.3% (floors 0.02 apart were not told apart).

Beside the nearest-question resemblance, the memory holds a linear reading of the question vector
(`leaning`): a logistic regression over the base vectors of the tune answerable questions against the
tune unanswerable ones, whose logit says how much a question leans toward the kinds the docs never
answer (an opinion, an expected figure, another library's flag) even when no remembered question is
close. The resemblance catches a rephrasing of one remembered question; the leaning, what many share.
A third reading, of the ask's words rather than its vector (`app/wording_probe.py`), is stored beside them.

What is stored is ours: the vectors of our own questions, not their text (the wording probe keeps
character n-grams of at most four characters and their weights). Written by `dsqa eval
train-abstention` beside the decision (`app/refusal_memory.npz`), for the encoder whose vectors it holds
only. Pure numpy at query time (one product with a few hundred vectors).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.stored_arrays import save_npz
from app.wording_probe import WordingProbe

REFUSAL_MEMORY_FILE = Path(__file__).resolve().parent / "refusal_memory.npz"
REFUSAL_FLOOR = 0.6
WORDING_PREFIX = "wording_"


@dataclass(frozen=True)
class RefusalMemory:
    vectors: np.ndarray  # (questions, dimension), unit length
    encoder: str
    trained_on: str = ""
    probe: np.ndarray | None = None  # (dimension + 1,): weights then bias of the leaning toward unanswerable
    wording: WordingProbe | None = None  # the leaning of the ask's words (`app/wording_probe.py`)

    @property
    def dimension(self) -> int:
        return int(self.vectors.shape[1])

    def cosines(self, vectors: np.ndarray) -> np.ndarray:
        """Cosine of each given vector (rows) with each remembered question (columns)."""
        return np.atleast_2d(np.asarray(vectors, dtype=np.float32)) @ self.vectors.T

    def resemblance(self, vector: np.ndarray) -> float:
        """How far the question's best cosine with a remembered one rises over the floor (0 below it)."""
        if not len(self.vectors):
            return 0.0
        return excess(float(self.cosines(vector).max()))

    def leaning(self, vector: np.ndarray) -> float | None:
        """The probe's logit for the question's base vector: above 0 it leans toward unanswerable (None
        without a probe)."""
        if self.probe is None:
            return None
        return float(probe_logit(self.probe, np.asarray(vector, dtype=np.float32)))

    def wording_leaning(self, question: str) -> float | None:
        """The wording probe's logit for the question (None without one)."""
        return None if self.wording is None else self.wording.logit(question)

    def save(self, path: Path) -> Path:
        """Written beside itself and renamed into place, so a reader never sees half a file."""
        probe = {} if self.probe is None else {"probe": self.probe.astype(np.float32)}
        wording = {} if self.wording is None else self.wording.arrays(WORDING_PREFIX)
        return save_npz(path, vectors=self.vectors.astype(np.float16), encoder=np.array(self.encoder),
                        trained_on=np.array(self.trained_on), **probe, **wording)


def probe_logit(probe: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """The leaning probe's logit of each vector (or of one): `probe` holds the weights, then the bias."""
    return vectors @ probe[:-1] + probe[-1]


def excess(cosine: float) -> float:
    return max(cosine - REFUSAL_FLOOR, 0.0)


def load_refusal_memory(path: Path = REFUSAL_MEMORY_FILE) -> RefusalMemory | None:
    """The shipped memory, or None without the file."""
    if not Path(path).is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        vectors = data["vectors"].astype(np.float32)
        if vectors.ndim != 2 or not np.isfinite(vectors).all():
            raise ValueError(f"{path}: the refusal memory is not a finite matrix: retrain the coverage decision")
        probe = data["probe"].astype(np.float64) if "probe" in data.files else None
        if probe is not None and (probe.shape != (vectors.shape[1] + 1,) or not np.isfinite(probe).all()):
            raise ValueError(f"{path}: the refusal memory's leaning probe does not fit its vectors: retrain the coverage decision")
        try:
            wording = WordingProbe.from_arrays(data, WORDING_PREFIX)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        return RefusalMemory(vectors, str(data["encoder"]), str(data["trained_on"]), probe, wording)
