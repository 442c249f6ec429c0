#!/usr/bin/env python3
"""Throughput of indexing (sentence–condition pairs per second) and index size per 1,000 rows.

Builds a parquet corpus of the first N distinct sentences of a C-STS CSV, runs the same code
path as ``condsearch index`` under one condition into a temporary store, and reports the
median of --repeats timed runs (after one warm-up), plus the bytes on disk per 1,000 rows.

    python -m benchmarks.systems.index_throughput --csv ../shared/data/csts-reannotated/train.csv -n 5000

--incremental: re-indexing a corpus of -n rows (real texts: WN18RR entity texts and C-STS
sentences) after 1% of its rows changed (a third edited, a third deleted, a third added),
against a full rebuild of the changed corpus; the time ratio, whether the top-10 of held-out
queries is identical and the vectors equal, and the process's peak RSS.

--against-st: in one run, the encoding path of ``condsearch index`` (the vectorizer it loads,
--backend auto by default: onnxruntime on the CPU wherever it applies, see condsearch.model.policy;
encoding in its chunks of 8,192 rows, FAISS and file writes left out) on the first N distinct
sentences under one condition, against sentence-transformers'
``SentenceTransformer(<the same model folder>).encode(texts)`` on the same texts (plain
embeddings, its default batch of 32 unless --st-batch-size). Both run in every repeat, in
alternating order, after a warm-up; the JSON gives their median pairs/s, the ratio, the
backend used, the threads and the CPU.

    python -m benchmarks.systems.index_throughput --against-st --csv ../shared/data/csts-reannotated/train.csv -n 5000

--stream-rows N: the peak RSS of indexing an N-row parquet corpus in a fresh process, beside
the size of the index built; --encoder hash stands in a fast deterministic encoder (sha256-
seeded random vectors, as the tests' hash encoder) for the model, so 1M rows take minutes.

    python -m benchmarks.systems.index_throughput --incremental -n 20000 \
        --json-out benchmarks/systems/results/index_incremental.json
    python -m benchmarks.systems.index_throughput --stream-rows 1000000 --encoder hash \
        --json-out benchmarks/systems/results/index_stream_1m.json
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._lib.common import log, quiet_transformers, run_info, timing_config, write_json
from condsearch.corpus.reader import read_corpus
from condsearch.ingest.chunks import CHUNK_ROWS, index_corpus
from condsearch.model.encoders.cpu import BACKEND_CHOICES, CpuConfig, available_cores
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.policy import backend_of, load_bulk_vectorizer
from condsearch.model.vectorizer import load_vectorizer
from condsearch.store.folder import IndexStore


def distinct_sentences(path: Path, n: int) -> list[str]:
    """Return the first n distinct sentence1/sentence2 texts of a C-STS CSV."""
    seen: dict[str, None] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            for key in ("sentence1", "sentence2"):
                text = (row.get(key) or "").strip()
                if text:
                    seen.setdefault(text)
            if len(seen) >= n:
                break
    return list(seen)[:n]


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def against_sentence_transformers(args: argparse.Namespace, texts: list[str]) -> dict[str, object]:
    """Return pairs/s of index's encoding path and of sentence-transformers' encode() on the same texts."""
    import torch
    from sentence_transformers import SentenceTransformer

    from condsearch.base.model_sources import resolve_model

    if args.threads is not None:
        torch.set_num_threads(args.threads)  # sentence-transformers' threads too
    runtime = Runtime(device="cpu", threads=args.threads)
    ours = load_bulk_vectorizer(EncoderSpec(args.model, head=args.head, runtime=runtime), backend=args.backend)
    peer = SentenceTransformer(resolve_model(args.model).location, device="cpu")
    warm = texts[: min(len(texts), 2 * args.batch_size)]
    ours.encode(warm, "a warm-up condition", batch_size=args.batch_size)
    peer.encode(warm, batch_size=args.st_batch_size)

    def index_path() -> None:  # as `condsearch index` encodes: chunk by chunk, each under the condition
        for start in range(0, len(texts), CHUNK_ROWS):
            ours.encode(texts[start : start + CHUNK_ROWS], args.condition, batch_size=args.batch_size)

    runs = {
        "condsearch_index": index_path,
        "sentence_transformers": lambda: peer.encode(texts, batch_size=args.st_batch_size),
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.repeats):
        for name in list(runs)[:: 1 if r % 2 == 0 else -1]:  # alternating order: load changes fall on both
            start = time.perf_counter()
            runs[name]()
            seconds[name].append(time.perf_counter() - start)
        log("index_throughput", " ".join(f"{n}: {len(texts) / t[-1]:.1f}" for n, t in seconds.items()) + " pairs/s")
    rate = {name: len(texts) / statistics.median(t) for name, t in seconds.items()}
    backend = backend_of(ours)
    info = run_info("cpu")
    machine = info["machine"]
    assert isinstance(machine, dict)
    return {
        "mode": "against_sentence_transformers",
        "rows": len(texts),
        "condition": args.condition,
        "backend": backend,
        "backend_asked": args.backend,
        "threads": {
            "condsearch_index": (args.threads or available_cores())
            if backend == "onnxruntime"
            else torch.get_num_threads(),
            "sentence_transformers": torch.get_num_threads(),
        },
        "cpu": machine["cpu"],
        "seconds": {name: [round(x, 3) for x in t] for name, t in seconds.items()},
        "pairs_per_second": {name: round(v, 1) for name, v in rate.items()},
        "ratio": round(rate["condsearch_index"] / rate["sentence_transformers"], 3),
        "dim": ours.dim,
        "config": {
            "model": ours.encoder.model_id,
            "head": ours.profile_name,
            "st_batch_size": args.st_batch_size,
            **timing_config(args.batch_size, args.repeats, args.smoke),
        },
        "run": info,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", type=Path, default=None, help="C-STS style CSV to draw sentences from")
    p.add_argument("-n", type=int, default=5000, help="corpus rows")
    p.add_argument("--condition", default="color of the dress")
    p.add_argument("--model", default=None)
    p.add_argument("--head", default="auto")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="50 rows, one timed run")
    p.add_argument("--incremental", action="store_true", help="time a 1%% change against a full rebuild")
    p.add_argument("--stream-rows", type=int, default=None, help="peak RSS of indexing this many rows")
    p.add_argument("--encoder", choices=["model", "hash"], default="model", help="--stream-rows: what encodes")
    p.add_argument("--dim", type=int, default=256, help="--encoder hash: vector size (the default head's)")
    p.add_argument("--index-factory", default="Flat", help="--stream-rows: index type")
    p.add_argument("--texts", type=Path, nargs="*", default=None, help="--incremental: text sources")
    p.add_argument("--save-vectors", type=Path, default=None, help="--incremental: keep the vectors here (.npy)")
    p.add_argument("--against-st", action="store_true", help="index's encoding against sentence-transformers")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default=CpuConfig.backend, help="--against-st: ours")
    p.add_argument("--threads", type=int, default=CpuConfig.threads, help="--against-st: both [default: each its own]")
    p.add_argument("--st-batch-size", type=int, default=32, help="--against-st: encode()'s batch (its default)")
    p.add_argument("--_child", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.incremental or args.stream_rows or args._child:
        from benchmarks._lib.incremental import run_mode

        return run_mode(args)
    if args.csv is None:
        p.error("--csv is required (except with --incremental or --stream-rows)")
    quiet_transformers()
    n, repeats = (50, 1) if args.smoke else (args.n, args.repeats)
    texts = distinct_sentences(args.csv, n)
    if args.against_st:
        args.repeats = repeats
        write_json(against_sentence_transformers(args, texts), args.json_out)
        return 0
    vec = load_vectorizer(EncoderSpec(args.model, head=args.head))
    with tempfile.TemporaryDirectory() as tmp:
        corpus_path = Path(tmp) / "corpus.parquet"
        pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), corpus_path)
        corpus = read_corpus(corpus_path)
        store = IndexStore(Path(tmp) / "indexes")
        index_corpus(corpus, [args.condition], vec, store, corpus_name="warmup", batch_size=args.batch_size)
        seconds = []
        for r in range(repeats):
            start = time.perf_counter()
            names = index_corpus(corpus, [args.condition], vec, store, corpus_name="bench", batch_size=args.batch_size)
            seconds.append(time.perf_counter() - start)
            print(f"[index_throughput] run {r + 1}: {len(texts) / seconds[-1]:.1f} pairs/s", file=sys.stderr)
        size = folder_bytes(store.root / names[0])
    median = statistics.median(seconds)
    result = {
        "rows": len(texts),
        "median_seconds": round(median, 3),
        "pairs_per_second": round(len(texts) / median, 1),
        "index_bytes": size,
        "bytes_per_1000_rows": round(size * 1000 / len(texts)),
        "dim": vec.dim,
        "config": {
            "model": vec.encoder.model_id,
            "head": vec.profile_name,
            **timing_config(args.batch_size, repeats, args.smoke),
        },
        "run": run_info(),
    }
    write_json(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
