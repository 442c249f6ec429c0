"""Several training CSVs, each with a weight: what ``condsearch train … TRAIN_CSV[:WEIGHT]…`` trains on.

A weight scales how often a file's sentence pairs appear in an epoch: 1 takes each once (one file
at weight 1 is read exactly as :func:`condsearch.corpus.csts.read_csts` reads it), 2 twice, 0.5 half of
them and 2.5 each twice and half of them a third time. The part of a weight below 1 is a choice
of whole pairs (both rows of a C-STS pair, or neither) drawn by the run's seed, so a resumed run
reads the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from condsearch.corpus.csts import CstsData, read_csts
from condsearch.errors import CorpusError

#: the largest weight: a file's rows are held that many times over in memory
MAX_WEIGHT = 100.0


@dataclass(frozen=True)
class TrainSource:
    """A training CSV and its weight (rows per epoch, as a multiple of the file's)."""

    path: Path
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.weight):
            raise ValueError(f"{self.path}: weight {self.weight} is not a finite number")
        if self.weight <= 0:
            raise ValueError(f"{self.path}: weight {self.weight:g} must be above 0 (leave the file out instead)")
        if self.weight > MAX_WEIGHT:
            raise ValueError(f"{self.path}: weight {self.weight:g} is over {MAX_WEIGHT:g}, the most a file takes")

    def __str__(self) -> str:
        return self.path.name if self.weight == 1 else f"{self.path.name}:{self.weight:g}"


def parse_train_source(text: str) -> TrainSource:
    """Parse ``PATH`` or ``PATH:WEIGHT``; ValueError for a weight that is not a finite number above 0.

    A file that exists under the whole name is that file (its name may hold a colon), and so is a
    name whose part after the last colon is no number.
    """
    head, sep, tail = text.rpartition(":")
    if not sep or not head or Path(text).exists():
        return TrainSource(Path(text))
    try:
        weight = float(tail)
    except ValueError:
        return TrainSource(Path(text))
    return TrainSource(Path(head), weight)


#: what a trainer takes: one CSV (as ever), or several with their weights
TrainData = Path | str | Sequence[TrainSource]


def as_sources(train: TrainData) -> tuple[TrainSource, ...]:
    """Return the training data as weighted sources (one path: itself at weight 1)."""
    if isinstance(train, (str, Path)):
        return (TrainSource(Path(train)),)
    return tuple(train)


def describe_sources(train: TrainData) -> str:
    """Return the sources as a training summary names them: 'train.csv + pairs.csv:0.5'."""
    return " + ".join(str(s) for s in as_sources(train))


def read_training(train: TrainData, seed: int) -> CstsData:
    """Read every source and weight it (see the module); CorpusError for a weight that takes no pair."""
    sources = as_sources(train)
    if not sources:
        raise CorpusError("no training CSV")
    if len(sources) == 1 and sources[0].weight == 1:
        return read_csts(sources[0].path)
    rng = np.random.default_rng(seed)
    s1: list[str] = []
    s2: list[str] = []
    cond: list[str] = []
    labels: list[float] = []
    dropped = 0
    for source in sources:
        data = read_csts(source.path)
        dropped += data.n_dropped
        groups = _pair_rows(data)
        copies, part = divmod(source.weight, 1.0)
        n_part = round(part * len(groups))
        if int(copies) == 0 and n_part == 0:
            raise CorpusError(f"{source.path}: weight {source.weight:g} takes none of its {len(groups)} pairs")
        picked = sorted(rng.choice(len(groups), size=n_part, replace=False).tolist()) if n_part else []
        for group in [*groups * int(copies), *(groups[g] for g in picked)]:
            for row in group:
                s1.append(data.sentence1[row])
                s2.append(data.sentence2[row])
                cond.append(data.condition[row])
                labels.append(float(data.labels[row]))
    return CstsData(s1, s2, cond, np.asarray(labels, dtype=np.float32), dropped)


def _pair_rows(data: CstsData) -> list[list[int]]:
    """Group row indices by sentence pair, in the order pairs first appear."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(data.sentence1, data.sentence2, strict=True)):
        groups.setdefault(key, []).append(i)
    return list(groups.values())
