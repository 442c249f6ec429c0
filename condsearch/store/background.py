"""An index's background scores, recorded when it is written: its rows' pair scores over a seeded sample.

:func:`score_background` scores every distinct pair of a seeded sample of up to :data:`SAMPLE_ROWS` of an index's
vectors (no self pairs) and summarises them as their count, mean, standard deviation and a few upper quantiles; the
store records that in the manifest, and :mod:`condsearch.query.calibration` reads it to calibrate scores (issue 25).
"""

from __future__ import annotations

import logging
import math
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)

#: decimals a score is given to, in a recorded background and in every answer (:mod:`condsearch.query.hits`)
SCORE_PLACES = 6
#: rows sampled for the background: their distinct pairs (499,500 of them) are scored in one product
SAMPLE_ROWS = 1000
#: the sample's seed, recorded with it
SEED = 0
#: the upper quantiles of the pair scores recorded, named by str(q) in the manifest
QUANTILES = (0.5, 0.9, 0.99, 0.999)
#: the fields of a recorded background (the manifest's ``score_background``; {} where none is recorded)


class Rows(Protocol):
    """An (n, d) array of vectors read by rows: a NumPy array or a :class:`condsearch.store.vectors.VectorFile`."""

    def __len__(self) -> int: ...

    def take(self, rows: np.ndarray, axis: int = 0) -> np.ndarray: ...


def sample_rows(n: int) -> np.ndarray:
    """Return the sorted rows of an n-row index its background scores: all up to SAMPLE_ROWS, else a seeded sample."""
    if n <= SAMPLE_ROWS:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(SEED).choice(n, size=SAMPLE_ROWS, replace=False)).astype(np.int64)


def pair_scores(sample: np.ndarray) -> np.ndarray:
    """Return the inner products (cosines, for unit vectors) of every distinct pair of the sample's rows, as float64."""
    x = np.ascontiguousarray(sample, dtype=np.float32)
    upper = np.triu_indices(len(x), k=1)
    return (x @ x.T)[upper].astype(np.float64)


def score_background(vectors: Rows) -> dict[str, object]:
    """Return the background an index of these vectors records; {} for fewer than 2 rows or scores not finite."""
    rows = sample_rows(len(vectors))
    if len(rows) < 2:
        return {}
    scores = pair_scores(vectors.take(rows, axis=0))
    mean, std = float(scores.mean()), float(scores.std())
    quantiles = {str(q): float(v) for q, v in zip(QUANTILES, np.quantile(scores, QUANTILES), strict=True)}
    if not all(math.isfinite(v) for v in (mean, std, *quantiles.values())):
        log.warning("the index's vectors score pairs that are not finite; recording no score background")
        return {}
    return {
        "sample_rows": len(rows),
        "pairs": len(scores),
        "seed": SEED,
        "mean": round(mean, SCORE_PLACES),
        "std": round(std, SCORE_PLACES),
        "quantiles": {q: round(v, SCORE_PLACES) for q, v in quantiles.items()},
    }
