"""Concurrent questions are encoded together or side by side, each gets its own vector, and a full queue is refused."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from app.batching import BatchingEmbedder, Overloaded
from indexer.embedder import HashEmbedder


class SlowHash(HashEmbedder):
    """The test fake, slowed to one call at a time, counting its calls."""

    def __init__(self) -> None:
        super().__init__(64)
        self.calls: list[int] = []

    def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        self.calls.append(len(texts))
        time.sleep(0.05)
        return super().embed(texts)


def ask_at_once(batcher: BatchingEmbedder, n: int) -> list[str]:
    """n questions asked from n threads at once; each must get its own vector (the fake's)."""
    texts = [f"question number {i} about zero stage {i % 4}" for i in range(n)]
    got: dict[int, np.ndarray] = {}

    def ask(i: int) -> None:
        got[i] = batcher.embed([texts[i]])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = HashEmbedder(64).embed(texts)
    assert all(np.allclose(got[i][0], expected[i]) and got[i].shape == (1, 64) for i in range(n))
    return texts


def test_concurrent_questions_share_encoder_calls_and_get_their_own_vectors() -> None:
    inner = SlowHash()
    batcher = BatchingEmbedder(inner, max_batch=16)
    texts = ask_at_once(batcher, 24)
    assert len(inner.calls) < len(texts) and max(inner.calls) > 1  # batched
    assert batcher.embed(["a", "b"]).shape == (2, 64)  # bulk calls pass straight through


def test_a_full_queue_is_refused_not_queued() -> None:
    inner = SlowHash()
    batcher = BatchingEmbedder(inner, max_batch=1, max_pending=1)
    errors: list[Exception] = []

    def ask() -> None:
        try:
            batcher.embed(["x"])
        except Overloaded as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors and errors[0].status_code == 503
    with pytest.raises(Overloaded):
        raise errors[0]


def test_a_question_asked_again_is_not_encoded_again_and_the_cache_is_bounded() -> None:
    inner = SlowHash()
    batcher = BatchingEmbedder(inner, max_cached=2)
    first = batcher.embed(["how do I enable zero stage 3?"])
    first[0, 0] = 99.0  # a caller changing its copy does not change what is kept
    again = batcher.embed(["how do I enable zero stage 3?"])
    assert len(inner.calls) == 1 and batcher.cache_hits == 1
    assert np.allclose(again, HashEmbedder(64).embed(["how do I enable zero stage 3?"]))
    batcher.embed(["question b"])
    batcher.embed(["question c"])  # the cache keeps two: the first question is dropped
    batcher.embed(["how do I enable zero stage 3?"])
    assert len(inner.calls) == 4 and batcher.cache_hits == 1
    off = BatchingEmbedder(SlowHash(), max_cached=0)
    off.embed(["x"])
    off.embed(["x"])
    assert len(off.inner.calls) == 2 and off.cache_hits == 0  # type: ignore[attr-defined]


class OverlapHash(HashEmbedder):
    """The test fake, slowed, recording how many of its calls ran at once."""

    def __init__(self) -> None:
        super().__init__(64)
        self.calls = 0
        self.running = 0
        self.most_at_once = 0
        self.lock = threading.Lock()

    def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        with self.lock:
            self.calls += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(0.05)
        with self.lock:
            self.running -= 1
        return super().embed(texts)


def test_lanes_encode_concurrent_questions_side_by_side_and_a_lone_one_on_the_main_encoder() -> None:
    main, parallel = OverlapHash(), OverlapHash()
    made: list[OverlapHash] = []
    batcher = BatchingEmbedder(main, parallel=lambda: made.append(parallel) or parallel, lanes=2)
    alone = batcher.embed(["a lone question about offload"])
    assert main.calls == 1 and parallel.calls == 0  # nothing else waiting: all the main encoder's threads on it
    assert not made  # the parallel encoder is made only when two questions meet (one-shot commands never load it)
    ask_at_once(batcher, 12)
    assert np.allclose(alone[0], HashEmbedder(64).embed(["a lone question about offload"])[0])
    assert main.calls + parallel.calls == 13  # one encode per question: no batches on lanes
    assert parallel.calls >= 6 and parallel.most_at_once == 2  # two lanes at once, no more
    assert made == [parallel]  # made once


def test_a_failing_lane_encode_reaches_its_caller_and_the_lane_goes_on() -> None:
    class Failing(HashEmbedder):
        def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
            if "boom" in texts[0]:
                raise RuntimeError("encoder failed")
            return super().embed(texts)

    batcher = BatchingEmbedder(Failing(64), parallel=lambda: Failing(64), lanes=2)
    with pytest.raises(RuntimeError, match="encoder failed"):
        batcher.embed(["boom"])
    assert batcher.embed(["fine"]).shape == (1, 64) and batcher.busy_lanes == 0
