"""Calibrated scores (our own design, issue 25): each index's background score distribution, and z against it.

A score is the cosine of a query's and a row's vectors made under the index's condition, and where
scores sit depends on the model, profile and condition: the default's top scores crowd near 0.95,
plain MiniLM's spread lower and wider. So a raw threshold means little across indexes. When an
index is written the store records its *background* (:func:`condsearch.store.background.score_background`):
the scores between its own rows, over every distinct pair of a seeded sample of up to 1,000 rows of the
vectors written (no self pairs), summarised as their count, mean, standard deviation and a few
upper quantiles. A calibrated query reports beside each raw score its standard score against that
background, ``z = (score - mean) / std`` (:class:`Background`): a z of 3 is three standard
deviations above the score of a random pair of that index's rows.

The background is per index; z compares within one index as the raw score does, and is no
probability. The sample is seeded, so writing the same vectors records the same background.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from condsearch.errors import CondsearchError

if TYPE_CHECKING:
    from condsearch.query.hits import Hits
    from condsearch.store.manifest import Manifest


@dataclass(frozen=True)
class Background:
    """An index's recorded background: the mean and standard deviation of its rows' pair scores."""

    mean: float
    std: float
    pairs: int
    quantiles: dict[str, float]

    @classmethod
    def of(cls, manifest: Manifest, *, name_paths: bool = True) -> Background:
        """Return the background an index records; CondsearchError, naming the fix, where it records none.

        ``name_paths`` False (the server, whose errors name no paths): the fix leaves out the corpus path.
        """
        raw: dict[str, Any] = manifest.score_background  # checked on read: background_problem
        condition = manifest.condition
        if not raw and manifest.n_vectors < 2:
            raise CondsearchError(
                f"the index of {condition!r} holds {manifest.n_vectors} row(s): too few for a score background, "
                "so its scores cannot be calibrated"
            )
        if not raw:
            corpus = shlex.quote(manifest.corpus_path) if name_paths else "CORPUS"
            rebuild = f"condsearch index {corpus} --condition {shlex.quote(condition)}"
            raise CondsearchError(
                f"the index of {condition!r} records no score background (written before condsearch recorded "
                f"one); re-index it to calibrate its scores: {rebuild} (with the flags it was built with; "
                "unchanged rows are reused)"
            )
        if raw["std"] <= 0:
            raise CondsearchError(
                f"the score background of {condition!r}'s index has no spread (all its pairs score the same); "
                "its scores cannot be calibrated"
            )
        quantiles = {str(q): float(v) for q, v in raw["quantiles"].items()}
        return cls(float(raw["mean"]), float(raw["std"]), int(raw["pairs"]), quantiles)

    def z(self, score: float) -> float:
        """Return score's standard score against this background: (score - mean) / std."""
        return (score - self.mean) / self.std

    def calibrate(self, hits: Hits) -> Hits:
        """Return hits with each hit's z set (the raw scores unchanged)."""
        return replace(hits, hits=tuple(replace(h, z=self.z(h.score)) for h in hits), calibrated=True)
