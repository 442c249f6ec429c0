"""Micro-batching: requests that arrive together are answered by one call on a worker thread.

The batcher knows nothing about models: it hands lists of items to a ``run`` function and
routes each answer (or the exception raised for it) back to the caller's future. While one
batch runs, later requests queue up and form the next batch, so batches grow with load.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

from condsearch.serve.config import ServeConfig

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_STOP = object()


@dataclass
class BatchStats:
    """Counters for tests and /health: how many batches ran and how many items they held."""

    n_batches: int = 0
    n_items: int = 0
    largest: int = 0


class MicroBatcher(Generic[T, R]):
    """Collect items for up to ``window_s`` after the first arrives (or until ``max_batch``), then run them.

    ``run(items)`` returns one answer per item, in order; an answer that is an exception is
    raised to that item's caller only. When ``run`` itself raises, each item is run again alone,
    so the exception reaches only the items that cause it. ``size(item)`` weighs an item (e.g.
    its number of queries) against ``max_batch``; an item heavier than ``max_batch`` runs alone.
    """

    def __init__(
        self,
        run: Callable[[list[T]], Sequence[R | BaseException]],
        *,
        max_batch: int = ServeConfig.max_batch,
        window_s: float = ServeConfig.batch_window_ms / 1000,
        size: Callable[[T], int] = lambda _: 1,
        name: str = "condsearch-batcher",
    ) -> None:
        if max_batch <= 0 or window_s < 0:
            raise ValueError("max_batch must be positive and window_s non-negative")
        self._run, self._size = run, size
        self.max_batch, self.window_s = max_batch, window_s
        self.stats = BatchStats()
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: T) -> Future[R]:
        """Queue one item; its future resolves once the batch holding it has run."""
        if self._closed:
            raise RuntimeError("the batcher is closed")
        future: Future[R] = Future()
        self._queue.put((item, future))
        return future

    def close(self, timeout: float | None = 5.0) -> None:
        """Finish the queued items, then stop the worker."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def __enter__(self) -> MicroBatcher[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _work(self) -> None:
        carry: object | None = None
        while True:
            first = carry if carry is not None else self._queue.get()
            carry = None
            if first is _STOP:
                return
            batch = [first]
            weight = self._size(first[0])  # type: ignore[index]
            deadline = time.monotonic() + self.window_s
            while weight < self.max_batch:
                remaining = deadline - time.monotonic()
                try:
                    nxt = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP or weight + self._size(nxt[0]) > self.max_batch:  # type: ignore[index]
                    carry = nxt  # it starts the next batch (or stops the worker after this one)
                    break
                batch.append(nxt)
                weight += self._size(nxt[0])  # type: ignore[index]
            self._answer(batch)  # type: ignore[arg-type]

    def _answer(self, batch: list[tuple[T, Future[R]]]) -> None:
        items = [item for item, _ in batch]
        self.stats.n_batches += 1
        self.stats.n_items += len(items)
        self.stats.largest = max(self.stats.largest, len(items))
        try:
            answers = self._call(items)
        except BaseException as exc:  # noqa: BLE001 - the worker must outlive any batch
            if len(items) == 1:
                log.exception("a request failed")
                answers = [exc]
            else:
                # one bad item must not fail the others: answer each alone, so only it fails
                log.warning("a batch of %d failed (%s); answering its items one by one", len(items), exc)
                answers = [self._alone(item) for item in items]
        for (_, future), answer in zip(batch, answers, strict=True):
            if future.cancelled():
                continue
            if isinstance(answer, BaseException):
                future.set_exception(answer)
            else:
                future.set_result(answer)

    def _call(self, items: list[T]) -> list[R | BaseException]:
        answers = list(self._run(items))
        if len(answers) != len(items):
            raise RuntimeError(f"batch function gave {len(answers)} answers for {len(items)} items")
        return answers

    def _alone(self, item: T) -> R | BaseException:
        try:
            return self._call([item])[0]
        except BaseException as exc:  # noqa: BLE001
            log.exception("a request failed")
            return exc
