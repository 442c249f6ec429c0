"""Exact search at 1M rows on the GPU against the CPU, in one run (issue 38's GPU checks).

For each dimension (--dims) a flat inner-product index of --rows random unit vectors is built
with condsearch's ``build_index`` and searched twice: as built, on the CPU (FAISS, every core
unless --threads), and moved to the GPU by ``to_search_device`` (FAISS's GPU index where that
build is installed, else ``TorchFlatIndex``: exact search in torch on the card; the JSON names
which). Batch-1 latency is the median over --queries single searches; batch latency the
median over --repeats searches of --batch queries, given per query. Times include moving
queries to the card and results back. The two paths' top-10 are compared up to ties.

    python -m benchmarks.systems.gpu_search --rows 1000000 --dims 256,384 \\
        --json-out benchmarks/systems/results/gpu_search.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import faiss
import numpy as np

from benchmarks._lib.common import exit_code, log, rankings_agree, run_info, write_outputs
from condsearch.build.faiss_indexes import (
    TorchFlatIndex,
    build_index,
    normalize,
    search,
    search_threads,
    to_search_device,
)

K = 10


def _median_ms(fn, n: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _latencies(index: object, q: np.ndarray, queries: int, batch: int, repeats: int) -> tuple[float, float]:
    """Return (batch-1 p50 ms over the first ``queries`` rows of q, median ms a query at ``batch``)."""
    search(index, q[:batch], K)  # type: ignore[arg-type]  # warm-up
    rows = iter(range(10**9))
    one = _median_ms(lambda: search(index, q[next(rows) % queries][None], K), queries)  # type: ignore[arg-type]
    many = _median_ms(lambda: search(index, q[:batch], K), repeats) / batch  # type: ignore[arg-type]
    return round(one, 3), round(many, 4)


def measure(rows: int, dim: int, queries: int, batch: int, repeats: int, seed: int) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    corpus = normalize(rng.standard_normal((rows, dim), dtype=np.float32))
    q = normalize(rng.standard_normal((max(queries, batch), dim), dtype=np.float32))
    start = time.perf_counter()
    cpu = build_index(corpus, "Flat")
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    gpu = to_search_device(cpu)
    move_s = time.perf_counter() - start
    kind = "torch flat (TorchFlatIndex)" if isinstance(gpu, TorchFlatIndex) else type(gpu).__name__
    out: dict[str, object] = {
        "rows": rows,
        "dim": dim,
        "gpu_index": kind,
        "build_s": round(build_s, 2),
        "to_gpu_s": round(move_s, 2),
    }
    for name, index in (("cpu", cpu), ("gpu", gpu)):
        one, many = _latencies(index, q, queries, batch, repeats)
        out[f"{name}_batch1_p50_ms"], out[f"{name}_batch{batch}_per_query_ms"] = one, many
    a, b = search(cpu, q[:batch], K), search(gpu, q[:batch], K)
    out["top10_agree"] = float(np.mean(rankings_agree(a.scores, a.ids, b.scores, b.ids, tol=1e-4)))
    out["batch1_speedup"] = round(out["cpu_batch1_p50_ms"] / out["gpu_batch1_p50_ms"], 1)  # type: ignore[operator]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dims", default="256,384")
    p.add_argument("--queries", type=int, default=100, help="batch-1 searches timed per path")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="FAISS threads on the CPU (default every core)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path)
    p.add_argument("--md-out", type=Path)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_search: needs a CUDA device", file=sys.stderr)
        return 2
    threads = search_threads(args.threads)
    cells = []
    for dim in (int(d) for d in args.dims.split(",")):
        cell = measure(args.rows, dim, args.queries, args.batch, args.repeats, args.seed)
        log("gpu_search", str(cell))
        cells.append(cell)
    b = args.batch
    table = (
        f"| rows × dim | GPU path | GPU batch-1 p50 ms | CPU batch-1 p50 ms ({threads} threads) | × | "
        f"GPU ms/query at {b} | CPU ms/query at {b} | top-10 agree |\n|---|---|---:|---:|---:|---:|---:|---:|\n"
    )
    for c in cells:
        table += (
            f"| {c['rows']:,} × {c['dim']} | {c['gpu_index']} | {c['gpu_batch1_p50_ms']} | {c['cpu_batch1_p50_ms']} | "
            f"{c['batch1_speedup']} | {c[f'gpu_batch{b}_per_query_ms']} | {c[f'cpu_batch{b}_per_query_ms']} | "
            f"{c['top10_agree']:.3f} |\n"
        )
    result = {"cells": cells, "cpu_threads": threads, "faiss": faiss.__version__, "run": run_info("cuda")}
    write_outputs(result, table, args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, "gpu_search"))
