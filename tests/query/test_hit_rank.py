"""Hit.rank (issue 59): each hit knows its 1-based place, the same one to_dicts, to_arrow and the JSON answers give."""

from __future__ import annotations

from pathlib import Path

import condsearch
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.as_json import query_answer
from condsearch.query.hits import Hit, Hits
from tests.conftest import HashEncoder

COLOUR = "color of the dress"
TEXTS = [f"a girl in a {c} dress plays {s}" for c in ("red", "blue", "green", "pink") for s in ("tennis", "golf")]


def _hits(root: Path, k: int = 5) -> Hits:
    store = condsearch.open(root, model=condsearch.Model(Vectorizer(HashEncoder(), None, "none", "")))
    store.index(TEXTS, [COLOUR], ids=[f"r{i}" for i in range(len(TEXTS))], name="c")
    return store.search("a girl in a red dress", condition=COLOUR, k=k)


def test_a_search_ranks_its_hits_from_one_and_every_table_says_the_same(tmp_path: Path) -> None:
    hits = _hits(tmp_path)
    assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert [d["rank"] for d in hits.to_dicts()] == [1, 2, 3, 4, 5]
    assert hits.to_arrow().column("rank").to_pylist() == [1, 2, 3, 4, 5]
    assert [r["rank"] for r in query_answer(hits)["results"]] == [1, 2, 3, 4, 5]
    assert list(hits.to_pandas()["rank"]) == [1, 2, 3, 4, 5]


def test_a_slice_keeps_its_hits_places(tmp_path: Path) -> None:
    hits = _hits(tmp_path, k=8)
    page = hits[3:6]
    assert [h.rank for h in page] == [4, 5, 6]
    assert [d["rank"] for d in page.to_dicts()] == [4, 5, 6]
    assert [d["id"] for d in page.to_dicts()] == [h.id for h in hits.hits[3:6]]


def test_hits_built_by_hand_are_placed_by_position_and_compare_as_before() -> None:
    a, b = Hit("a", 0.9, "first", 3), Hit("b", 0.5, "second", 0)
    assert a.rank == 0  # not placed yet: the old positional constructor still works
    hits = Hits("q", COLOUR, (a, b))
    assert [h.rank for h in hits] == [1, 2]
    assert hits[0] == a  # rank is a place, not part of what was found
    assert [d["rank"] for d in hits.to_dicts()] == [1, 2]
    given = Hits("q", COLOUR, (Hit("x", 0.4, "t", 1, rank=7),))
    assert given[0].rank == 7 and given.to_dicts()[0]["rank"] == 7


def test_calibration_keeps_the_rank(tmp_path: Path) -> None:
    from dataclasses import replace

    hits = _hits(tmp_path)
    calibrated = replace(hits, hits=tuple(replace(h, z=1.0) for h in hits), calibrated=True)
    assert [h.rank for h in calibrated] == [1, 2, 3, 4, 5]
