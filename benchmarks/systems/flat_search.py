"""Exact search of a CPU flat index: condsearch's ``search`` against FAISS's own, by batch size (issue 61).

A server searches batches of a few to a few dozen queries. For each batch size, in interleaved
rounds on one index (unit vectors, ``--rows`` x ``--dim``), this times:

- ``condsearch``: ``condsearch.base.faiss_indexes.search``, the path every query, the server's and
  the CLI's, takes (one NumPy product over FAISS's stored rows, then FAISS's heaps);
- ``faiss``: the index's own ``search`` (a scan per query below 8 queries, else FAISS's product on the
  BLAS bundled with its wheel).

Each row gives the median milliseconds per search, the ratio, and whether both found the same top-10
(up to float32 ties). The run records which BLAS libraries and kernels are loaded (threadpoolctl):
FAISS's wheel may carry an OpenBLAS older than the CPU, which then runs generic kernels.

    python -m benchmarks.systems.flat_search --rows 100000 --dim 384 --batches 1,8,14,32,64 \\
        --json-out benchmarks/systems/results/flat_search_amx.json
    python -m benchmarks.systems.flat_search --smoke
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks._lib.common import log, rankings_agree, run_info, write_outputs


def blas_libraries() -> list[dict[str, object]]:
    """Return the BLAS libraries loaded now: which library, version, kernels and threads."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("internal_api", "version", "architecture", "num_threads", "threading_layer", "filepath")
    return [{k: lib.get(k) for k in keep} for lib in threadpool_info() if lib.get("user_api") == "blas"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--batches", default="1,8,14,32,64", help="batch sizes, comma-separated")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds per batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path)
    p.add_argument("--md-out", type=Path)
    p.add_argument("--smoke", action="store_true", help="2,000 x 32-d, two batch sizes, 3 rounds")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.dim, args.batches, args.rounds = 2000, 32, "1,16", 3

    from condsearch.base.faiss_indexes import build_index, search

    rng = np.random.default_rng(args.seed)
    corpus = rng.standard_normal((args.rows, args.dim)).astype(np.float32)
    corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
    index = build_index(corpus)
    results = []
    for batch in [int(b) for b in args.batches.split(",")]:
        picks = rng.choice(args.rows, size=batch, replace=False)
        queries = corpus[picks] + 0.05 * rng.standard_normal((batch, args.dim)).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        times: dict[str, list[float]] = {"condsearch": [], "faiss": []}
        ours = search(index, queries, args.k)
        d, i = index.search(queries, args.k)
        agree = bool(rankings_agree(ours.scores, ours.ids, d, i, tol=1e-5).all())
        for _ in range(args.rounds):
            for name in times:
                start = time.perf_counter()
                if name == "condsearch":
                    search(index, queries, args.k)
                else:
                    index.search(queries, args.k)
                times[name].append(time.perf_counter() - start)
        ms = {name: statistics.median(v) * 1000 for name, v in times.items()}
        row = {
            "batch": batch,
            "condsearch_ms": round(ms["condsearch"], 2),
            "faiss_ms": round(ms["faiss"], 2),
            "faiss_over_condsearch": round(ms["faiss"] / ms["condsearch"], 2),
            "same_top_k": agree,
        }
        log("flat_search", str(row))
        results.append(row)
    table = "\n".join(
        ["| batch | condsearch ms | FAISS ms | FAISS / condsearch | same top-k |", "|---:|---:|---:|---:|---|"]
        + [
            f"| {r['batch']} | {r['condsearch_ms']} | {r['faiss_ms']} | {r['faiss_over_condsearch']} "
            f"| {r['same_top_k']} |"
            for r in results
        ]
    )
    record = {
        "benchmark": "flat_search",
        "run": run_info(),
        "blas": blas_libraries(),
        "rows": args.rows,
        "dim": args.dim,
        "k": args.k,
        "rounds": args.rounds,
        "results": results,
    }
    write_outputs(record, table, args.json_out, args.md_out)
    return 0 if all(r["same_top_k"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
