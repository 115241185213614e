"""The query encoder behind a queue: concurrent questions are encoded together or side by side.

Each `/ask` runs in its own worker thread and asks for one vector; `BatchingEmbedder` parks the
request, and encoder threads take it from one queue. With only the main encoder, one thread takes
whatever is waiting (up to `max_batch`) and runs it as one batch. Given a `parallel` encoder as
well (a factory of the same model on one intra-op thread, safe to call from several threads at once,
made at `warm` or when two questions first meet, so one-shot commands never load it), there are
`lanes` threads, each taking one question at a time: a question that finds the queue empty and the
other lanes idle goes to the main encoder (all its threads on one question: the lowest latency), the
others go to the parallel one side by side. On two cores and the long real-user questions, two
single-thread encodes at once did 182 questions/s (10.8 ms of CPU each) against 139-143 for one
two-thread encoder in batches of 16 or one at a time (13.5-14.3 ms): padding and the threads'
hand-offs cost more than batching saves. A request that finds `max_pending` already waiting is refused
(`Overloaded`, answered 503 with Retry-After) instead of queueing for seconds. The vectors of the last
`max_cached` distinct questions are kept (least recently used out): a question asked again, by a retry, a
second front end or the Slack bot answering a repost, is not encoded again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from app.errors import DsqaError
from indexer.embedder import Embedder


class Overloaded(DsqaError):
    status_code = 503
    code = "overloaded"


def submit_one(embedder: Embedder, text: str) -> Future[np.ndarray]:
    """The vector of `text` as a future: encoded in the background by a `BatchingEmbedder`, now by
    any other embedder."""
    if isinstance(embedder, BatchingEmbedder):
        return embedder.submit(text)
    done: Future[np.ndarray] = Future()
    done.set_result(embedder.embed([text])[0])
    return done


class BatchingEmbedder:
    """An `Embedder` in front of another: single-text calls from many threads become batches, or with
    a `parallel` encoder's factory, single encodes on `lanes` threads at once."""

    def __init__(self, inner: Embedder, *, max_batch: int = 16, window_ms: float = 0.0, max_pending: int = 256,
                 max_cached: int = 2048, parallel: Callable[[], Embedder | None] | None = None, lanes: int = 2) -> None:
        self.inner = inner
        self.make_parallel = parallel
        self.made: Embedder | None = None  # the parallel encoder once made (the main one when it could not be)
        self.make_lock = threading.Lock()
        self.busy_lanes = 0
        self.busy_lock = threading.Lock()
        self.name = inner.name
        self.dimension = inner.dimension
        self.max_batch = max_batch
        self.window_s = window_ms / 1000.0
        self.pending: queue.Queue[tuple[str, Future[np.ndarray]]] = queue.Queue(maxsize=max_pending)
        self.batches = 0  # batches run, for tests and metrics
        self.max_cached = max_cached
        self.cached: OrderedDict[str, np.ndarray] = OrderedDict()  # question -> its vector, least recent first
        self.cache_hits = 0
        self.cache_lock = threading.Lock()
        self.workers = [threading.Thread(target=self._run, name="dsqa-encoder", daemon=True)] if parallel is None else [
            threading.Thread(target=self._run_lane, name=f"dsqa-encoder-{lane}", daemon=True) for lane in range(max(lanes, 1))]
        for worker in self.workers:
            worker.start()

    def embed(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        if len(texts) != 1:  # index-time and bulk calls go straight through
            return self.inner.embed(texts, batch_size=batch_size, progress=progress)
        return self.submit(texts[0]).result()[None, :]

    def warm(self) -> None:
        """The parallel encoder made, and one encode through each encoder (their first run sets up
        buffers), now rather than on the first questions."""
        encoders = {id(e): e for e in (self.inner, self.parallel())}
        for encoder in encoders.values():
            encoder.embed(["how do I enable ZeRO stage 3 with CPU offload?"], batch_size=1)

    def parallel(self) -> Embedder:
        """The encoder for questions side by side, made on first need; the main one without a factory
        or when the factory gives none."""
        with self.make_lock:
            if self.made is None:
                self.made = (self.make_parallel() if self.make_parallel is not None else None) or self.inner
            return self.made

    def submit(self, text: str) -> Future[np.ndarray]:
        """The vector of one text, to come: the caller works on while the encoder runs (at once when the
        text was encoded lately)."""
        future: Future[np.ndarray] = Future()
        with self.cache_lock:
            vector = self.cached.get(text)
            if vector is not None:
                self.cached.move_to_end(text)
                self.cache_hits += 1
        if vector is not None:
            future.set_result(vector.copy())  # the caller may change its vector; the kept one stays
            return future
        try:
            self.pending.put_nowait((text, future))
        except queue.Full as exc:
            raise Overloaded("too many questions waiting for the encoder; retry shortly") from exc
        return future

    def _run(self) -> None:
        while True:
            first = self.pending.get()
            batch = [first]
            deadline = time.monotonic() + self.window_s
            while len(batch) < self.max_batch:
                remaining = deadline - time.monotonic()
                try:
                    batch.append(self.pending.get(timeout=max(remaining, 0)) if remaining > 0 else self.pending.get_nowait())
                except queue.Empty:
                    break
            try:
                vectors = self.inner.embed([text for text, _ in batch], batch_size=len(batch))
            except Exception as exc:  # noqa: BLE001 - every waiter gets the failure
                for _, future in batch:
                    future.set_exception(exc)
                continue
            self._deliver(batch, vectors)

    def _run_lane(self) -> None:
        while True:
            text, future = self.pending.get()
            with self.busy_lock:
                alone = self.busy_lanes == 0 and self.pending.empty()
                self.busy_lanes += 1
            try:
                vectors = (self.inner if alone else self.parallel()).embed([text], batch_size=1)
            except Exception as exc:  # noqa: BLE001 - the waiter gets the failure
                future.set_exception(exc)
                continue
            finally:
                with self.busy_lock:
                    self.busy_lanes -= 1
            self._deliver([(text, future)], vectors)

    def _deliver(self, batch: list[tuple[str, Future[np.ndarray]]], vectors: np.ndarray) -> None:
        with self.busy_lock:
            self.batches += 1
        self._remember(batch, vectors)
        for (_, future), vector in zip(batch, vectors, strict=True):
            future.set_result(vector)

    def _remember(self, batch: list[tuple[str, Future[np.ndarray]]], vectors: np.ndarray) -> None:
        if self.max_cached <= 0:
            return
        with self.cache_lock:
            for (text, _), vector in zip(batch, vectors, strict=True):
                self.cached[text] = vector.copy()
                self.cached.move_to_end(text)
            while len(self.cached) > self.max_cached:
                self.cached.popitem(last=False)
