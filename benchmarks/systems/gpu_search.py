"""Exact and IVF search on the GPU against the CPU, in one run (issues 38 and 61's GPU checks).

``--rows`` takes one count or several (``1000000,10000000``). For each (rows, dim), clustered unit
vectors (``--clusters`` centres with noise: random vectors would leave IVF nothing to find) are
searched by every path this machine has:

- ``cpu flat``: condsearch's ``build_index(..., "Flat")``, FAISS on the CPU (every core unless
  --threads); the reference every other path's top-10 is compared with;
- ``gpu flat``: that index moved by ``to_search_device``, the store's own path (FAISS's
  ``GpuIndexFlatIP`` where the GPU build is installed, else ``TorchFlatIndex``);
- ``torch flat``: ``TorchFlatIndex``, exact search in torch on the card (when FAISS's GPU build is
  there, beside it);
- ``gpu IVF`` and ``cpu IVF`` (``--nlist``, 0 to skip): ``IVF{nlist},Flat`` trained and filled
  on the card (FAISS's ``GpuIndexIVFFlat``), copied to the CPU, and moved back by
  ``to_search_device`` as the store would; both searched at ``--nprobe``.

Batch-1 latency is the median over --queries single searches; batch latency the median over
--repeats searches of --batch queries, given per query. Times include moving queries to the card
and results back. ``recall@10`` is the share of the exact top-10 (cpu flat) each path finds;
``top10_agree`` compares exact paths' rankings up to ties.

    python -m benchmarks.systems.gpu_search --rows 1000000,10000000 --dims 256 \\
        --json-out benchmarks/systems/results/gpu_search.json

``--smoke`` runs every path on 2,000 x 32-d vectors (16 clusters, IVF16 at nprobe 4) in seconds, and
runs without a GPU: there ``gpu flat`` is what ``to_search_device`` returns on a CPU-only machine (the
CPU index itself), ``torch flat`` and ``gpu IVF`` are left out, and ``cpu IVF`` is trained on the CPU
with ``build_index``. The full mode needs a CUDA device.
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
from condsearch.base.faiss_indexes import (
    TorchFlatIndex,
    build_index,
    gpu_available,
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


def clustered(rows: int, dim: int, clusters: int, n_queries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (corpus, queries): unit vectors around ``clusters`` random centres; queries near corpus rows.

    Made with torch on the card when there is one (10M x 256 in seconds), else with numpy.
    """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=device).manual_seed(seed)
    centres = torch.randn(max(1, clusters), dim, generator=g, device=device)
    corpus = np.empty((rows, dim), dtype=np.float32)
    step = 1 << 20
    for start in range(0, rows, step):
        n = min(step, rows - start)
        which = torch.randint(0, centres.shape[0], (n,), generator=g, device=device)
        block = centres[which] + 0.6 * torch.randn(n, dim, generator=g, device=device)
        corpus[start : start + n] = block.cpu().numpy()
    picks = torch.randint(0, rows, (n_queries,), generator=g, device="cpu" if device == "cpu" else device).cpu().numpy()
    noise = torch.randn(n_queries, dim, generator=g, device=device).cpu().numpy()
    queries = normalize(normalize(corpus[picks]) + 0.05 * noise)
    return normalize(corpus), queries


def _recall(exact_ids: np.ndarray, ids: np.ndarray) -> float:
    hits = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(exact_ids, ids, strict=True)]
    return round(float(np.mean(hits)) / exact_ids.shape[1], 4)


def _path_name(index: object) -> str:
    return "torch flat (TorchFlatIndex)" if isinstance(index, TorchFlatIndex) else type(index).__name__


def measure_paths(
    rows: int,
    dim: int,
    *,
    clusters: int,
    nlist: int,
    nprobe: int,
    queries: int,
    batch: int,
    repeats: int,
    seed: int,
    cpu_ivf_without_gpu: bool = False,
) -> list[dict[str, object]]:
    """Time every search path on one clustered corpus; recall@10 of each against the CPU's exact search."""
    import torch

    corpus, q = clustered(rows, dim, clusters, max(queries, batch), seed)
    paths: list[tuple[str, object, float]] = []
    start = time.perf_counter()
    cpu = build_index(corpus, "Flat")
    paths.append(("cpu flat", cpu, time.perf_counter() - start))
    start = time.perf_counter()
    moved = to_search_device(cpu)
    paths.append(("gpu flat", moved, time.perf_counter() - start))
    if gpu_available() and torch.cuda.is_available():
        start = time.perf_counter()
        paths.append(("torch flat", TorchFlatIndex(corpus, "cuda"), time.perf_counter() - start))
    if nlist and cpu_ivf_without_gpu and not gpu_available():  # the smoke on a CPU: an IVF trained on the CPU
        start = time.perf_counter()
        cpu_ivf = build_index(corpus, f"IVF{nlist},Flat", search_params=f"nprobe={nprobe}")
        paths.append(("cpu IVF", cpu_ivf, time.perf_counter() - start))
    if nlist and gpu_available():
        res = faiss.StandardGpuResources()
        start = time.perf_counter()
        trained = faiss.GpuIndexIVFFlat(res, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        sample = corpus[np.random.default_rng(seed).choice(rows, min(rows, 64 * nlist), replace=False)]
        trained.train(sample)
        trained.add(corpus)
        cpu_ivf = faiss.index_gpu_to_cpu(trained)
        build_s = time.perf_counter() - start
        del trained
        cpu_ivf.nprobe = nprobe
        start = time.perf_counter()
        gpu_ivf = to_search_device(cpu_ivf)  # the store's path: a CPU index moved to the card
        faiss.GpuParameterSpace().set_index_parameter(gpu_ivf, "nprobe", nprobe)
        paths.append(("gpu IVF", gpu_ivf, time.perf_counter() - start + build_s))
        paths.append(("cpu IVF", cpu_ivf, build_s))
    exact = search(cpu, q[:batch], K)
    cells: list[dict[str, object]] = []
    for name, index, setup_s in paths:
        one, many = _latencies(index, q, queries, batch, repeats)
        found = search(index, q[:batch], K)  # type: ignore[arg-type]
        cell: dict[str, object] = {
            "rows": rows,
            "dim": dim,
            "path": name,
            "index": _path_name(index),
            "setup_s": round(setup_s, 2),
            "batch1_p50_ms": one,
            f"batch{batch}_per_query_ms": many,
            "recall@10": _recall(exact.ids, found.ids),
            "top10_agree": float(np.mean(rankings_agree(exact.scores, exact.ids, found.scores, found.ids, tol=1e-4))),
        }
        if "IVF" in name:
            cell["nlist"], cell["nprobe"] = nlist, nprobe
        log("gpu_search", str(cell))
        cells.append(cell)
    base = next(c for c in cells if c["path"] == "cpu flat")["batch1_p50_ms"]
    for c in cells:
        c["batch1_speedup_vs_cpu_flat"] = round(float(base) / float(c["batch1_p50_ms"]), 1)  # type: ignore[arg-type]
    return cells


def measure(rows: int, dim: int, queries: int, batch: int, repeats: int, seed: int) -> dict[str, object]:
    """Exact search on the CPU against ``to_search_device``'s copy on random unit vectors (the first checks)."""
    rng = np.random.default_rng(seed)
    corpus = normalize(rng.standard_normal((rows, dim), dtype=np.float32))
    q = normalize(rng.standard_normal((max(queries, batch), dim), dtype=np.float32))
    cpu = build_index(corpus, "Flat")
    gpu = to_search_device(cpu)
    out: dict[str, object] = {"rows": rows, "dim": dim, "gpu_index": _path_name(gpu)}
    for name, index in (("cpu", cpu), ("gpu", gpu)):
        one, many = _latencies(index, q, queries, batch, repeats)
        out[f"{name}_batch1_p50_ms"], out[f"{name}_batch{batch}_per_query_ms"] = one, many
    a, b = search(cpu, q[:batch], K), search(gpu, q[:batch], K)
    out["top10_agree"] = float(np.mean(rankings_agree(a.scores, a.ids, b.scores, b.ids, tol=1e-4)))
    out["batch1_speedup"] = round(out["cpu_batch1_p50_ms"] / out["gpu_batch1_p50_ms"], 1)  # type: ignore[operator]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1000000", help="one row count or several, comma-separated")
    p.add_argument("--dims", default="256")
    p.add_argument("--clusters", type=int, default=20000, help="centres of the synthetic corpus")
    p.add_argument("--nlist", type=int, default=4096, help="IVF lists (0: no IVF paths)")
    p.add_argument("--nprobe", type=int, default=32)
    p.add_argument("--queries", type=int, default=50, help="batch-1 searches timed per path")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="FAISS threads on the CPU (default every core)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path)
    p.add_argument("--md-out", type=Path)
    p.add_argument(
        "--smoke", action="store_true", help="2,000 x 32-d rows, seconds; runs on a CPU (its own paths: see above)"
    )
    args = p.parse_args(argv)
    import torch

    if args.smoke:
        args.rows, args.dims, args.clusters, args.nlist, args.nprobe = "2000", "32", 16, 16, 4
        args.queries, args.batch, args.repeats = 5, 8, 1
    elif not torch.cuda.is_available():
        print("gpu_search: needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    threads = search_threads(args.threads)
    cells = []
    for rows in (int(r) for r in args.rows.split(",")):
        for dim in (int(d) for d in args.dims.split(",")):
            cells += measure_paths(
                rows, dim, clusters=args.clusters, nlist=args.nlist, nprobe=args.nprobe, queries=args.queries,
                batch=args.batch, repeats=args.repeats, seed=args.seed, cpu_ivf_without_gpu=args.smoke,
            )  # fmt: skip
    b = args.batch
    table = (
        f"| rows × dim | path | index | batch-1 p50 ms | × cpu flat | ms a query at {b} | recall@10 | setup s |\n"
        "|---|---|---|---:|---:|---:|---:|---:|\n"
    )
    for c in cells:
        table += (
            f"| {c['rows']:,} × {c['dim']} | {c['path']} | {c['index']} | {c['batch1_p50_ms']} | "
            f"{c['batch1_speedup_vs_cpu_flat']} | {c[f'batch{b}_per_query_ms']} | {c['recall@10']:.3f} | "
            f"{c['setup_s']} |\n"
        )
    result = {
        "cells": cells,
        "cpu_threads": threads,
        "faiss": faiss.__version__,
        "faiss_gpu": gpu_available(),
        "smoke": args.smoke,
        "run": run_info("cuda" if torch.cuda.is_available() else "cpu"),
    }
    write_outputs(result, table, args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, "gpu_search"))
