"""Search among allowed rows only (issue 59's metadata filters): the rows a filter keeps are ranked, and no others.

The filter is applied before ranking, so a query gets its k best allowed rows rather than the allowed
rows among its k best. How, by index type:

- **Flat, SQ, PQ** (codes stored row by row): the allowed rows' vectors (decoded codes) are scored
  directly, a chunk at a time: exact, at the cost of one product per allowed row. Past ``exact_rows``
  allowed rows, Flat and SQ scan every row with FAISS's selector (``SearchParameters(sel=…)``): exact too.
- **HNSW**: exact in the same way when at most ``exact_rows`` rows are allowed (its storage holds every
  row's vector or codes); more are searched in the graph with FAISS's selector
  (``SearchParametersHNSW(sel=…)``), which walks through rows it may not return: approximate, as the
  unfiltered search is.
- **IVF**: FAISS's selector (``SearchParametersIVF(sel=…)``) in the lists the index probes; every list
  when at most ``exact_rows`` rows are allowed, which is exact among them.
- **anything else**: over-fetched, the unfiltered search asked for more rows until k allowed ones come back.

Searched with the selector, an HNSW or IVF index searches wider than unfiltered: a query's k best allowed rows
lie about as far out as its k/share best rows, share being the part of the rows allowed. So efSearch (HNSW)
and nprobe (IVF, at most every list; max_codes too where the index caps it) are multiplied by 1/share, at most
``widen_max`` times (:func:`widening`): filtered recall stays about the unfiltered search's
(``benchmarks/systems/filtered.py`` measures both).

A query that an approximate search leaves short of k allowed rows is searched again exhaustively, so
results are never short while k rows are allowed. Scores are the index's own (its codes' inner
products), as unfiltered.
"""

from __future__ import annotations

import math
from typing import Any

import faiss
import numpy as np

from condsearch.base.ann import SEARCH_PARAM_MAX
from condsearch.base.faiss_indexes import SearchResult


def search_allowed(
    index: faiss.Index, queries: np.ndarray, k: int, allowed: np.ndarray, exact_rows: int, *, widen_max: float
) -> tuple[SearchResult, bool]:
    """Return the k best allowed rows (sorted int64 positions) for each query, and whether that is exact.

    ``exact_rows``: at most this many allowed rows are ranked exhaustively by an HNSW or IVF index; above, its
    search is widened at most ``widen_max`` times (:func:`widening`; 1: as unfiltered). The result has
    min(k, len(allowed)) columns, best first.
    """
    x = np.ascontiguousarray(queries, dtype=np.float32)
    allowed = np.asarray(allowed, dtype=np.int64)
    k = max(0, min(k, len(allowed)))
    if k == 0:
        return _empty(len(x)), True
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexFlat | faiss.IndexScalarQuantizer) and len(allowed) > exact_rows:
        return _with_selector(index, x, k, allowed, faiss.SearchParameters()), True  # scans every row: exact
    if isinstance(inner, faiss.IndexFlat | faiss.IndexScalarQuantizer | faiss.IndexPQ):
        return _score_rows(inner, x, k, allowed, exact_rows), True
    if isinstance(inner, faiss.IndexHNSW):
        if len(allowed) <= exact_rows:
            return _score_rows(inner, x, k, allowed, exact_rows), True
        params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]  # SWIG, untyped
        wider = widening(index.ntotal, len(allowed), widen_max)
        params.efSearch = _scaled(max(int(inner.hnsw.efSearch), k), wider, SEARCH_PARAM_MAX["efSearch"])
        found = _with_selector(index, x, k, allowed, params)
        return _fill_short(found, lambda rows: _score_rows(inner, x[rows], k, allowed, exact_rows)), False
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        return _over_fetch(index, x, k, allowed), False
    every = len(allowed) <= exact_rows
    wider = widening(index.ntotal, len(allowed), widen_max)
    found = _with_selector(index, x, k, allowed, _ivf_params(ivf, every=every, wider=wider))
    if every:
        return found, True
    return _fill_short(
        found, lambda rows: _with_selector(index, x[rows], k, allowed, _ivf_params(ivf, every=True))
    ), False


def widening(n: int, allowed: int, widen_max: float) -> float:
    """Return how many times wider a selector search of ``allowed`` of ``n`` rows goes: 1/share, in [1, widen_max]."""
    return max(1.0, min(float(widen_max), n / max(1, allowed)))


def _scaled(value: int, wider: float, most: int) -> int:
    """Return value multiplied by wider, rounded up, at most ``most`` (and never below value)."""
    return max(value, min(most, math.ceil(value * wider)))


def _empty(n: int) -> SearchResult:
    return SearchResult(np.empty((n, 0), dtype=np.float32), np.empty((n, 0), dtype=np.int64))


def _score_rows(index: faiss.Index, x: np.ndarray, k: int, allowed: np.ndarray, chunk: int) -> SearchResult:
    """Score every allowed row's vector (a flat index's own, else its decoded codes) and keep the k best."""
    flat = _flat_view(index)
    best_scores = np.empty((len(x), 0), dtype=np.float32)
    best_rows = np.empty((len(x), 0), dtype=np.int64)
    step = max(1 << 12, chunk)  # rows scored at once: a few MB of vectors at least
    for start in range(0, len(allowed), step):
        rows = allowed[start : start + step]
        vectors = flat[rows] if flat is not None else index.reconstruct_batch(rows)
        scores = np.concatenate([best_scores, x @ vectors.T], axis=1)
        ids = np.concatenate([best_rows, np.broadcast_to(rows, (len(x), len(rows)))], axis=1)
        if scores.shape[1] > k:
            keep = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            scores, ids = np.take_along_axis(scores, keep, axis=1), np.take_along_axis(ids, keep, axis=1)
        best_scores, best_rows = scores, ids
    order = np.lexsort((best_rows, -best_scores), axis=1)  # best first; ties by row
    return SearchResult(
        np.ascontiguousarray(np.take_along_axis(best_scores, order, axis=1), dtype=np.float32),
        np.ascontiguousarray(np.take_along_axis(best_rows, order, axis=1), dtype=np.int64),
    )


def _flat_view(index: faiss.Index) -> np.ndarray | None:
    """Return a flat index's (n, d) vectors without copying them (an HNSW index's flat storage's), else None."""
    if isinstance(index, faiss.IndexHNSW) and index.storage is not None:
        index = faiss.downcast_index(index.storage)
    if not isinstance(index, faiss.IndexFlat) or index.ntotal == 0:
        return None
    data = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)
    return np.asarray(data).reshape(index.ntotal, index.d)


def _selector(n: int, allowed: np.ndarray) -> tuple[Any, np.ndarray]:
    """Return FAISS's selector of the allowed rows (a bitmap of n bits) and the bitmap, which must outlive it."""
    keep = np.zeros(n, dtype=bool)
    keep[allowed] = True
    bits = np.packbits(keep, bitorder="little")  # row i is bit i % 8 of byte i // 8, as FAISS reads it
    return faiss.IDSelectorBitmap(n, faiss.swig_ptr(bits)), bits


def _with_selector(index: faiss.Index, x: np.ndarray, k: int, allowed: np.ndarray, params: Any) -> SearchResult:
    selector, bits = _selector(index.ntotal, allowed)
    params.sel = selector
    scores, ids = index.search(x, k, params=params)
    del bits  # the selector reads it during the search only
    return SearchResult(scores, ids)


def _ivf_params(ivf: Any, *, every: bool, wider: float = 1.0) -> Any:
    """Return IVF search parameters: every list (no cap on codes), else the index's own widened ``wider`` times."""
    params = faiss.SearchParametersIVF()
    nlist = int(ivf.nlist)
    params.nprobe = nlist if every else _scaled(int(ivf.nprobe), wider, nlist)
    codes = int(ivf.max_codes)  # 0: no cap
    params.max_codes = 0 if every or codes == 0 else _scaled(codes, wider, SEARCH_PARAM_MAX["max_codes"])
    return params


def _fill_short(found: SearchResult, again: Any) -> SearchResult:
    """Return found with each query that got fewer than k rows answered by again(those queries' positions)."""
    short = np.flatnonzero((found.ids < 0).any(axis=1))
    if len(short):
        more = again(short)
        found.scores[short], found.ids[short] = more.scores, more.ids
    return found


def _over_fetch(index: faiss.Index, x: np.ndarray, k: int, allowed: np.ndarray) -> SearchResult:
    """Search unfiltered for more and more rows until each query has k allowed ones (or every row was asked)."""
    n = index.ntotal
    keep = np.zeros(n, dtype=bool)
    keep[allowed] = True
    scores = np.full((len(x), k), -np.inf, dtype=np.float32)
    ids = np.full((len(x), k), -1, dtype=np.int64)
    todo = np.arange(len(x))
    fetch = min(n, k * max(2, 2 * n // len(allowed)))
    while len(todo):
        got_scores, got_ids = index.search(x[todo], fetch)
        left = []
        for j, q in enumerate(todo):
            hits = got_ids[j] >= 0
            hits[hits] = keep[got_ids[j][hits]]
            rows, row_scores = got_ids[j][hits][:k], got_scores[j][hits][:k]
            if len(rows) == k or fetch >= n:
                scores[q, : len(rows)], ids[q, : len(rows)] = row_scores, rows
            else:
                left.append(q)
        todo, fetch = np.asarray(left, dtype=np.int64), min(n, fetch * 4)
    return SearchResult(scores, ids)
