"""Filtered search on approximate indexes keeps about the unfiltered search's recall (issue 59 item 1).

On a small clustered set (centres plus noise, as ``benchmarks/systems/filtered.py`` makes them), the k best
allowed rows an HNSW or IVF index finds through FAISS's selector are compared with filter-then-rank brute
force, and the unfiltered search with exact search over every row: filtered recall@10 must be at least the
unfiltered recall less a small margin, at a broad filter and a narrow one (the search widened by
``QueryConfig.filter_widen_max``), where the search as unfiltered (not widened) falls short at the narrow one.
"""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from benchmarks.systems.filtered import brute_force, recall_at_k, rows_and_queries
from condsearch.base.filtered_search import search_allowed, widening
from condsearch.query.config import QueryConfig

N, D, QUERIES, K = 4000, 32, 60, 10
MARGIN = 0.03  # filtered recall may fall this much below the unfiltered search's


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    vectors, queries, _ = rows_and_queries(N, D, QUERIES, clustered=True, seed=3)
    return vectors, queries


def _index(factory: str, vectors: np.ndarray) -> faiss.Index:
    index = faiss.index_factory(D, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    if factory.startswith("HNSW"):
        _hnsw(index).efSearch = 16
    else:
        faiss.extract_index_ivf(index).nprobe = 1
    return index


def _hnsw(index: faiss.Index) -> faiss.HNSW:
    inner = faiss.downcast_index(index)
    assert isinstance(inner, faiss.IndexHNSW)
    return inner.hnsw


def _allowed(share: float, seed: int) -> np.ndarray:
    return np.flatnonzero(np.random.default_rng(seed).random(N) < share)


@pytest.mark.parametrize("factory", ["HNSW16", "IVF64,Flat"])
def test_filtered_recall_is_about_the_unfiltered(data: tuple[np.ndarray, np.ndarray], factory: str) -> None:
    vectors, queries = data
    index = _index(factory, vectors)
    _, unfiltered_ids = index.search(queries, K)
    unfiltered = recall_at_k(unfiltered_ids, brute_force(vectors, np.arange(N), queries))
    assert 0.2 < unfiltered < 1.0  # an approximate search that misses some rows: the case to keep up with
    for share in (0.85, 0.1):  # broad, narrow
        allowed = _allowed(share, seed=int(share * 100))
        truth = brute_force(vectors, allowed, queries)
        found, exact = search_allowed(index, queries, K, allowed, exact_rows=0, widen_max=QueryConfig.filter_widen_max)
        assert not exact and np.isin(found.ids, allowed).all()
        assert recall_at_k(found.ids, truth) >= unfiltered - MARGIN, (factory, share)


def test_narrow_filters_need_the_widening(data: tuple[np.ndarray, np.ndarray]) -> None:
    """Without widening, a narrow filter's HNSW search finds fewer of its rows than the widened search does."""
    vectors, queries = data
    index = _index("HNSW16", vectors)
    allowed = _allowed(0.05, seed=7)
    truth = brute_force(vectors, allowed, queries)
    recall = {}
    for most in (1.0, QueryConfig.filter_widen_max):
        found, _ = search_allowed(index, queries, K, allowed, exact_rows=0, widen_max=most)
        recall[most] = recall_at_k(found.ids, truth)
    assert recall[QueryConfig.filter_widen_max] > recall[1.0] + 0.05, recall


def test_widening_is_one_over_the_share_capped() -> None:
    assert widening(1000, 1000, 32) == 1.0
    assert widening(1000, 250, 32) == pytest.approx(4.0)
    assert widening(1_000_000, 100, 32) == 32.0
    assert widening(1000, 0, 32) == 32.0
    assert widening(1000, 10, 1) == 1.0


@pytest.mark.parametrize("factory", ["HNSW16", "IVF64,Flat"])
def test_the_index_own_settings_are_left_as_they_were(data: tuple[np.ndarray, np.ndarray], factory: str) -> None:
    """Widening goes through per-search parameters: the index's efSearch and nprobe stay as set."""
    vectors, queries = data
    index = _index(factory, vectors)
    search_allowed(index, queries, K, _allowed(0.1, seed=1), exact_rows=0, widen_max=QueryConfig.filter_widen_max)
    if factory.startswith("HNSW"):
        assert _hnsw(index).efSearch == 16
    else:
        assert faiss.extract_index_ivf(index).nprobe == 1
