"""Data parallelism: one encoder replica per device, each batch split between them."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from condsearch.encoders.base import Encoder, Pair


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
            parts = [r.encode_batch(chunk) for r, chunk in jobs]
        else:
            parts = list(self._pool.map(lambda job: job[0].encode_batch(job[1]), jobs))
        for replica in self.replicas:  # gather truncation notices where callers read them
            self.stats.n_truncated += replica.stats.n_truncated
            room = 3 - len(self.stats.truncated_examples)
            self.stats.truncated_examples.extend(replica.stats.truncated_examples[:room])
            replica.stats.n_truncated = 0
            replica.stats.truncated_examples.clear()
        return np.concatenate(parts)
