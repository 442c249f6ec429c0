"""Ours (issue 57): the replay anchor, the start router's conditioned vectors of captions it ships.

Adapting the router to a table's labels moves the layers that read the condition; what it knew of
captions under their conditions (C-STS's kind of text) drifts with them. The replay anchor keeps
it: before training, the start router encodes the bundled demo captions (``data/demo_corpus.tsv``,
written for condsearch) under a few conditions of the kinds they vary in; each step then routes a
seeded sample of those (caption, condition) rows and adds ``w · mean(1 − cos)`` between their
vectors now and before. No C-STS file is needed, and none is shipped.
"""

from __future__ import annotations

import numpy as np

from condsearch.corpus.csts import CstsData
from condsearch.corpus.demo import read_demo_rows

#: the kinds of condition the demo captions vary in (colour, sport, place, material, …)
REPLAY_CONDITIONS = (
    "the color of the clothing",
    "the sport being played",
    "the place",
    "the material",
    "the number of people",
    "the animal",
)


def demo_replay(conditions: tuple[str, ...] = REPLAY_CONDITIONS) -> CstsData:
    """Return every demo caption under every condition as rows (sentence2 repeats sentence1; labels unused)."""
    _, texts = read_demo_rows()
    rows = [(t, c) for c in conditions for t in texts]
    s = [t for t, _ in rows]
    return CstsData(s, list(s), [c for _, c in rows], np.zeros(len(rows), dtype=np.float32))
