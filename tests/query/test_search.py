"""The one query path: finding an index by condition, checking queries and k, capping k, the named hits."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from condsearch.base.faiss_indexes import exact_search
from condsearch.corpus.reader import read_corpus
from condsearch.errors import AmbiguousCondition, CondsearchError, StoreError, UnknownCondition
from condsearch.ingest.chunks import index_corpus
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.hits import Hit, Hits
from condsearch.query.search import Request, answer, answer_batch, capped_k
from condsearch.store.folder import IndexStore
from condsearch.store.listing import find_index
from condsearch.store.manifest import Manifest
from condsearch.store.searchable import FaissIndex
from tests.conftest import SENTENCES, HashEncoder

COLOUR = "color of the dress"


def _manifest(condition: str, corpus: str = "corpus") -> Manifest:
    return Manifest(condition, corpus, "", "", "m", "", {}, "case", "none", "", 4, "inner_product", "Flat", 3, 0)


# ---------------------------------------------------------------- find_index


def test_find_index_picks_the_one_index_of_a_condition() -> None:
    listing = [("a", _manifest(COLOUR)), ("b", _manifest("sport")), ("c", _manifest(COLOUR, "other"))]
    assert find_index(listing, "sport") == ("b", listing[1][1])
    assert find_index(listing, f"  {COLOUR} ", "other") == ("c", listing[2][1])  # stripped, as on the way in
    assert find_index(listing, COLOUR, "corpus")[0] == "a"


def test_find_index_refuses_an_ambiguous_condition_naming_the_corpora() -> None:
    listing = [("a", _manifest(COLOUR, "b-corpus")), ("c", _manifest(COLOUR, "a-corpus"))]
    with pytest.raises(AmbiguousCondition, match="several corpora .a-corpus, b-corpus.; choose one with --corpus"):
        find_index(listing, COLOUR)
    with pytest.raises(AmbiguousCondition, match='choose one with "corpus"') as info:
        find_index(listing, COLOUR, corpus_option='"corpus"')
    assert info.value.corpora == ["a-corpus", "b-corpus"] and isinstance(info.value, StoreError)


def test_find_index_lists_what_is_indexed_and_names_damaged_entries() -> None:
    damaged = StoreError(f"root{os.sep}x/manifest.json: corrupt manifest")
    listing = [("a", _manifest(COLOUR)), ("x", damaged), ("b", _manifest("sport"))]
    with pytest.raises(UnknownCondition) as info:
        find_index(listing, "mood", where="root", root="root")
    message = str(info.value)
    assert message.startswith("no index for condition 'mood' in root; indexed: 'color of the dress'; 'sport'")
    assert message.endswith("; 1 index is damaged: x/manifest.json: corrupt manifest (run condsearch verify)")
    assert info.value.conditions == [COLOUR, "sport"]
    with pytest.raises(UnknownCondition, match="no index for condition 'sport' for corpus 'other'; indexed"):
        find_index(listing, "sport", "other")
    with pytest.raises(UnknownCondition, match="indexed: none$"):
        find_index([], "mood")
    with pytest.raises(CondsearchError, match="the condition is empty"):
        find_index(listing, "  ")


def test_every_store_finds_through_find_index(tmp_path: Path, corpus_file: Path) -> None:
    store = IndexStore(tmp_path / "idx")
    vec = Vectorizer(HashEncoder(), None, "none", "")
    index_corpus(read_corpus(corpus_file), [COLOUR], vec, store, corpus_name="c")
    with pytest.raises(UnknownCondition, match=f"no index for condition 'mood' in {store.root}; indexed: '{COLOUR}'"):
        store.find("mood")
    assert store.find(f" {COLOUR}") == store.find(COLOUR, "c")


# ---------------------------------------------------------------- answer: checks, k capping, hits


@pytest.fixture
def searchable(tmp_path: Path, corpus_file: Path) -> tuple[FaissIndex, Vectorizer]:
    vec = Vectorizer(HashEncoder(), None, "none", "")
    store = IndexStore(tmp_path / "idx")
    [name] = index_corpus(read_corpus(corpus_file), [COLOUR], vec, store, corpus_name="corpus")
    return FaissIndex.of(store.load(name), on_device=False), vec


def test_k_is_capped_at_the_rows_in_one_place(searchable: tuple[FaissIndex, Vectorizer]) -> None:
    index, vec = searchable
    n = len(SENTENCES)
    assert capped_k(3, n) == 3 and capped_k(n + 5, n) == n
    small = answer(index, vec, [SENTENCES[2]], 3)
    assert small.notice is None and small.result.ids.shape == (1, 3)
    big = answer(index, vec, [SENTENCES[2], SENTENCES[5]], n + 5)
    assert big.notice == f"k={n + 5} is larger than the index ({n} rows); returning all {n}"
    assert big.result.ids.shape == (2, n) and big.k_requested == n + 5 and big.n_rows == n
    assert [sorted(h.row for h in hits) for hits in big.hits] == [list(range(n))] * 2


def test_answer_refuses_bad_k_and_empty_queries(searchable: tuple[FaissIndex, Vectorizer]) -> None:
    index, vec = searchable
    for k in (0, -1):
        with pytest.raises(CondsearchError, match=f"k must be positive, got {k}"):
            answer(index, vec, ["q"], k)
    with pytest.raises(CondsearchError, match="a query is empty"):
        answer(index, vec, ["q", " \t"], 1)
    assert answer(index, vec, [], 3).hits == []


def test_hits_name_the_rows_best_first(searchable: tuple[FaissIndex, Vectorizer]) -> None:
    index, vec = searchable
    found = answer(index, vec, [SENTENCES[4]], 4)
    expected = exact_search(index.stored.index.reconstruct_n(0, len(SENTENCES)), vec.encode([SENTENCES[4]], COLOUR), 4)
    [hits] = found.hits
    assert [h.row for h in hits] == expected.ids[0].tolist()
    assert hits[0] == Hit(f"s{4}", hits[0].score, SENTENCES[4], 4) and abs(hits[0].score - 1.0) < 1e-5
    assert hits.query == SENTENCES[4] and hits.condition == COLOUR
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert isinstance(hits[1:3], Hits) and len(hits[1:3]) == 2 and hits[1:3][0] == hits[1]


def test_answer_batch_answers_each_request_as_alone_and_fails_only_bad_ones(
    searchable: tuple[FaissIndex, Vectorizer],
) -> None:
    index, vec = searchable
    requests = [Request(index, vec, (SENTENCES[0],), 2), Request(index, vec, ("",), 2), Request(index, vec, ("a",), 99)]
    good, bad, capped = answer_batch(requests, one_pass=True)
    assert isinstance(bad, CondsearchError) and not isinstance(good, BaseException)
    assert not isinstance(capped, BaseException) and capped.result.ids.shape == (1, len(SENTENCES))
    alone = answer(index, vec, [SENTENCES[0]], 2)
    np.testing.assert_array_equal(good.result.ids, alone.result.ids)


# ---------------------------------------------------------------- Hits as tables


def _hits() -> Hits:
    return Hits("q", COLOUR, (Hit("a", 0.9, "first", 3), Hit("b", 0.5, "second", 0)))


def test_hits_as_dicts_arrow_and_pandas() -> None:
    hits = _hits()
    assert hits.to_dicts() == [
        {"rank": 1, "id": "a", "score": 0.9, "text": "first", "row": 3},
        {"rank": 2, "id": "b", "score": 0.5, "text": "second", "row": 0},
    ]
    table = hits.to_arrow()
    assert table.column_names == ["rank", "id", "score", "text", "row"] and table.num_rows == 2
    assert table.schema.field("score").type == pa.float64() and table.column("id").to_pylist() == ["a", "b"]
    pytest.importorskip("pandas")
    frame = hits.to_pandas()
    assert list(frame.columns) == ["rank", "id", "score", "text", "row"]
    assert frame["text"].tolist() == ["first", "second"]
    assert Hits("q", COLOUR, ()).to_arrow().num_rows == 0


def test_to_pandas_without_pandas_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    with pytest.raises(CondsearchError, match="needs pandas") as info:
        _hits().to_pandas()
    assert "\n" not in str(info.value)
