#!/usr/bin/env python3
"""Approximate indexes against exact search: recall@10, latency, build time and size.

For each corpus size (--rows) and vector kind (--vectors: random unit vectors, or real CASE
vectors of the default model and head over real texts), builds Flat, HNSW, IVF-Flat and
IVF-PQ indexes with condsearch's own build_index (IVF/PQ trained on its seeded sample) and
searches them at several search parameters (efSearch, nprobe) set as condsearch sets them.
Recall@10 is measured for held-out queries (never corpus rows) against brute-force numpy
search; latency is the median of single-query searches (batch 1) and the time per query of
one batch of all queries. Optionally plots recall against batch-1 latency.

    python -m benchmarks.systems.ann --rows 100000,1000000 --vectors random \
        --json-out benchmarks/systems/results/ann_random.json --plot benchmarks/systems/results/ann_random.png

Real CASE vectors come from the texts of --texts files (WN18RR entity texts, C-STS sentences),
encoded once under --condition and cached in --cache; a size larger than the texts at hand is
skipped, and said so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import faiss
import numpy as np

from benchmarks._lib.common import REAL_TEXTS, log, read_texts, run_info, write_outputs  # noqa: E402
from condsearch.base.ann import IndexConfig, choose_index, ivf_nlist  # noqa: E402
from condsearch.base.faiss_indexes import build_index, normalize  # noqa: E402

EF_SEARCH = (16, 32, 64, 128, 256)
NPROBE = (1, 4, 16, 64)


def random_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    """Return n random unit vectors, generated in blocks to bound the temporaries."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):
        block = rng.standard_normal((min(100_000, n - start), dim), dtype=np.float32)
        out[start : start + len(block)] = normalize(block)
    return out


def case_vectors(texts: list[str], condition: str, cache: Path, model: str | None) -> np.ndarray:
    """Return the CASE vectors of texts under condition (default model and head), cached as .npy."""
    import hashlib

    key = hashlib.sha256(("\x00".join([condition, model or "", *texts])).encode()).hexdigest()[:16]
    path = cache / f"ann-case-{len(texts)}-{key}.npy"
    if path.is_file():
        return np.load(path, allow_pickle=False)
    from benchmarks._lib.common import quiet_transformers
    from condsearch.model.encoders.spec import EncoderSpec
    from condsearch.model.vectorizer import load_vectorizer

    quiet_transformers()
    vec = load_vectorizer(EncoderSpec(model))
    log("ann", f"encoding {len(texts)} texts under {condition!r} with {vec.encoder.model_id} ({vec.dim}-d)")
    out = vec.encode(texts, condition, batch_size=64, progress=True)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, out, allow_pickle=False)
    return out


def exact_top(corpus: np.ndarray, queries: np.ndarray, k: int, block: int = 64) -> np.ndarray:
    """Return the exact top-k row numbers per query, a block of queries at a time (bounded memory)."""
    out = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), block):
        sims = queries[start : start + block] @ corpus.T
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, top, axis=1), axis=1, kind="stable")
        out[start : start + block] = np.take_along_axis(top, order, axis=1)
    return out


def recall_at(got: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(np.mean([len(set(g[:k]) & set(t)) / k for g, t in zip(got, truth, strict=True)]))


def index_bytes(index: object) -> int:
    """Return the size of the index as FAISS writes it."""
    total = 0

    def count(chunk: bytes) -> int:
        nonlocal total
        total += len(chunk)
        return len(chunk)

    faiss.write_index(index, faiss.PyCallbackIOWriter(count))
    return total


KINDS = ("flat", "hnsw", "ivf", "ivfpq")


def factories(n: int, dim: int, pq_bits: int = 8, kinds: Sequence[str] = KINDS) -> list[tuple[str, list[str]]]:
    """Return (factory, search params to try) for Flat, HNSW, IVF-Flat and IVF-PQ at this size.

    IVF has as many lists as ``--index-factory auto`` would give; PQ takes one byte per 8 dimensions.
    """
    cfg = IndexConfig()
    nlist = ivf_nlist(n, cfg)
    code = next(m for m in (dim // 8, 32, 16, 8, 4) if m and dim % m == 0)
    pq = f"PQ{code}" + (f"x{pq_bits}" if pq_bits != 8 else "")
    probes = [p for p in NPROBE if p <= nlist]
    every = {
        "flat": ("Flat", [""]),
        "hnsw": (f"HNSW{cfg.hnsw_m}", [f"efSearch={e}" for e in EF_SEARCH]),
        "ivf": (f"IVF{nlist},Flat", [f"nprobe={p}" for p in probes]),
        "ivfpq": (f"IVF{nlist},{pq}", [f"nprobe={p}" for p in probes]),
    }
    return [every[kind] for kind in kinds]


def measure(
    corpus: np.ndarray,
    queries: np.ndarray,
    truth: np.ndarray,
    k: int,
    single: int,
    pq_bits: int,
    kinds: Sequence[str],
    rows: list[dict],
    save: Callable[[], None],
) -> None:
    """Build each index and search it at each parameter setting; append one row per setting, saving after each index."""
    from condsearch.base.ann import apply_search_params

    n, dim = corpus.shape
    for factory, settings in factories(n, dim, pq_bits, kinds):
        start = time.perf_counter()
        index = build_index(corpus, factory)
        build_s = time.perf_counter() - start
        size = index_bytes(index)
        log("ann", f"n={n} {factory}: built in {build_s:.1f}s, {size / 2**20:.0f} MiB")
        for params in settings:
            apply_search_params(index, params)
            index.search(queries[:8], k)  # warm-up
            times = []
            for q in queries[:single]:
                t = time.perf_counter()
                index.search(q[None, :], k)
                times.append(time.perf_counter() - t)
            t = time.perf_counter()
            _, ids = index.search(queries, k)
            batch_s = time.perf_counter() - t
            row = {
                "rows": n,
                "factory": factory,
                "search_params": params,
                "recall_at_10": round(recall_at(ids, truth), 4),
                "p50_ms_batch1": round(1000 * statistics.median(times), 3),
                "ms_per_query_batch": round(1000 * batch_s / len(queries), 4),
                "build_s": round(build_s, 2),
                "index_mib": round(size / 2**20, 1),
            }
            log("ann", f"  {params or '(exact)'}: recall@10 {row['recall_at_10']:.3f}, p50 {row['p50_ms_batch1']} ms")
            rows.append(row)
        del index
        save()


def table(result: dict) -> str:
    lines = [
        f"ANN indexes, {result['vectors']} vectors, {result['dim']}-d, {result['queries']} held-out queries, k=10",
        "",
        "| rows | index | search params | recall@10 | p50 ms (batch 1) | ms/query (batch) | build s | MiB |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["results"]:
        lines.append(
            f"| {r['rows']:,} | {r['factory']} | {r['search_params'] or '-'} | {r['recall_at_10']:.3f} | "
            f"{r['p50_ms_batch1']:.3f} | {r['ms_per_query_batch']:.4f} | {r['build_s']:.1f} | {r['index_mib']:.1f} |"
        )
    for n, choice in result["auto"].items():
        lines.append(f"\n--index-factory auto at {n} rows (4G): {choice}")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["rows"] for r in result["results"]})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        for factory in dict.fromkeys(r["factory"] for r in result["results"] if r["rows"] == n):
            pts = [r for r in result["results"] if r["rows"] == n and r["factory"] == factory]
            ax.plot([p["p50_ms_batch1"] for p in pts], [p["recall_at_10"] for p in pts], "o-", label=factory)
        ax.set_xscale("log")
        ax.set_xlabel("p50 latency, batch 1 (ms)")
        ax.set_ylabel("recall@10 vs exact")
        ax.set_title(f"{n:,} {result['vectors']} vectors, {result['dim']}-d")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="100000,1000000", help="comma-separated corpus sizes")
    p.add_argument("--vectors", choices=["random", "case"], default="random")
    p.add_argument("--dim", type=int, default=256, help="random vectors' dimension (the default head's)")
    p.add_argument("--queries", type=int, default=1000, help="held-out queries")
    p.add_argument("--single", type=int, default=200, help="queries timed one at a time (batch 1)")
    p.add_argument("--kinds", default=",".join(KINDS), help="index kinds, in the order built: " + ",".join(KINDS))
    p.add_argument("--case-vectors", type=Path, default=None, help="--vectors case: an (n, d) .npy of CASE vectors")
    p.add_argument("--case-queries", type=Path, default=None, help="--vectors case: their held-out queries' .npy")
    p.add_argument("--texts", type=Path, nargs="*", default=REAL_TEXTS, help="--vectors case: text sources")
    p.add_argument("--condition", default="the topic", help="--vectors case: condition")
    p.add_argument("--model", default=None, help="--vectors case: model [default: the default model and head]")
    p.add_argument("--cache", type=Path, default=Path("build/bench-cache"), help="--vectors case: vectors cache")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None, help="PNG of recall against batch-1 latency")
    p.add_argument("--smoke", action="store_true", help="2,000 random 32-d rows, 50 queries, 4-bit PQ")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("ann.py: --plot needs matplotlib (pip install 'condsearch[plot]')", file=sys.stderr)
            return 2
    if args.smoke:
        args.rows, args.vectors, args.dim, args.queries, args.single = "2000", "random", 32, 50, 20
    sizes = [int(s) for s in args.rows.split(",") if s]
    k = 10
    results, skipped = [], []
    info = run_info("cpu")
    kinds = [k for k in args.kinds.split(",") if k]
    if any(k not in KINDS for k in kinds):
        print(f"ann.py: --kinds takes {', '.join(KINDS)}", file=sys.stderr)
        return 2
    if args.vectors == "case" and args.case_vectors is not None:
        pool = np.load(args.case_vectors, allow_pickle=False)
        queries = np.load(args.case_queries, allow_pickle=False)
        dim = pool.shape[1]
    elif args.vectors == "case":
        texts = read_texts(args.texts)
        usable = len(texts) - args.queries
        all_vecs = case_vectors(texts, args.condition, args.cache, args.model)
        queries, pool = all_vecs[usable:], all_vecs[:usable]  # the last texts are held out as queries
        dim = pool.shape[1]
    else:
        dim = args.dim
        queries = random_vectors(args.queries, dim, args.seed + 1)
        pool = None

    def assemble(complete: bool) -> dict:
        return {
            "vectors": args.vectors,
            "dim": dim,
            "queries": int(len(queries)),
            "rows": sizes,
            "skipped_rows": skipped,
            "complete": complete,
            "results": results,
            "auto": {str(n): vars(choose_index(n, dim, 4 << 30)) for n in sizes},
            "config": {
                "case_vectors": str(args.case_vectors) if args.case_vectors else None,
                "condition": args.condition if args.vectors == "case" and not args.case_vectors else None,
                "single_queries_timed": args.single,
                "kinds": kinds,
                "smoke": args.smoke,
                "faiss_threads": faiss.omp_get_max_threads(),
            },
            "run": {**info, "load_average_after": [round(x, 2) for x in os.getloadavg()]},
        }

    def save() -> None:
        if args.json_out:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            args.json_out.write_text(json.dumps(assemble(False), indent=2) + "\n")

    for n in sizes:
        if pool is not None and n > len(pool):
            log("ann", f"skipping {n} rows: only {len(pool)} real vectors at hand (+{len(queries)} held out)")
            skipped.append(n)
            continue
        corpus = pool[:n] if pool is not None else random_vectors(n, dim, args.seed)
        start = time.perf_counter()
        truth = exact_top(corpus, queries, k)
        log("ann", f"n={n}: exact top-{k} of {len(queries)} queries in {time.perf_counter() - start:.1f}s")
        measure(corpus, queries, truth, k, args.single, 4 if args.smoke else 8, kinds, results, save)
        del corpus
    result = assemble(True)
    write_outputs(result, table(result), args.json_out, args.md_out)
    if args.plot is not None:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
