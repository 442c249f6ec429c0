"""FAISS indexes against the brute-force reference (faiss TestComputeGT style)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from condsearch.base.faiss_indexes import (
    FLAT_BLAS_MIN_QUERIES,
    SearchResult,
    build_index,
    exact_search,
    normalize,
    search,
    to_search_device,
)
from tests.conftest import assert_same_ranking
from tests.tolerance import score_tolerance


def _unit(n: int, d: int, seed: int) -> np.ndarray:
    return normalize(np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32))


def test_normalize_gives_unit_rows_and_keeps_zero_rows() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0], [-1.0, 0.0]], dtype=np.float64)
    out = normalize(x)
    assert out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0], [-1.0, 0.0]], atol=1e-7)
    assert x[0, 0] == 3.0  # the input is not modified


def test_exact_search_by_hand() -> None:
    corpus = np.array([[1, 0], [0, 1], [0.6, 0.8]], dtype=np.float32)
    res = exact_search(corpus, np.array([[1, 0]], dtype=np.float32), k=5)
    assert isinstance(res, SearchResult)
    assert res.ids.tolist() == [[0, 2, 1]]  # k is capped at the corpus size
    np.testing.assert_allclose(res.scores, [[1.0, 0.6, 0.0]], atol=1e-7)
    assert res.ids.dtype == np.int64


@pytest.mark.numerics
def test_flat_index_equals_brute_force() -> None:
    corpus, queries = _unit(500, 16, 0), _unit(20, 16, 1)
    index = build_index(corpus)
    assert index.ntotal == 500 and index.d == 16 and index.metric_type == faiss.METRIC_INNER_PRODUCT
    got = search(index, queries, 10)
    ref = exact_search(corpus, queries, 10)
    assert got.scores.shape == got.ids.shape == (20, 10)
    # FAISS and numpy sum the 16 products in other orders: the same neighbours up to ties
    assert_same_ranking((got.scores, got.ids), (ref.scores, ref.ids), score_tolerance(16))
    assert (np.diff(got.scores, axis=1) <= 1e-6).all()  # best first


@pytest.mark.parametrize("n_queries", [1, 3, FLAT_BLAS_MIN_QUERIES - 1, FLAT_BLAS_MIN_QUERIES, 40])
def test_queries_are_scored_by_one_product_over_the_stored_rows(n_queries: int) -> None:
    """Issue 61: NumPy scores FAISS's stored rows, one query or a batch (FAISS scanned once per query below
    FLAT_BLAS_MIN_QUERIES, and above ran its bundled BLAS's generic kernels), and FAISS's heaps pick the k best:
    the neighbours FAISS finds, up to ties, best first."""
    corpus, queries = _unit(3000, 24, 4), _unit(n_queries, 24, 5)
    index = build_index(corpus)
    got = search(index, queries, 10)
    d, i = index.search(queries, 10)  # FAISS's own scan
    assert got.ids.shape == (n_queries, 10) and got.ids.dtype == np.int64 and got.scores.dtype == np.float32
    assert_same_ranking((got.scores, got.ids), (d, i), score_tolerance(24))
    assert (np.diff(got.scores, axis=1) <= 0).all()
    assert search(index, queries, 5000).ids.shape == (n_queries, 3000)  # k past the rows: every row, ranked


@pytest.mark.parametrize("n_queries", [1, 2 * FLAT_BLAS_MIN_QUERIES])
def test_rows_that_score_the_same_come_in_row_order(n_queries: int) -> None:
    """Tied rows (a corpus's duplicates) come first-row-first, by NumPy's product or FAISS's alike, and the k-th
    place goes to the first of the rows tied for it."""
    row = _unit(1, 8, 6)
    corpus = np.concatenate([_unit(3, 8, 7), np.repeat(row, 6, axis=0), _unit(3, 8, 8)])
    index = build_index(corpus)
    got = search(index, np.repeat(row, n_queries, axis=0), 4)
    assert got.ids.tolist() == [[3, 4, 5, 6]] * n_queries


@pytest.mark.numerics
def test_a_batch_searched_by_matrix_product_finds_what_each_query_finds_alone() -> None:
    # a server's batch takes FAISS's BLAS path, a one-shot query one NumPy product: the same neighbours
    assert faiss.cvar.distance_compute_blas_threshold == FLAT_BLAS_MIN_QUERIES
    corpus, queries = _unit(2000, 32, 2), _unit(2 * FLAT_BLAS_MIN_QUERIES, 32, 3)
    index = build_index(corpus)
    batch = search(index, queries, 10)
    for i, query in enumerate(queries):
        alone = search(index, query[None], 10)
        assert_same_ranking(
            (batch.scores[i : i + 1], batch.ids[i : i + 1]), (alone.scores, alone.ids), score_tolerance(32)
        )


@pytest.mark.numerics
def test_hnsw_recall_is_high() -> None:
    corpus, queries = _unit(2000, 16, 2), _unit(50, 16, 3)
    got = search(build_index(corpus, "HNSW32"), queries, 10)
    ref = exact_search(corpus, queries, 10)
    recall = np.mean([len(set(g) & set(r)) / 10 for g, r in zip(got.ids, ref.ids, strict=True)])
    assert recall >= 0.9
    # whatever HNSW returns, the scores are the true inner products of the ids it returned
    true = np.take_along_axis(queries @ corpus.T, got.ids, axis=1)
    np.testing.assert_allclose(got.scores, true, rtol=0, atol=score_tolerance(16))


# IVF, HNSW and IVF-PQ recall is tested through the store with held-out queries in test_ann.py.


@pytest.mark.parametrize("factory", ["NotAnIndex", "PQ5", "IVF,,Flat", ""])
def test_bad_factory_string_is_value_error(factory: str) -> None:
    with pytest.raises(ValueError, match="factory|cannot train"):
        build_index(_unit(50, 16, 5), factory)


def test_ivf_with_too_few_vectors_is_value_error() -> None:
    with pytest.raises(ValueError, match="too few"):
        build_index(_unit(10, 16, 6), "IVF64,Flat")


def test_search_refuses_non_positive_k() -> None:
    index = build_index(_unit(5, 4, 7))
    with pytest.raises(ValueError, match="k must be positive"):
        search(index, _unit(1, 4, 8), 0)


def test_search_beyond_corpus_returns_every_row_unpadded() -> None:
    index = build_index(_unit(3, 4, 9))
    res = search(index, _unit(1, 4, 10), 5)
    assert res.ids.shape == (1, 3) and sorted(res.ids[0].tolist()) == [0, 1, 2] and res.n_found.tolist() == [3]


def test_cpu_index_stays_usable_after_to_search_device() -> None:
    corpus = _unit(100, 8, 11)
    index = to_search_device(build_index(corpus))
    np.testing.assert_array_equal(search(index, corpus[:3], 1).ids[:, 0], [0, 1, 2])
