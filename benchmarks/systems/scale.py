"""Issue 16's figures: Ray Data against the local path, and Milvus Lite against the FAISS Flat store.

1. One corpus (the demo captions repeated to --rows, each copy numbered) indexed under one
   condition by the local path and by --ray on a local instance (--ray-cpus CPUs), in one run:
   pairs/s of each (wall time of the whole build, Ray's start included and apart) and the max
   abs difference of their vectors.
2. The demo corpus (308 rows) in the FAISS Flat store and in Milvus Lite: the top-10 of
   --queries queries compared, and the search latency of each (median per query, batch 1; the
   query vectors are encoded once beforehand, so only the stores are timed).

python -m benchmarks.systems.scale --json-out benchmarks/systems/results/scale.json \
    --md-out benchmarks/systems/results/scale.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._lib.common import log, quiet_transformers, run_info, write_outputs  # noqa: E402

CONDITION = "color of the dress"


def _corpus(path: Path, rows: int) -> Path:
    from condsearch.corpus.demo import read_demo_rows

    _, texts = read_demo_rows()
    out = [f"{texts[i % len(texts)]} ({i // len(texts)})" for i in range(rows)]
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(rows)], "text": out}), path)
    return path


def ray_vs_local(work: Path, rows: int, cpus: int, model: str | None, head: str) -> dict[str, object]:
    import ray

    from condsearch.corpus.reader import scan_corpus
    from condsearch.ingest.chunks import index_conditions
    from condsearch.model import load_model_for
    from condsearch.model.encoders.spec import EncoderSpec
    from condsearch.scale.config import RayConfig
    from condsearch.scale.ray_encode import ray_index_conditions, start_ray
    from condsearch.store.folder import IndexStore

    corpus = scan_corpus(_corpus(work / "corpus.parquet", rows))
    build = {"corpus_name": "c", "factory": "Flat", "search_params": "", "max_index_memory": "1G"}
    t0 = time.perf_counter()
    vec = load_model_for("bulk", EncoderSpec(model, head=head))  # the path Ray's actors take (issue 61, item 4)
    t1 = time.perf_counter()
    [local] = index_conditions(corpus, [CONDITION], vec, IndexStore(work / "local"), **build)
    t2 = time.perf_counter()
    log("scale", f"local: {rows} pairs in {t2 - t1:.1f}s (+{t1 - t0:.1f}s model load)")
    del vec
    start_ray(ray, num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    t3 = time.perf_counter()
    [remote] = ray_index_conditions(
        corpus,
        [CONDITION],
        EncoderSpec(model, head=head),
        IndexStore(work / "ray"),
        config=RayConfig(actors=cpus),
        **build,
    ).reports
    t4 = time.perf_counter()
    ray.shutdown()
    log("scale", f"ray: {rows} pairs in {t4 - t3:.1f}s (+{t3 - t2:.1f}s ray.init)")
    a = np.load(work / "local" / local.name / "vectors.npy")
    b = np.load(work / "ray" / remote.name / "vectors.npy")
    return {
        "rows": rows,
        "ray_cpus": cpus,
        "ray_actors": cpus,
        "local_seconds": round(t2 - t1, 2),
        "local_model_load_seconds": round(t1 - t0, 2),
        "local_pairs_per_s": round(rows / (t2 - t1), 2),
        "ray_seconds": round(t4 - t3, 2),
        "ray_init_seconds": round(t3 - t2, 2),
        "ray_pairs_per_s": round(rows / (t4 - t3), 2),
        "max_abs_diff": float(np.abs(a - b).max()),
    }


def milvus_vs_faiss(work: Path, n_queries: int, model: str | None, head: str, repeats: int) -> dict[str, object]:
    from condsearch.corpus.demo import write_demo_corpus
    from condsearch.corpus.reader import scan_corpus
    from condsearch.ingest.chunks import index_conditions
    from condsearch.model.encoders.spec import EncoderSpec
    from condsearch.model.vectorizer import load_vectorizer
    from condsearch.scale.export import export_index
    from condsearch.scale.milvus import MilvusStore, parse_store
    from condsearch.store.folder import IndexStore

    path = work / "demo.parquet"
    write_demo_corpus(path)
    vec = load_vectorizer(EncoderSpec(model, head=head))
    store = IndexStore(work / "demo-idx")
    [report] = index_conditions(scan_corpus(path), [CONDITION], vec, store, corpus_name="demo")
    stored = store.load(report.name)
    queries = stored.texts[:n_queries]
    qv = vec.encode(queries, CONDITION)
    target = parse_store(f"milvus-lite:{work / 'milvus.db'}")
    assert target is not None
    milvus = MilvusStore(target)
    try:
        t0 = time.perf_counter()
        entry = export_index(store, report.name, milvus)
        export_s = time.perf_counter() - t0
        faiss_ms, milvus_ms, same, tie_only = [], [], 0, 0
        for i in range(n_queries):
            for _ in range(repeats):
                t = time.perf_counter()
                scores, rows = stored.index.search(qv[i : i + 1], 10)
                faiss_ms.append((time.perf_counter() - t) * 1e3)
                t = time.perf_counter()
                hits = milvus.search(entry, qv[i : i + 1], 10)
                milvus_ms.append((time.perf_counter() - t) * 1e3)
            ids_f = [stored.ids[j] for j in rows[0]]
            ids_m = [hits.ids[j] for j in hits.result.ids[0]]
            if ids_f == ids_m:
                same += 1
            elif np.allclose(scores[0], hits.result.scores[0], atol=1e-5):
                tie_only += 1  # the same scores, rows of equal score in another order
    finally:
        milvus.close()
    return {
        "rows": len(stored.ids),
        "queries": n_queries,
        "identical_top10": same,
        "differing_only_in_tied_order": tie_only,
        "faiss_flat_search_ms_median": round(statistics.median(faiss_ms), 4),
        "milvus_lite_search_ms_median": round(statistics.median(milvus_ms), 3),
        "milvus_index_type": entry.index_type,
        "milvus_partition_key": entry.partition_key,
        "export_seconds": round(export_s, 2),
        "repeats_per_query": repeats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default=None)
    parser.add_argument("--head", default="auto")
    parser.add_argument("--smoke", action="store_true", help="a tiny run: 200 rows, 10 queries, 1 repeat")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--md-out", type=Path)
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.queries, args.repeats = 200, 10, 1
    quiet_transformers()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        milvus = milvus_vs_faiss(work, args.queries, args.model, args.head, args.repeats)
        log("scale", f"milvus: {milvus}")
        ray = ray_vs_local(work, args.rows, args.ray_cpus, args.model, args.head)
        log("scale", f"ray: {ray}")
    result = {
        "run": run_info("cpu"),
        "load_average_before": [round(x, 2) for x in load],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "ray_vs_local": ray,
        "milvus_lite_vs_faiss_flat": milvus,
    }
    table = "\n".join(
        [
            "| measure | local / FAISS Flat | Ray / Milvus Lite |",
            "|---|---|---|",
            f"| CASE pairs/s, {ray['rows']} rows | {ray['local_pairs_per_s']} | {ray['ray_pairs_per_s']} "
            f"(+{ray['ray_init_seconds']} s ray.init) |",
            f"| max abs vector difference | | {ray['max_abs_diff']:.2e} |",
            f"| identical top-10 of {milvus['queries']} queries | | {milvus['identical_top10']} "
            f"(+{milvus['differing_only_in_tied_order']} tie order only) |",
            f"| search ms per query, median | {milvus['faiss_flat_search_ms_median']} | "
            f"{milvus['milvus_lite_search_ms_median']} |",
        ]
    )
    write_outputs(result, table, args.json_out, args.md_out)


if __name__ == "__main__":
    main()
