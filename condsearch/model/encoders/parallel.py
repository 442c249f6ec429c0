"""Data parallelism: one encoder replica per device, each batch split between them."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from condsearch.model.encoders.base import Encoder, Pair


def split_evenly(n: int, parts: int) -> list[tuple[int, int]]:
    """Return up to ``parts`` contiguous (start, stop) ranges covering range(n), sizes differing by at most one."""
    parts = max(1, min(parts, n))
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


class ReplicatedEncoder(Encoder):
    """Split each batch across replicas of one encoder (one per device) and join the results.

    Replicas run in threads: PyTorch releases the GIL inside kernels, so GPUs work at once.
    """

    def __init__(self, replicas: Sequence[Encoder]) -> None:
        super().__init__()
        if not replicas:
            raise ValueError("no replicas")
        self.replicas = list(replicas)
        first = self.replicas[0]
        self.model_id, self.revision, self.dim = first.model_id, first.revision, first.dim
        self._pool = ThreadPoolExecutor(max_workers=len(self.replicas)) if len(self.replicas) > 1 else None

    def describe(self) -> dict[str, object]:
        return self.replicas[0].describe()

    def encode_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        bounds = split_evenly(len(pairs), len(self.replicas))
        jobs = [(r, pairs[a:b]) for r, (a, b) in zip(self.replicas, bounds, strict=False)]
        if self._pool is None or len(jobs) == 1:
            done = [_encode_on(r, chunk) for r, chunk in jobs]
        else:
            done = list(self._pool.map(lambda job: _encode_on(*job), jobs))
        for _, (n, examples) in done:  # truncation is counted per thread: the caller's, where it reads it
            self.stats.note_many(n, examples)
        return np.concatenate([vectors for vectors, _ in done])


def _encode_on(replica: Encoder, pairs: Sequence[Pair]) -> tuple[np.ndarray, tuple[int, list[str]]]:
    """Encode on one replica in this thread; return the vectors and the truncations it counted here."""
    return replica.encode_batch(pairs), replica.stats.take_truncated()
