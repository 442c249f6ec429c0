#!/usr/bin/env python3
"""Latency against dimension: what a smaller CASE head buys and costs.

For head dimensions (--dims, default 32,64,128,256,384) on the default model: dev Spearman
of a head trained from cached encoder outputs, encode throughput (pairs/s, CASE encoder +
head) and, for those dimensions and synthetic ones up to 4096-d, FAISS flat index build
time, search latency p50/p95 at batch 1 and batch 256 over random unit vectors for corpus
sizes up to --max-n, and bytes per vector. Also: memory bandwidth of a plain numpy copy and
the fraction of it that exact search reaches (batch 1) — only for indexes larger than the CPU's
last-level cache, since a smaller one is scanned from cache and no memory bound applies — the
CSR cost of a new condition (benchmarks/paper/csr_speedup.py's measurement) and
sentence-transformers' encode() on the same texts as a peer. Every ratio is measured within one
run. Sizes whose index would exceed --max-index-gib are skipped (a flat index holds
n × dim × 4 bytes, built from a copy of the same size).

    python -m benchmarks.paper.latency --json-out benchmarks/paper/results/latency.json \
        --plot benchmarks/paper/results/latency.png
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._lib.common import (  # noqa: E402
    last_level_cache_bytes,
    log,
    quiet_transformers,
    run_info,
    synthetic_csts,
    write_csts_csv,
    write_outputs,
)

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "csts-reannotated"


def _log(msg: str) -> None:
    log("latency", msg)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", type=Path, default=None, help=f"C-STS train CSV (default {DATA}/train.csv if present)")
    p.add_argument("--dev", type=Path, default=None, help="C-STS dev CSV for the Spearman column")
    p.add_argument("--model", default=None, help="model id or folder (default all-MiniLM-L6-v2)")
    p.add_argument("--dims", default="32,64,128,256,384", help="head dimensions (trained here)")
    p.add_argument("--synthetic-dims", default="512,1024,2048,4096", help="index-only dimensions (random vectors)")
    p.add_argument("--sizes", default="10000,100000,1000000", help="corpus sizes for index build and search")
    p.add_argument("--max-n", type=int, default=1_000_000, help="largest corpus size")
    p.add_argument("--max-index-gib", type=float, default=2.0, help="skip (dim, n) whose flat index is larger")
    p.add_argument("--epochs", type=int, default=30, help="head training epochs (best on dev)")
    p.add_argument("--encode-n", type=int, default=1000, help="sentence-condition pairs for encode throughput")
    p.add_argument("--queries", type=int, default=100, help="batch-1 searches timed per cell (fewer past 10 s)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5, help="timed repeats of batched search and of encoding")
    p.add_argument("--csr-n", type=int, default=1000, help="sentences for the CSR new-condition measurement")
    p.add_argument("--no-peer", action="store_true", help="skip sentence-transformers' encode()")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None, help="PNG of Spearman and latency against dimension")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and data, seconds")
    args = p.parse_args(argv)
    if args.plot is not None and not has_matplotlib():
        # checked before hours of measuring: a plot that was asked for and not made is a failure
        p.exit(2, "latency.py: --plot needs matplotlib (pip install 'condsearch[plot]')\n")
    if args.train is None and not args.smoke and (DATA / "train.csv").is_file():
        args.train, args.dev = DATA / "train.csv", DATA / "dev.csv"
    if not args.smoke and (args.train is None or args.dev is None):
        p.error("--train and --dev are required when ../shared/data is absent (or use --smoke)")
    if args.smoke:
        args.sizes, args.max_n, args.synthetic_dims = "1000,4000", 4000, "512"
        args.epochs, args.encode_n, args.queries, args.batch, args.repeats, args.csr_n = 2, 32, 5, 16, 1, 64
    return args


def random_unit_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Return n random unit vectors (n, dim) float32, normalised in place chunk by chunk."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    step = max(1, (1 << 24) // dim)
    for start in range(0, n, step):
        block = rng.standard_normal((min(step, n - start), dim), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        out[start : start + len(block)] = block
    return out


def percentiles(seconds: list[float]) -> dict[str, float]:
    """Return p50 and p95 in milliseconds."""
    ms = np.asarray(seconds) * 1e3
    return {"p50": round(float(np.percentile(ms, 50)), 4), "p95": round(float(np.percentile(ms, 95)), 4)}


def copy_bandwidth(n_bytes: int = 1 << 28, repeats: int = 5) -> float:
    """Return bytes moved per second (read + write) by a plain numpy array copy, best of repeats."""
    src = np.ones(n_bytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return 2 * n_bytes / best


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure_index(dim: int, n: int, args: argparse.Namespace) -> dict[str, object]:
    """Build a flat index over n random unit vectors and time searches at batch 1 and --batch."""
    from condsearch.base.faiss_indexes import build_index, search, to_search_device

    vectors = random_unit_vectors(n, dim, seed=dim)
    queries = random_unit_vectors(max(args.queries, args.batch), dim, seed=dim + 1)
    start = time.perf_counter()
    index = build_index(vectors, "Flat")
    build_s = time.perf_counter() - start
    del vectors
    bytes_per_vector = index.sa_code_size()  # stored bytes per vector (header and ids aside)
    device_index = to_search_device(index)
    search(device_index, queries[:1], 10)  # warm-up
    single: list[float] = []
    budget = time.perf_counter() + 10.0
    for i in range(args.queries):
        single.append(_timed(lambda i=i: search(device_index, queries[i : i + 1], 10)))
        if time.perf_counter() > budget and len(single) >= 5:
            break
    batched = [_timed(lambda: search(device_index, queries[: args.batch], 10)) for _ in range(args.repeats)]
    scanned_per_s = n * dim * 4 / statistics.median(single)
    return {
        "dim": dim,
        "n": n,
        "build_seconds": round(build_s, 4),
        "bytes_per_vector": bytes_per_vector,
        "search_ms": {"batch1": percentiles(single), f"batch{args.batch}": percentiles(batched)},
        "search_ms_per_query_batched": round(1e3 * statistics.median(batched) / args.batch, 4),
        "n_timed": {"batch1": len(single), f"batch{args.batch}": len(batched)},
        "scan_gb_per_s_batch1": round(scanned_per_s / 1e9, 2),
        "search_device": type(device_index).__name__,
    }


def head_spearman(args: argparse.Namespace, dims: list[int]) -> tuple[dict[int, dict], dict, object]:
    """Train one head per dimension on cached CASE features; return dev scores and the heads."""
    from condsearch.base.output_cache import EmbeddingCache, default_cache_dir
    from condsearch.corpus.csts import read_csts
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec
    from condsearch.train.head import HeadTrainConfig, case_features, evaluate_head, fit_head

    if args.train is not None:
        train, dev = read_csts(args.train), read_csts(args.dev)
    else:
        train, dev = synthetic_csts(48, seed=0), synthetic_csts(32, seed=1)
    encoder = load_encoder(EncoderSpec(args.model, profile="none"))
    cache = None if args.smoke else EmbeddingCache(default_cache_dir() / "features")
    _log(f"CASE features of train ({len(train)}) and dev ({len(dev)}), through the encoder-output cache")
    train_f = case_features(encoder, train, cache=cache)
    dev_f = case_features(encoder, dev, cache=cache)
    out: dict[int, dict] = {}
    heads = {}
    for dim in dims:
        start = time.perf_counter()
        head, history = fit_head(train_f, HeadTrainConfig(dim=dim, epochs=args.epochs), dev=dev_f)
        out[dim] = {
            "dev": evaluate_head(head, dev_f),
            "best_epoch": int(max(history, key=lambda r: r["dev_spearman"])["epoch"]),
            "train_seconds": round(time.perf_counter() - start, 2),
        }
        heads[dim] = head
        _log(f"{dim}-d head: dev Spearman {out[dim]['dev']['spearman']:.2f}")
    native = evaluate_head(None, dev_f)
    return out, {"dev": native, "dim": encoder.dim}, (encoder, heads)


def encode_throughput(encoder, heads: dict, texts: list[str], args: argparse.Namespace) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Time CASE encoding of texts under one condition, the head projection per dim, and the peer."""
    from condsearch.base.faiss_indexes import normalize
    from condsearch.base.model_sources import resolve_model

    condition = "the color of the clothing"
    encoder.encode(texts[:8], condition)  # warm-up
    case_s, plain_s, peer_s = [], [], []
    peer = None
    if not args.no_peer:
        from sentence_transformers import SentenceTransformer

        peer = SentenceTransformer(resolve_model(args.model).location, device=str(getattr(encoder, "device", "cpu")))
        peer.encode(texts[:8], batch_size=64)
    for _ in range(max(1, args.repeats)):  # interleaved, so that load changes hit all alike
        case_s.append(_timed(lambda: encoder.encode(texts, condition, batch_size=64)))
        plain_s.append(_timed(lambda: encoder.encode_pairs([(t, None) for t in texts], batch_size=64)))
        if peer is not None:
            peer_s.append(_timed(lambda: peer.encode(texts, batch_size=64)))
    raw = encoder.encode(texts, condition)
    project_s = {}
    for dim, head in heads.items():
        project_s[dim] = min(_timed(lambda head=head: normalize(head.project(raw))) for _ in range(3))
    n, case_med = len(texts), statistics.median(case_s)
    out: dict[str, object] = {
        "n_pairs": n,
        "case_pairs_per_s": round(n / case_med, 1),
        "plain_texts_per_s": round(n / statistics.median(plain_s), 1),
        "pairs_per_s_by_dim": {str(d): round(n / (case_med + s), 1) for d, s in project_s.items()},
        "head_project_ms_by_dim": {str(d): round(1e3 * s, 3) for d, s in project_s.items()},
        "repeats": len(case_s),
    }
    if peer_s:
        peer_rate = n / statistics.median(peer_s)
        out["peer"] = {
            "name": "sentence-transformers SentenceTransformer.encode (same folder, batch 64)",
            "texts_per_s": round(peer_rate, 1),
            "plain_vs_peer": round(float(out["plain_texts_per_s"]) / peer_rate, 3),  # type: ignore[arg-type]
            "case_pairs_vs_peer_texts": round(float(out["case_pairs_per_s"]) / peer_rate, 3),  # type: ignore[arg-type]
        }
    return out


def csr_speedup(args: argparse.Namespace, csv: Path) -> dict[str, object]:
    """Run benchmarks/paper/csr_speedup.py's measurement with --csr-n sentences."""
    from benchmarks.paper.csr_speedup import measure

    ns = argparse.Namespace(
        csv=csv, n=args.csr_n, model=args.model, router="auto", batch_size=64, repeats=max(1, args.repeats // 2),
        cache_dir=None, smoke=False, variant=None, k=None,
    )  # fmt: skip
    return measure(ns)


def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    import torch

    torch.manual_seed(0)
    head_dims, synth_dims = _ints(args.dims), _ints(args.synthetic_dims)
    sizes = [n for n in _ints(args.sizes) if n <= args.max_n]
    heads, native, (encoder, head_objs) = head_spearman(args, head_dims)
    from benchmarks.systems.index_throughput import distinct_sentences

    csv = args.train or write_csts_csv(synthetic_csts(64), tmp / "smoke.csv")
    texts = distinct_sentences(csv, args.encode_n)
    _log(f"encode throughput: {len(texts)} pairs, {args.repeats} repeats")
    encode = encode_throughput(encoder, head_objs, texts, args)
    bandwidth = copy_bandwidth(1 << (24 if args.smoke else 28))
    _log(f"numpy copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write)")
    llc = last_level_cache_bytes()
    rows: list[dict[str, object]] = []
    cap = args.max_index_gib * 2**30
    skipped = []
    for dim in sorted(set(head_dims) | set(synth_dims)):
        for n in sizes:
            if n * dim * 4 > cap:
                skipped.append({"dim": dim, "n": n, "index_gib": round(n * dim * 4 / 2**30, 2)})
                continue
            _log(f"index dim {dim}, n {n}")
            row = measure_index(dim, n, args)
            row["source"] = "head" if dim in heads else "synthetic"
            if dim in heads:
                row["dev_spearman"] = round(heads[dim]["dev"]["spearman"], 2)
                row["encode_pairs_per_s"] = encode["pairs_per_s_by_dim"][str(dim)]  # type: ignore[index]
            scan = float(row.pop("scan_gb_per_s_batch1")) * 1e9
            # an index that fits in the last-level cache is not read from memory: no fraction for it
            row["bandwidth_fraction"] = round(scan / bandwidth, 3) if llc and n * dim * 4 > llc else None
            rows.append(row)
    _log(f"CSR new-condition cost over {args.csr_n} sentences")
    csr = csr_speedup(args, csv)
    native_dim = max(
        (r for r in rows if r["source"] == "head" and r["bandwidth_fraction"] is not None),
        key=lambda r: (r["n"], r["dim"]),
        default=None,
    )
    return {
        "rows": rows,
        "heads": {str(d): v for d, v in heads.items()},
        "native_no_head": native,
        "encode": encode,
        "memory_bandwidth_gb_per_s": round(bandwidth / 1e9, 2),
        "search_bandwidth_fraction": native_dim["bandwidth_fraction"] if native_dim else None,
        "search_bandwidth_fraction_at": {"dim": native_dim["dim"], "n": native_dim["n"]} if native_dim else None,
        "last_level_cache_bytes": llc,
        "csr_new_condition_speedup": csr["csr_new_condition_speedup"],
        "csr": csr,
        "skipped": skipped,
        "config": {
            "model": encoder.model_id,
            "head_dims": head_dims,
            "synthetic_dims": synth_dims,
            "sizes": sizes,
            "max_index_gib": args.max_index_gib,
            "index": "FAISS Flat, inner product, k=10",
            "epochs": args.epochs,
            "files": {"train": str(args.train), "dev": str(args.dev)} if args.train else "synthetic",
            "smoke": args.smoke,
            **run_info(str(getattr(encoder, "device", "cpu"))),
        },
    }


def _fraction(value: object) -> str:
    """A bandwidth fraction, or why there is none (the index fits in the last-level cache)."""
    return f"{value:.2f}" if isinstance(value, float) else "in cache"


def markdown(result: dict[str, object]) -> str:
    lines = [
        "| dim | n | dev Spearman | pairs/s | build s | search p50/p95 ms (b=1) | search p50/p95 ms (batch) "
        "| bytes/vector | of copy bandwidth |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:  # type: ignore[union-attr]
        s = r["search_ms"]
        batch = next(v for k, v in s.items() if k != "batch1")
        lines.append(
            f"| {r['dim']} | {r['n']:,} | {r.get('dev_spearman', '–')} | {r.get('encode_pairs_per_s', '–')} | "
            f"{r['build_seconds']:.3f} | {s['batch1']['p50']:.3f} / {s['batch1']['p95']:.3f} | "
            f"{batch['p50']:.2f} / {batch['p95']:.2f} | {r['bytes_per_vector']:.0f} | "
            f"{_fraction(r['bandwidth_fraction'])} |"
        )
    enc = result["encode"]
    csr = result["csr"]
    lines += [
        "",
        f"Memory bandwidth (numpy copy, read + write): {result['memory_bandwidth_gb_per_s']} GB/s; "
        + (
            f"exact search (batch 1) reaches {result['search_bandwidth_fraction']} of it at "
            f"{result['search_bandwidth_fraction_at']}."
            if result["search_bandwidth_fraction"] is not None
            else f"no index measured is larger than the last-level cache ({result['last_level_cache_bytes']} B), "
            "so no bandwidth fraction applies."
        ),
        f"CASE encode: {enc['case_pairs_per_s']} pairs/s; plain: {enc['plain_texts_per_s']} texts/s"  # type: ignore[index]
        + (
            f"; sentence-transformers encode(): {enc['peer']['texts_per_s']} texts/s "  # type: ignore[index]
            f"(plain/peer {enc['peer']['plain_vs_peer']})"  # type: ignore[index]
            if "peer" in enc  # type: ignore[operator]
            else ""
        ),
        f"CSR new condition over {csr['n']} cached sentences: {result['csr_new_condition_speedup']}× faster "  # type: ignore[index]
        "than a CASE re-encode.",
    ]
    return "\n".join(lines) + "\n"


def has_matplotlib() -> bool:
    """Return whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot(result: dict[str, object], path: Path) -> None:
    """Draw Spearman and search latency against dimension into a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    heads = result["heads"]
    dims = sorted(int(d) for d in heads)  # type: ignore[union-attr]
    ax1.plot(dims, [heads[str(d)]["dev"]["spearman"] for d in dims], "o-")  # type: ignore[index]
    ax1.set(xscale="log", xlabel="head dimension", ylabel="dev Spearman ×100", title="C-STS dev, CASE head")
    ax1.set_xticks(dims, [str(d) for d in dims])
    ax1.minorticks_off()  # the log axis' own minor labels would overprint the dims
    for n in sorted({r["n"] for r in rows}):  # type: ignore[union-attr]
        sel = sorted((r for r in rows if r["n"] == n), key=lambda r: r["dim"])  # type: ignore[union-attr]
        ax2.plot([r["dim"] for r in sel], [r["search_ms"]["batch1"]["p50"] for r in sel], "o-", label=f"n={n:,}")
    ax2.set(xscale="log", yscale="log", xlabel="dimension", ylabel="search p50 ms (batch 1)", title="FAISS Flat")
    ax2.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_transformers()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args, Path(tmp))
    write_outputs(result, markdown(result), args.json_out, args.md_out)
    if args.plot is not None:
        plot(result, args.plot)
        _log(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
