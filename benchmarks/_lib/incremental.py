"""index_throughput.py's --incremental and --stream-rows modes (a helper module, not a script of its own)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._lib.common import REAL_TEXTS, log, rankings_agree, read_texts, run_info, write_outputs
from condsearch.corpus.reader import scan_corpus
from condsearch.ingest.chunks import index_conditions
from condsearch.model.encoders import Encoder
from condsearch.model.encoders.base import Pair
from condsearch.model.encoders.spec import EncoderSpec
from condsearch.model.vectorizer import Vectorizer, load_vectorizer
from condsearch.query.search import query_index
from condsearch.store.folder import IndexStore
from condsearch.store.vectors import VECTORS_FILE


class HashEncoder(Encoder):
    """A fast deterministic stand-in for a model: each (condition, sentence) gives a sha256-seeded vector."""

    model_id, revision = "bench/hash", "1"

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def encode_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        out = np.empty((len(pairs), self.dim), dtype=np.float32)
        for row, (condition, sentence) in enumerate(pairs):
            digest = hashlib.sha256(f"{condition}\x01{sentence}".encode()).digest()
            out[row] = np.random.default_rng(int.from_bytes(digest[:8], "little")).standard_normal(self.dim)
        return out


def peak_rss_mib() -> float:
    """Return this process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def changed_corpus(ids: list[int], texts: list[str], spare: list[str], share: float) -> tuple[list[int], list[str]]:
    """Return the corpus with share of its rows changed: a third edited, a third deleted, a third added."""
    n_each = max(1, round(len(ids) * share / 3))
    rng = np.random.default_rng(0)
    picked = rng.choice(len(ids), size=2 * n_each, replace=False)
    edit, drop = set(picked[:n_each].tolist()), set(picked[n_each:].tolist())
    new_ids = [i for j, i in enumerate(ids) if j not in drop]
    new_texts = [t + " (revised)" if j in edit else t for j, t in enumerate(texts) if j not in drop]
    start = max(ids) + 1
    return new_ids + list(range(start, start + n_each)), new_texts + spare[:n_each]


def _write(path: Path, ids: list[int], texts: list[str]) -> Path:
    pq.write_table(pa.table({"id": ids, "text": texts}), path)
    return path


def _timed_index(path: Path, vec: Vectorizer, store: IndexStore, condition: str, **kw: object) -> tuple[float, int]:
    start = time.perf_counter()
    [report] = index_conditions(scan_corpus(path), [condition], vec, store, corpus_name="bench", **kw)
    return time.perf_counter() - start, report.n_encoded


def incremental(args: argparse.Namespace) -> int:
    """Time re-indexing after a 1% change against a full rebuild; compare their top-10 and vectors."""
    n, repeats, n_queries = (200, 1, 20) if args.smoke else (args.n, args.repeats, 200)
    if args.smoke and not args.texts:  # smoke runs need no data set: the bundled demo captions do
        from condsearch.corpus.demo import read_demo_rows

        texts = read_demo_rows()[1]
    else:
        texts = read_texts(args.texts or REAL_TEXTS)
    if len(texts) < n + n // 50 + n_queries:
        raise SystemExit(f"index_throughput.py: {len(texts)} texts at hand, too few for -n {n}")
    corpus, spare, queries = texts[:n], texts[n : n + n // 50 + 1], texts[-n_queries:]
    vec = load_vectorizer(EncoderSpec(args.model, head=args.head))
    condition = args.condition
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ids = list(range(n))
        v1 = _write(root / "v1.parquet", ids, corpus)
        v2_ids, v2_texts = changed_corpus(ids, corpus, spare, 0.01)
        v2 = _write(root / "v2.parquet", v2_ids, v2_texts)
        inc = IndexStore(root / "incremental")
        first, _ = _timed_index(v1, vec, inc, condition, batch_size=args.batch_size, progress=not args.smoke)
        log("index_throughput", f"first full index of {n} rows: {first:.1f}s")
        # alternate v1 -> v2 -> v1 ...: every step is the same 1% change; the last lands on v2
        steps, encoded = [], []
        for r in range(2 * repeats - 1):
            target = v2 if r % 2 == 0 else v1
            seconds, n_encoded = _timed_index(target, vec, inc, condition, batch_size=args.batch_size)
            steps.append(seconds)
            encoded.append(n_encoded)
            log("index_throughput", f"incremental step {r + 1}: {seconds:.2f}s, {n_encoded} rows encoded")
        full = IndexStore(root / "full")
        rebuild, _ = _timed_index(v2, vec, full, condition, batch_size=args.batch_size, full=True)
        log("index_throughput", f"full rebuild of {len(v2_ids)} rows: {rebuild:.1f}s")
        name = inc.names()[0]
        a, b = inc.load(name), full.load(name)
        ra, rb = query_index(a, vec, queries, 10), query_index(b, vec, queries, 10)
        va, vb = np.load(inc.root / name / VECTORS_FILE), np.load(full.root / name / VECTORS_FILE)
        same_rows = a.ids == b.ids and a.texts == b.texts
        if args.save_vectors is not None:  # real CASE vectors and held-out queries for ann.py --vectors case
            args.save_vectors.mkdir(parents=True, exist_ok=True)
            np.save(args.save_vectors / "case_vectors.npy", vb, allow_pickle=False)
            np.save(args.save_vectors / "case_queries.npy", vec.encode(queries, condition), allow_pickle=False)
    median = statistics.median(steps)
    result = {
        "rows": n,
        "rows_after": len(v2_ids),
        "changed": {"edited": round(n * 0.01 / 3), "deleted": round(n * 0.01 / 3), "added": round(n * 0.01 / 3)},
        "rows_encoded_per_step": encoded,
        "incremental_seconds": [round(s, 3) for s in steps],
        "incremental_median_seconds": round(median, 3),
        "full_rebuild_seconds": round(rebuild, 3),
        "speedup": round(rebuild / median, 1),
        # identical up to ties: which of several equal scores make the top 10 is the CPU's choice
        "top10_identical_queries": int(rankings_agree(ra.scores, ra.ids, rb.scores, rb.ids).sum()),
        "queries": len(queries),
        "same_rows": same_rows,
        "max_abs_vector_difference": float(np.abs(va - vb).max()),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "config": {
            "model": vec.encoder.model_id,
            "head": vec.profile_name,
            "dim": vec.dim,
            "condition": condition,
            "batch_size": args.batch_size,
            "smoke": args.smoke,
        },
        "run": {**run_info("cpu"), "load_average_after": [round(x, 2) for x in os.getloadavg()]},
    }
    table = (
        f"| rows | changed | encoded | incremental s (median of {len(steps)}) | full rebuild s | speedup | "
        "identical top-10 | max vector diff | peak RSS MiB |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {n:,} | 1% | {encoded[-1]} | {median:.2f} | {rebuild:.1f} | {result['speedup']}× | "
        f"{result['top10_identical_queries']}/{len(queries)} | {result['max_abs_vector_difference']:.1e} | "
        f"{result['peak_rss_mib']:.0f} |\n"
    )
    write_outputs(result, table, args.json_out, None)
    return 0


def _stream_corpus(path: Path, n: int) -> None:
    """Write an n-row corpus of short synthetic texts in row groups (never all in memory)."""
    words = "girl dress red blue tennis court dog beach man park golf ball street bicycle".split()
    writer = None
    for start in range(0, n, 100_000):
        ids = list(range(start, min(n, start + 100_000)))
        texts = [f"{words[i % 14]} {words[(i // 14) % 14]} {words[(i // 196) % 14]} number {i}" for i in ids]
        table = pa.table({"id": ids, "text": texts})
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    if writer is not None:
        writer.close()


def stream(args: argparse.Namespace) -> int:
    """Index --stream-rows rows in a child process; report its peak RSS beside the index's size."""
    n = 5_000 if args.smoke else args.stream_rows
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.parquet"
        _stream_corpus(path, n)
        out = Path(tmp) / "child.json"
        cmd = [sys.executable, "-m", "benchmarks.systems.index_throughput", "--_child", str(out)]
        cmd += ["--encoder", args.encoder, "--dim", str(args.dim), "--index-factory", args.index_factory]
        cmd += ["--condition", args.condition, "--batch-size", str(args.batch_size), "--csv", str(path)]
        if args.model:
            cmd += ["--model", args.model]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=Path(__file__).resolve().parents[2])  # the repository root
        wall = time.perf_counter() - start
        child = json.loads(out.read_text())
    index_mib = child["index_bytes"] / 2**20
    result = {
        "rows": n,
        "encoder": args.encoder,
        "dim": child["dim"],
        "index_factory": args.index_factory,
        "seconds": round(wall, 1),
        "peak_rss_mib": child["peak_rss_mib"],
        "rss_before_indexing_mib": child["rss_before_mib"],
        "index_mib": round(index_mib, 1),
        "vectors_mib": round(n * child["dim"] * 4 / 2**20, 1),
        "peak_rss_beyond_index_mib": round(child["peak_rss_mib"] - index_mib, 1),
        "config": {"smoke": args.smoke, "chunk_rows": child["chunk_rows"]},
        "run": {**run_info("cpu"), "load_average_after": [round(x, 2) for x in os.getloadavg()]},
    }
    table = (
        "| rows | encoder | dim | index | seconds | peak RSS MiB | index MiB | RSS beyond index MiB |\n"
        "|---:|---|---:|---|---:|---:|---:|---:|\n"
        f"| {n:,} | {args.encoder} | {child['dim']} | {args.index_factory} | {wall:.0f} | "
        f"{child['peak_rss_mib']:.0f} | {index_mib:.0f} | {result['peak_rss_beyond_index_mib']:.0f} |\n"
    )
    write_outputs(result, table, args.json_out, None)
    return 0


def child(args: argparse.Namespace) -> int:
    """The measured process: index the corpus, write peak RSS and index size."""
    from condsearch.ingest.chunks import CHUNK_ROWS

    if args.encoder == "hash":
        vec = Vectorizer(HashEncoder(args.dim), None, "none", "")
    else:
        vec = load_vectorizer(EncoderSpec(args.model, head=args.head))
    before = peak_rss_mib()
    with tempfile.TemporaryDirectory() as tmp:
        store = IndexStore(Path(tmp))
        [report] = index_conditions(
            scan_corpus(args.csv),
            [args.condition],
            vec,
            store,
            corpus_name="bench",
            factory=args.index_factory,
            batch_size=args.batch_size,
            progress=True,
        )
        size = (store.root / report.name / "index.faiss").stat().st_size
    result = {
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "rss_before_mib": round(before, 1),
        "index_bytes": size,
        "dim": vec.dim,
        "chunk_rows": CHUNK_ROWS,
    }
    args._child.write_text(json.dumps(result))
    return 0


def run_mode(args: argparse.Namespace) -> int:
    """Dispatch index_throughput.py's extra modes."""
    if args._child:
        return child(args)
    if args.stream_rows or (args.smoke and not args.incremental):
        return stream(args)
    return incremental(args)
