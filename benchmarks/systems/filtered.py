"""Metadata filters (issue 59): filtered queries beside unfiltered ones, on an index of N synthetic rows.

Writes N unit vectors with two kept columns, ``lang`` (5 values) and ``year`` (1990-2029, both drawn at
random, independent of the vectors), into an index in a store, loads it as a query does, and times per
query (one query vector at a time on one search thread, p50 and p95 over the queries):

- unfiltered: the index's search;
- filtered: the filter evaluated over the kept columns (:func:`condsearch.query.search.filter_rows`) and
  the search among the rows it keeps (:meth:`FaissIndex.search_among`, at ``QueryConfig``'s
  ``exact_filter_rows`` and ``filter_widen_max``), for a narrow filter (~5% of the rows) and a broad one
  (~87%).

The vectors are clustered by default (``rows / 500`` random centres plus noise, queries near corpus rows,
as ``benchmarks/systems/gpu_search.py`` makes them): on random vectors HNSW and IVF find little even
unfiltered. ``--random`` writes random ones.

Every filtered result is checked against brute force, filter then rank (numpy over the same vectors): Flat
must give the same ids in the same order. With ``--approx`` the same rows go into HNSW32 (searched at each
``--ef-search``) and IVF<lists>,Flat (at the nprobe ``auto`` would record), and for each the recall@10 of

- the unfiltered search against exact search over every row (what the index finds on its own);
- each filtered search against filter-then-rank brute force, as a query runs it (exact up to
  ``exact_filter_rows`` allowed rows), and through FAISS's selector whatever the rows allowed: widened
  (efSearch or nprobe times 1/share of rows allowed, at most ``filter_widen_max``) and not (as unfiltered).

    nice -n 10 python -m benchmarks.systems.filtered --rows 100000 --approx \\
        --json-out benchmarks/systems/results/filtered_100k.json
    python -m benchmarks.systems.filtered --smoke
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks._lib.common import log, run_info, write_json
from condsearch.base.ann import IndexConfig, apply_search_params, ivf_nlist
from condsearch.base.faiss_indexes import build_index, search_threads
from condsearch.base.filtered_search import widening
from condsearch.query.config import QueryConfig
from condsearch.query.search import filter_rows
from condsearch.store.folder import IndexStore, Manifest
from condsearch.store.searchable import FaissIndex

LANGS = ("en", "de", "fr", "es", "it")
FILTERS = {
    "narrow": ("lang = 'en' AND year >= 2020", lambda lang, year: (lang == "en") & (year >= 2020)),
    "broad": ("year >= 1995", lambda lang, year: year >= 1995),
}
K = 10
ROWS_PER_CLUSTER = 500


def _unit(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)


def rows_and_queries(
    n: int, d: int, queries: int, *, clustered: bool, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, pa.Table]:
    """Return (vectors, queries, kept columns): unit vectors, clustered (centres plus noise) or random."""
    rng = np.random.default_rng(seed)
    if clustered:
        centres = rng.standard_normal((max(1, n // ROWS_PER_CLUSTER), d), dtype=np.float32)
        vectors = np.empty((n, d), dtype=np.float32)
        for start in range(0, n, 1 << 16):
            m = min(1 << 16, n - start)
            block = centres[rng.integers(0, len(centres), m)] + 0.6 * rng.standard_normal((m, d), dtype=np.float32)
            vectors[start : start + m] = _unit(block)
        near = vectors[rng.integers(0, n, queries)]
        qs = _unit(near + 0.05 * rng.standard_normal((queries, d), dtype=np.float32))
    else:
        vectors = _unit(rng.standard_normal((n, d), dtype=np.float32))
        qs = _unit(rng.standard_normal((queries, d), dtype=np.float32))
    kept = pa.table({"lang": [LANGS[i] for i in rng.integers(0, 5, n)], "year": rng.integers(1990, 2030, n)})
    return vectors, qs, kept


def brute_force(vectors: np.ndarray, allowed: np.ndarray, queries: np.ndarray, k: int = K) -> np.ndarray:
    """Return each query's k best allowed rows (filter, then rank), best first, a chunk of rows at a time."""
    best_s = np.empty((len(queries), 0), dtype=np.float32)
    best_i = np.empty((len(queries), 0), dtype=np.int64)
    for start in range(0, len(allowed), 1 << 15):
        rows = allowed[start : start + (1 << 15)]
        scores = np.concatenate([best_s, queries @ vectors[rows].T], axis=1)
        ids = np.concatenate([best_i, np.broadcast_to(rows, (len(queries), len(rows)))], axis=1)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        best_s, best_i = np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)
    return best_i


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Return the mean share of each row of truth that found holds (recall@k, k = truth's columns)."""
    hits = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(found, truth, strict=True)]
    return round(float(np.mean(hits)) / truth.shape[1], 4)


def _write(root: Path, vectors: np.ndarray, kept: pa.Table, factory: str, search_params: str) -> FaissIndex:
    n, d = vectors.shape
    index = build_index(vectors, factory, search_params=search_params)
    manifest = Manifest(
        condition=f"synthetic {factory}",
        corpus_name="synthetic",
        corpus_path="<memory>",
        corpus_checksum="",
        model_id="synthetic",
        model_revision="",
        encoder={},
        mode="case",
        head="none",
        head_checksum="",
        dim=d,
        metric="inner_product",
        factory=factory,
        n_vectors=n,
        n_skipped=0,
        search_params=search_params,
    )
    store = IndexStore(root)
    ids: list[str | int] = list(range(n))
    name = store.write(manifest, index, ids, [f"row {i}" for i in ids], vectors, metadata=kept)
    return FaissIndex.of(store.load(name), on_device=False)


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p95_ms": round(float(np.percentile(ms, 95)), 3)}


def _timed(qs: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, list[float]]:
    """Return fn's ids for each query, one query at a time, and each call's seconds."""
    ids, times = [], []
    for q in qs:
        t0 = time.perf_counter()
        ids.append(fn(q[None]))
        times.append(time.perf_counter() - t0)
    return np.concatenate(ids), times


def _among(
    index: FaissIndex, allowed: np.ndarray, exact_rows: int, widen_max: float
) -> Callable[[np.ndarray], np.ndarray]:
    """Return a search of a query among the allowed rows (the filter already evaluated)."""

    def search(q: np.ndarray) -> np.ndarray:
        return index.search_among(q, K, allowed, exact_rows, widen_max=widen_max).result.ids

    return search


def _measure(
    index: FaissIndex, qs: np.ndarray, truth: dict[str, tuple[str, np.ndarray, np.ndarray]], *, approx: bool
) -> dict[str, object]:
    """Time and check one index (at its current search parameters) unfiltered and under each filter."""
    n = index.stored.index.ntotal
    ids, times = _timed(qs, lambda q: index.search(q, K).result.ids)
    unfiltered: dict[str, object] = {**_percentiles(times)}
    if approx:
        unfiltered["recall_at_10"] = recall_at_k(ids, truth["unfiltered"][2])
    result: dict[str, object] = {"unfiltered": unfiltered}
    exact_rows, widen_max = QueryConfig.exact_filter_rows, QueryConfig.filter_widen_max
    for label, (where, allowed, brute) in truth.items():
        if label == "unfiltered":
            continue

        def query(q: np.ndarray, where: str = where) -> np.ndarray:
            rows = filter_rows(index, where)
            assert rows is not None
            return index.search_among(q, K, rows, exact_rows, widen_max=widen_max).result.ids

        ids, times = _timed(qs, query)
        _, alone = _timed(qs, _among(index, allowed, exact_rows, widen_max))
        same = int(sum(np.array_equal(a, b) for a, b in zip(ids, brute, strict=True)))
        entry: dict[str, object] = {
            "where": where,
            "allowed_rows": len(allowed),
            "path": "exact" if not approx or len(allowed) <= exact_rows else "selector",
            **_percentiles(times),
            "search_p50_ms": _percentiles(alone)["p50_ms"],  # without evaluating the filter
            "equal_to_brute_force": f"{same}/{len(qs)}",
            "recall_at_10": recall_at_k(ids, brute),
        }
        if approx:  # through the selector whatever the rows allowed: widened, and not (as unfiltered)
            entry["selector_widening"] = round(widening(n, len(allowed), widen_max), 3)
            for key, most in (("selector_widened", widen_max), ("selector_as_unfiltered", 1.0)):
                ids, times = _timed(qs, _among(index, allowed, 0, most))
                entry[key] = {"recall_at_10": recall_at_k(ids, brute), "search_p50_ms": _percentiles(times)["p50_ms"]}
        result[label] = entry
    return result


def run(rows: int, dim: int, queries: int, *, approx: bool, clustered: bool, ef_search: list[int]) -> dict[str, object]:
    vectors, qs, kept = rows_and_queries(rows, dim, queries, clustered=clustered)
    lang, year = np.asarray(kept["lang"].to_pylist()), kept["year"].to_numpy()
    search_threads(1)  # one query at a time on one thread: the figure a single request sees
    truth: dict[str, tuple[str, np.ndarray, np.ndarray]] = {
        "unfiltered": ("", np.arange(rows), brute_force(vectors, np.arange(rows), qs))
    }
    for label, (where, expected) in FILTERS.items():
        allowed = np.flatnonzero(expected(lang, year))
        truth[label] = (where, allowed, brute_force(vectors, allowed, qs))
    config = IndexConfig()
    nlist = ivf_nlist(rows, config)
    builds = [("Flat", "", [""])]
    if approx:
        builds += [
            ("HNSW32", f"efSearch={ef_search[0]}", [f"efSearch={ef}" for ef in ef_search]),
            (f"IVF{nlist},Flat", "", [f"nprobe={max(1, min(nlist, round(nlist * config.probe_share)))}"]),
        ]
    out: dict[str, object] = {
        "rows": rows,
        "dim": dim,
        "queries": queries,
        "k": K,
        "vectors": f"clustered ({max(1, rows // ROWS_PER_CLUSTER)} centres)" if clustered else "random",
        "search_threads": 1,
        "exact_filter_rows": QueryConfig.exact_filter_rows,
        "filter_widen_max": QueryConfig.filter_widen_max,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for factory, first, settings in builds:
            t0 = time.perf_counter()
            index = _write(Path(tmp) / factory.replace(",", "_"), vectors, kept, factory, first)
            log("filtered", f"{factory}: written and loaded in {time.perf_counter() - t0:.1f}s")
            for params in settings:
                apply_search_params(index.stored.index, params)
                label = f"{factory} {params}".strip()
                out[label] = _measure(index, qs, truth, approx=factory != "Flat")
                log("filtered", f"{label}: {out[label]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--approx", action="store_true", help="also HNSW32 and IVF,Flat: unfiltered and filtered recall@10"
    )
    parser.add_argument(
        "--ef-search",
        default=f"16,{IndexConfig.hnsw_ef_search}",
        help="efSearch values HNSW32 is searched at [default: FAISS's 16 and auto's %(default)s]",
    )
    parser.add_argument(
        "--clustered",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="clustered vectors (centres plus noise); --no-clustered: random ones [default: clustered]",
    )
    parser.add_argument("--smoke", action="store_true", help="100,000 rows, 64-d, 20 queries, Flat: seconds")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows, dim, queries, approx = (
        (100_000, 64, 20, False) if args.smoke else (args.rows, args.dim, args.queries, args.approx)
    )
    ef_search = [int(ef) for ef in args.ef_search.split(",")]
    log("filtered", f"{rows} rows, {dim}-d, {queries} queries{', and HNSW32, IVF' if approx else ''}")
    result = run(rows, dim, queries, approx=approx, clustered=args.clustered, ef_search=ef_search)
    result["run_info"] = run_info(device="cpu")
    result["smoke"] = args.smoke
    json_out = args.json_out or (Path(__file__).parent / "results" / "filtered_smoke.json" if args.smoke else None)
    write_json(result, json_out)
    flat = result["Flat"]
    assert isinstance(flat, dict)
    exact = all(flat[label]["equal_to_brute_force"] == f"{queries}/{queries}" for label in FILTERS)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
