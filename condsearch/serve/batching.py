"""Micro-batching: requests that arrive together are answered by one call on a worker thread.

The batcher knows nothing about models: it hands lists of items to a ``run`` function and
routes each answer (or the exception raised for it) back to the caller's future. While one
batch runs, later requests queue up and form the next batch, so batches grow with load.

A request may come in parts (:meth:`MicroBatcher.submit_parts`): a large one split so that no
batch holds more than ``max_batch`` items' size or ``max_cost`` of their cost (tokens, for the
server). Each batch takes at most one part of each request, requests that have had the fewest
parts run going first, so a small request that arrives while a large one is answered waits for
one batch at most, not for the whole of the large one.

The server runs two batchers, :class:`Lanes`: light requests (one part of at most ``light_cost``: a
query of a few words) on a quick lane at the server's CPU priority, the rest (embeddings, queries of
many parts) on a bulk lane whose thread runs niced (:mod:`condsearch.serve.priority`). A light
request never waits for a heavy batch to finish, and while both lanes run the operating system gives
the quick one the CPU first, so a flood of heavy requests leaves a known query's latency close to
what it was (issue 58). The bulk lane takes what the quick one leaves and is never starved.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from condsearch.serve.config import ServeConfig
from condsearch.serve.priority import BACKGROUND_NICE, lower_thread_priority

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_STOP = object()


@dataclass
class BatchStats:
    """Counters for tests and /health: how many batches ran and how many items (parts) they held."""

    n_batches: int = 0
    n_items: int = 0
    largest: int = 0


@dataclass(eq=False)
class _Pending(Generic[T, R]):
    """A submitted request: its parts, the answers so far, and the future that gets them all."""

    parts: Sequence[T]
    future: Future[Any]
    whole: bool  # the future gets the list of answers (submit_parts), else the one answer (submit)
    seq: int  # arrival order
    answers: list[R | None] = field(default_factory=list)
    handed: int = 0  # parts given to batches
    answered: int = 0

    @property
    def finished(self) -> bool:
        return self.future.done()

    def answer(self, i: int, answer: R | BaseException) -> None:
        try:
            if isinstance(answer, BaseException):
                self.future.set_exception(answer)  # a request with a failed part fails; the rest are not run
                return
            self.answers[i] = answer
            self.answered += 1
            if self.answered == len(self.parts):
                self.future.set_result(list(self.answers) if self.whole else self.answers[0])
        except InvalidStateError:
            pass  # failed already, or cancelled by its caller meanwhile


class MicroBatcher(Generic[T, R]):
    """Collect items for up to ``window_s`` after the first arrives (or until a batch is full), then run them.

    ``run(items)`` returns one answer per item, in order; an answer that is an exception is
    raised to that item's caller only. When ``run`` itself raises, each item is run again alone,
    so the exception reaches only the items that cause it. ``size(item)`` weighs an item (e.g.
    its number of queries) against ``max_batch``, ``cost(item)`` (e.g. its tokens) against
    ``max_cost``; an item heavier than either runs alone. ``nice``: how much lower than its creator's
    the worker thread's CPU priority is (0: the same).
    """

    def __init__(
        self,
        run: Callable[[list[T]], Sequence[R | BaseException]],
        *,
        max_batch: int = ServeConfig.max_batch,
        window_s: float = ServeConfig.batch_window_ms / 1000,
        size: Callable[[T], int] = lambda _: 1,
        cost: Callable[[T], int] = lambda _: 0,
        max_cost: int = ServeConfig.max_batch_tokens,
        nice: int = 0,
        name: str = "condsearch-batcher",
    ) -> None:
        if max_batch <= 0 or window_s < 0 or max_cost <= 0 or nice < 0:
            raise ValueError("max_batch and max_cost must be positive, window_s and nice non-negative")
        self._run, self._size, self._cost = run, size, cost
        self.max_batch, self.window_s, self.max_cost, self.nice = max_batch, window_s, max_cost, nice
        self.stats = BatchStats()
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = False
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: T) -> Future[R]:
        """Queue one item; its future resolves once the batch holding it has run."""
        return self._submit([item], whole=False)

    def submit_parts(self, parts: Sequence[T]) -> Future[list[R]]:
        """Queue a request in parts, run in turn with other requests; its future gets every part's answer, in order.

        A part whose answer is an exception fails the request with it, and its remaining parts are
        not run; nor are they once the future is cancelled (a caller that gave up).
        """
        if not parts:
            raise ValueError("a request needs at least one part")
        return self._submit(parts, whole=True)

    def _submit(self, parts: Sequence[T], *, whole: bool) -> Future[Any]:
        if self._closed:
            raise RuntimeError("the batcher is closed")
        future: Future[Any] = Future()
        with self._seq_lock:
            self._seq += 1
            pending: _Pending[T, R] = _Pending(parts, future, whole, self._seq, [None] * len(parts))
        self._queue.put(pending)
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
        if self.nice:
            lower_thread_priority(self.nice)
        active: list[_Pending[T, R]] = []
        stopping = False
        while True:
            active = [p for p in active if not p.finished and p.handed < len(p.parts)]
            if not active:
                if stopping:
                    return
                got = self._queue.get()
                if got is _STOP:
                    return
                active.append(got)  # type: ignore[arg-type]
            stopping = self._take_waiting(active) or stopping
            # the fewest parts run first, then the earliest: a new request goes before a large one's next part
            active.sort(key=lambda p: (p.handed, p.seq))
            batch: list[tuple[_Pending[T, R], int]] = []
            weight = cost = 0
            for pending in active:
                if not self._add(batch, pending, weight, cost):
                    break
                weight, cost = self._weigh(batch)
            deadline = time.monotonic() + self.window_s
            while not stopping and weight < self.max_batch and cost < self.max_cost:
                remaining = deadline - time.monotonic()
                try:
                    got = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if got is _STOP:
                    stopping = True
                    break
                active.append(got)  # type: ignore[arg-type]
                if not self._add(batch, got, weight, cost):  # type: ignore[arg-type]
                    break  # it starts the next batch
                weight, cost = self._weigh(batch)
            self._answer(batch)

    def _take_waiting(self, active: list[_Pending[T, R]]) -> bool:
        """Move every request queued meanwhile into active; return whether the batcher was closed."""
        while True:
            try:
                got = self._queue.get_nowait()
            except queue.Empty:
                return False
            if got is _STOP:
                return True
            active.append(got)  # type: ignore[arg-type]

    def _add(self, batch: list[tuple[_Pending[T, R], int]], pending: _Pending[T, R], weight: int, cost: int) -> bool:
        """Add pending's next part to batch if the batch is empty or it fits; return whether it was added."""
        part = pending.parts[pending.handed]
        if batch and (weight + self._size(part) > self.max_batch or cost + self._cost(part) > self.max_cost):
            return False
        batch.append((pending, pending.handed))
        pending.handed += 1
        return True

    def _weigh(self, batch: list[tuple[_Pending[T, R], int]]) -> tuple[int, int]:
        parts = [p.parts[i] for p, i in batch]
        return sum(map(self._size, parts)), sum(map(self._cost, parts))

    def _answer(self, batch: list[tuple[_Pending[T, R], int]]) -> None:
        batch = [(p, i) for p, i in batch if not p.finished]  # a caller that gave up: its part is not run
        if not batch:
            return
        items = [p.parts[i] for p, i in batch]
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
        for (pending, i), answer in zip(batch, answers, strict=True):
            pending.answer(i, answer)

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


class Lanes(Generic[T, R]):
    """Two batchers over one ``run``: light requests on a quick lane, the rest on a bulk lane that runs niced.

    A light request is one part of at most ``light_cost`` (``cost(part)``); ``bulk_nice`` lowers the bulk
    lane's thread (:data:`~condsearch.serve.priority.BACKGROUND_NICE`). ``run`` is called from both lanes'
    threads, possibly at once, so it must be thread-safe. The other arguments are :class:`MicroBatcher`'s,
    the same for both lanes.
    """

    def __init__(
        self,
        run: Callable[[list[T]], Sequence[R | BaseException]],
        *,
        light_cost: int = ServeConfig.light_request_tokens,
        bulk_nice: int = BACKGROUND_NICE,
        max_batch: int = ServeConfig.max_batch,
        window_s: float = ServeConfig.batch_window_ms / 1000,
        size: Callable[[T], int] = lambda _: 1,
        cost: Callable[[T], int] = lambda _: 0,
        max_cost: int = ServeConfig.max_batch_tokens,
    ) -> None:
        if light_cost < 0:
            raise ValueError("light_cost must be non-negative")
        self.light_cost, self._cost = light_cost, cost
        common: dict[str, Any] = {"max_batch": max_batch, "window_s": window_s, "size": size, "cost": cost}
        self.quick: MicroBatcher[T, R] = MicroBatcher(run, max_cost=max_cost, name="condsearch-quick", **common)
        self.bulk: MicroBatcher[T, R] = MicroBatcher(
            run, max_cost=max_cost, nice=bulk_nice, name="condsearch-bulk", **common
        )

    def light(self, parts: Sequence[T]) -> bool:
        """Return whether a request of these parts is light: one part of at most ``light_cost``."""
        return len(parts) == 1 and self._cost(parts[0]) <= self.light_cost

    def lane(self, parts: Sequence[T]) -> MicroBatcher[T, R]:
        """Return the batcher a request of these parts runs on."""
        return self.quick if self.light(parts) else self.bulk

    def submit(self, item: T) -> Future[R]:
        """Queue one item on its lane (see :meth:`MicroBatcher.submit`)."""
        return self.lane([item]).submit(item)

    def submit_parts(self, parts: Sequence[T]) -> Future[list[R]]:
        """Queue a request in parts on its lane (see :meth:`MicroBatcher.submit_parts`)."""
        return self.lane(parts).submit_parts(parts)

    @property
    def stats(self) -> BatchStats:
        """Both lanes' counters, added."""
        a, b = self.quick.stats, self.bulk.stats
        return BatchStats(a.n_batches + b.n_batches, a.n_items + b.n_items, max(a.largest, b.largest))

    def close(self, timeout: float | None = 5.0) -> None:
        """Finish what both lanes hold, then stop them."""
        self.quick.close(timeout)
        self.bulk.close(timeout)

    def __enter__(self) -> Lanes[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
