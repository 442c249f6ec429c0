"""Metadata filters (issue 59): a filtered query beside an unfiltered one, on an index of N random rows.

Writes N random unit vectors (random vectors stand for encoded rows: a filter does not look at them) with
two kept columns, ``lang`` (5 values) and ``year`` (1990-2029), into a Flat index in a store, loads it as a
query does, and times per query (one query vector at a time, p50 and p95 over the queries):

- unfiltered: the index's search;
- filtered: the filter evaluated over the kept columns (:func:`condsearch.query.search.filter_rows`) and
  the search among the rows it keeps (:meth:`FaissIndex.search_among`), for a selective filter (~5% of
  the rows) and a broad one (~87%).

Every filtered result is checked against brute force, filter then rank (numpy over the same vectors): the
same ids in the same order. With ``--hnsw`` the same rows in HNSW32 too: filtered recall@10 against that
brute force (exact at up to ``QueryConfig.exact_filter_rows`` allowed rows, FAISS's selector above).

    nice -n 10 python -m benchmarks.systems.filtered --rows 100000 --hnsw \\
        --json-out benchmarks/systems/results/filtered_100k.json
    python -m benchmarks.systems.filtered --smoke
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks._lib.common import log, run_info, write_json
from condsearch.base.faiss_indexes import build_index, search_threads
from condsearch.query.config import QueryConfig
from condsearch.query.search import filter_rows
from condsearch.store.folder import IndexStore, Manifest
from condsearch.store.searchable import FaissIndex

LANGS = ("en", "de", "fr", "es", "it")
FILTERS = {
    "selective": ("lang = 'en' AND year >= 2020", lambda lang, year: (lang == "en") & (year >= 2020)),
    "broad": ("year >= 1995", lambda lang, year: year >= 1995),
}
K = 10


def _rows(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, pa.Table]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, d), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    kept = pa.table({"lang": [LANGS[i] for i in rng.integers(0, 5, n)], "year": rng.integers(1990, 2030, n)})
    return vectors, kept


def _write(root: Path, vectors: np.ndarray, kept: pa.Table, factory: str) -> FaissIndex:
    n, d = vectors.shape
    index = build_index(vectors, factory)
    manifest = Manifest(
        condition=f"random {factory}",
        corpus_name="random",
        corpus_path="<memory>",
        corpus_checksum="",
        model_id="random",
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
        search_params="",
    )
    store = IndexStore(root)
    ids = list(range(n))
    name = store.write(manifest, index, ids, [f"row {i}" for i in ids], vectors, metadata=kept)
    return FaissIndex.of(store.load(name), on_device=False)


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p95_ms": round(float(np.percentile(ms, 95)), 3)}


def _brute(vectors: np.ndarray, keep: np.ndarray, query: np.ndarray) -> np.ndarray:
    allowed = np.flatnonzero(keep)
    scores = vectors[allowed] @ query
    return allowed[np.argsort(-scores, kind="stable")[:K]]


def run(rows: int, dim: int, queries: int, hnsw: bool) -> dict[str, object]:
    vectors, kept = _rows(rows, dim)
    lang, year = np.asarray(kept["lang"].to_pylist()), kept["year"].to_numpy()
    rng = np.random.default_rng(1)
    qs = rng.standard_normal((queries, dim), dtype=np.float32)
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    search_threads(1)  # one query at a time on one thread: the figure a single request sees
    out: dict[str, object] = {"rows": rows, "dim": dim, "queries": queries, "k": K, "search_threads": 1}
    with tempfile.TemporaryDirectory() as tmp:
        for factory in ("Flat", "HNSW32") if hnsw else ("Flat",):
            t0 = time.perf_counter()
            index = _write(Path(tmp) / factory, vectors, kept, factory)
            log("filtered", f"{factory}: written and loaded in {time.perf_counter() - t0:.1f}s")
            times = []
            for q in qs:
                t0 = time.perf_counter()
                index.search(q[None], K)
                times.append(time.perf_counter() - t0)
            result: dict[str, object] = {"unfiltered": _percentiles(times)}
            for label, (where, expected) in FILTERS.items():
                keep = expected(lang, year)
                times, same, recall = [], 0, []
                for q in qs:
                    t0 = time.perf_counter()
                    allowed = filter_rows(index, where)
                    assert allowed is not None
                    found = index.search_among(q[None], K, allowed, QueryConfig.exact_filter_rows)
                    times.append(time.perf_counter() - t0)
                    got, brute = found.result.ids[0], _brute(vectors, keep, q)
                    same += int(np.array_equal(got, brute))
                    recall.append(len(set(got.tolist()) & set(brute.tolist())) / K)
                result[label] = {
                    "where": where,
                    "allowed_rows": int(keep.sum()),
                    **_percentiles(times),
                    "equal_to_brute_force": f"{same}/{queries}",
                    "recall_at_10": round(float(np.mean(recall)), 4),
                }
            out[factory] = result
            log("filtered", f"{factory}: {result}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--hnsw", action="store_true", help="also HNSW32: filtered recall@10 (a minute to build)")
    parser.add_argument("--smoke", action="store_true", help="100,000 rows, 64-d, 20 queries, Flat: seconds")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows, dim, queries, hnsw = (
        (100_000, 64, 20, False) if args.smoke else (args.rows, args.dim, args.queries, args.hnsw)
    )
    log("filtered", f"{rows} rows, {dim}-d, {queries} queries{', and HNSW32' if hnsw else ''}")
    result = run(rows, dim, queries, hnsw)
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
