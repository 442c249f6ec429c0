#!/usr/bin/env python3
"""Serving: latency and throughput of `condsearch serve` under concurrent clients, beside one-shot `query`.

Builds an index of --n rows under the default model's manifest (--mode case or csr): --seed-n real
sentences encoded by the model (so that queries find real neighbours) and filler vectors for the
rest, written by the store as `condsearch index` writes it. The filler (--filler) is random unit
vectors (the worst case for an approximate index: they bound cost, not recall) or ``fitted``: draws
from a Gaussian with the real vectors' mean and covariance, normalised (ours: a stand-in for a large
real corpus, which this machine cannot encode). --factory builds an approximate index instead of a
flat one (``IVF4096,Flat`` with ``--search-params nprobe=32``); its recall@k against exact search
over the same vectors, for the benchmark's queries, its build time and its size are reported.
Then, in one run:

- the server: `condsearch serve --preload` in its own process on a free loopback port, driven
  by 1, 8 and 32 concurrent clients (--clients), each sending one real query per request and
  the next as soon as the answer is in, for at most --requests requests or --seconds per level.
  Latency is the client's: request sent to JSON answer read. Queries/s is answers per wall second;
- the one-shot CLI: `condsearch query` (one query, a fresh process each time) on that index,
  --cli-repeats times with the cache written (the model's ONNX export, written by a first,
  untimed query: what every query but the first costs), and once with an empty cache (the
  first query after install; not in --smoke);
- the stages, in this process, on the index and model as the server loads them, for each backend
  of --stage-backends (torch, the server before onnxruntime; auto, what it runs now) and a batch
  of 1 and of the most clients' queries: tokenize, forward (the rest of encoding: the queries' pass,
  the condition's own pass, head and normalising; the condition's pass also alone), search, and
  the JSON answer. Medians of --stage-repeats after one warm-up.

    python -m benchmarks.systems.serve --json-out benchmarks/systems/results/serve.json \
        --md-out benchmarks/systems/results/serve.md
    python -m benchmarks.systems.serve --n 1000000 --filler fitted --factory IVF4096,Flat \
        --search-params nprobe=32 --stage-backends none --json-out benchmarks/systems/results/serve_1m_ivf.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._lib.common import log, run_info, synthetic_csts, write_outputs  # noqa: E402

CONDITION = "the color of the shirt"


def _log(msg: str) -> None:
    log("serve", msg)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model id or folder (default all-MiniLM-L6-v2)")
    p.add_argument("--head", default="auto", help="--head of `condsearch index` (auto: the shipped default)")
    p.add_argument("--n", type=int, default=100_000, help="rows in the index")
    p.add_argument("--seed-n", type=int, default=512, help="rows that are real sentences encoded by the model")
    p.add_argument("--mode", choices=("case", "csr"), default="case", help="what encodes: CASE or the router")
    p.add_argument("--filler", choices=("random", "fitted"), default="random", help="the rows after the real ones")
    p.add_argument("--factory", default="Flat", help="FAISS factory of the served index (e.g. IVF4096,Flat)")
    p.add_argument("--search-params", default="", help="its search parameters, recorded in the manifest")
    p.add_argument("--recall-queries", type=int, default=200, help="queries whose recall@k is measured (non-flat)")
    p.add_argument("--clients", default="1,8,32", help="concurrency levels")
    p.add_argument("--requests", type=int, default=1000, help="requests per level at most")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds per level at most")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--cli-repeats", type=int, default=5, help="one-shot queries timed with a written cache")
    p.add_argument("--batch-window-ms", type=float, default=None, help="serve's --batch-window-ms [its default]")
    p.add_argument("--max-batch", type=int, default=None, help="serve's --max-batch [its default]")
    p.add_argument("--backend", choices=("auto", "torch"), default=None, help="serve's --backend [its default]")
    p.add_argument("--threads", type=int, default=None, help="serve's --threads (encoding) [its default]")
    p.add_argument("--search-threads", type=int, default=None, help="serve's --search-threads [its default]")
    p.add_argument(
        "--stage-backends",
        default="torch,auto",
        help="backends whose stages are timed in-process (CASE only; 'none': not timed)",
    )
    p.add_argument("--stage-repeats", type=int, default=50, help="timed repeats per stage measurement")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds for the server to load and listen")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.n, args.seed_n, args.clients, args.requests, args.seconds, args.cli_repeats = 2000, 32, "1,4", 16, 20.0, 1
        args.stage_repeats = 2
    args.clients = [int(c) for c in str(args.clients).split(",") if c.strip()]
    args.stage_backends = [b for b in str(args.stage_backends).split(",") if b.strip() and b != "none"]
    if not set(args.stage_backends) <= {"auto", "torch"} or args.stage_repeats < 1:
        p.error("--stage-backends takes auto and/or torch, or none; --stage-repeats at least 1")
    if args.mode == "csr" and args.stage_backends:
        p.error("--mode csr: the stages are timed for CASE only; add --stage-backends none")
    from condsearch.base.ann import check_index_options

    try:
        check_index_options(args.factory, args.search_params)
    except ValueError as exc:
        p.error(str(exc))
    if args.seed_n > args.n or min(args.clients) < 1 or args.requests < 1:
        p.error("need 1 <= --seed-n <= --n, clients >= 1 and --requests >= 1")
    return args


def random_unit_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Return n random unit vectors: (n, dim) float32."""
    vectors = np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def fitted_vectors(real: np.ndarray, n: int, seed: int = 0, chunk: int = 100_000) -> np.ndarray:
    """Return n unit vectors drawn from a Gaussian with the real rows' mean and covariance (ours)."""
    rng = np.random.default_rng(seed)
    mean = real.mean(axis=0)
    spread = (real - mean) / np.sqrt(max(len(real) - 1, 1))  # g @ spread has the rows' covariance
    out = np.empty((n, real.shape[1]), dtype=np.float32)
    for start in range(0, n, chunk):
        g = rng.standard_normal((min(chunk, n - start), len(real)), dtype=np.float32)
        drawn = mean + g @ spread
        out[start : start + len(drawn)] = drawn / np.linalg.norm(drawn, axis=1, keepdims=True)
    return out


def recall_at_k(index: Any, vectors: np.ndarray, queries_: np.ndarray, k: int) -> float:
    """Return the mean share of the exact top-k (a scan of vectors) that index finds for queries_."""
    from benchmarks.systems.ann import exact_top, recall_at

    _, found = index.search(queries_, k)
    return recall_at(found, exact_top(vectors, queries_, k))


def build_index(args: argparse.Namespace, index_dir: Path, tmp: Path) -> dict[str, object]:
    """Write the benchmark index into index_dir: seed sentences encoded by the model, filler rows after."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from condsearch.base.faiss_indexes import build_index as faiss_index
    from condsearch.corpus.reader import read_corpus
    from condsearch.ingest.chunks import index_corpus
    from condsearch.model.encoders.spec import EncoderSpec
    from condsearch.model.vectorizer import load_vectorizer
    from condsearch.store.folder import IndexStore

    distinct = list(dict.fromkeys(synthetic_csts(4 * args.seed_n, seed=7).sentence1))
    sentences = [distinct[i % len(distinct)] + (f" (#{i})" if i >= len(distinct) else "") for i in range(args.seed_n)]
    seed_file = tmp / "seed.parquet"
    pq.write_table(pa.table({"id": [f"real-{i}" for i in range(len(sentences))], "text": sentences}), seed_file)
    store = IndexStore(index_dir)
    start = time.perf_counter()
    spec = EncoderSpec(args.model, mode="csr") if args.mode == "csr" else EncoderSpec(args.model, head=args.head)
    vec = load_vectorizer(spec)
    (name,) = index_corpus(read_corpus(seed_file), [CONDITION], vec, store, corpus_name="serve-bench")
    seed = store.load(name)
    real = seed.index.reconstruct_n(0, seed.index.ntotal)
    n_filler = args.n - len(sentences)
    filler = fitted_vectors(real, n_filler) if args.filler == "fitted" else random_unit_vectors(n_filler, real.shape[1])
    vectors = np.concatenate([real, filler])
    del filler
    ids = [*seed.ids, *(f"{args.filler}-{i}" for i in range(n_filler))]
    texts = [*seed.texts, *(f"{args.filler} row {i}" for i in range(n_filler))]
    built = time.perf_counter()
    index = faiss_index(vectors, args.factory, search_params=args.search_params)
    build_s = time.perf_counter() - built
    recall = recall_drawn = None
    if args.factory != "Flat" and args.recall_queries:
        recall = recall_at_k(index, vectors, vec.encode(queries(args.recall_queries), CONDITION), args.k)
        if args.filler == "fitted":  # queries that are not rows: fresh draws from the filler's Gaussian
            recall_drawn = recall_at_k(index, vectors, fitted_vectors(real, args.recall_queries, seed=1), args.k)
    manifest = dataclasses.replace(seed.manifest, n_vectors=args.n, corpus_path="synthetic", corpus_checksum="",
                                   factory=args.factory, search_params=args.search_params)  # fmt: skip
    store.write(manifest, index, ids, texts)
    size = store.read_manifest(name).index_size  # the manifest alone: no second read of the index
    took = time.perf_counter() - start
    _log(f"index of {args.n:,} rows ({len(sentences)} real, {args.factory}) built in {took:.1f}s (FAISS {build_s:.1f}s,"
         f" {size / 2**20:.0f} MiB, recall@{args.k} {recall}, drawn queries {recall_drawn})")  # fmt: skip
    return {"n": args.n, "n_real": len(sentences), "dim": int(real.shape[1]), "model": vec.encoder.model_id,
            "mode": args.mode, "head": vec.profile_name, "filler": args.filler, "factory": args.factory,
            "search_params": args.search_params, "faiss_build_s": round(build_s, 2), "index_bytes": size,
            "recall_at_k": None if recall is None else round(recall, 4),
            "recall_at_k_drawn_queries": None if recall_drawn is None else round(recall_drawn, 4),
            "recall_queries": args.recall_queries if recall is not None else 0}  # fmt: skip


def queries(n: int) -> list[str]:
    """Return n real query texts (varied, so that nothing is answered from a cache)."""
    data = synthetic_csts(2 * n + 64, seed=11)
    texts = list(dict.fromkeys(data.sentence2))
    return [texts[i % len(texts)] if i < len(texts) else f"{texts[i % len(texts)]} {i}" for i in range(n)]


def cli_query_seconds(args: argparse.Namespace, index_dir: Path, env: dict[str, str], text: str) -> float:
    """Return the wall time of one `condsearch query` in a fresh process."""
    cmd = [sys.executable, "-m", "condsearch", "query", text, "-c", CONDITION, "-k", str(args.k)]
    start = time.perf_counter()
    subprocess.run([*cmd, "--index-dir", str(index_dir)], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def measure_cli(args: argparse.Namespace, index_dir: Path, env: dict[str, str], tmp: Path) -> dict[str, object]:
    """Time one-shot queries: --cli-repeats with the cache written, then one with an empty cache."""
    texts = queries(args.cli_repeats + 1)
    cli_query_seconds(args, index_dir, env, texts[0])  # writes the ONNX export that the timed queries read
    warm = [cli_query_seconds(args, index_dir, env, t) for t in texts[1:]]
    _log(f"one-shot query, cache written: {', '.join(f'{s:.2f}' for s in warm)}s")
    cold = None
    if not args.smoke:
        empty = {**env, "CONDSEARCH_CACHE_DIR": str(tmp / "empty-cache")}
        cold = round(cli_query_seconds(args, index_dir, empty, texts[0]), 3)
        _log(f"one-shot query, empty cache: {cold:.2f}s")
    return {"median_s": round(statistics.median(warm), 3), "runs_s": [round(s, 3) for s in warm],
            "first_query_empty_cache_s": cold}  # fmt: skip


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """`condsearch serve --preload` in a child process on a free loopback port, stopped on exit."""

    def __init__(self, args: argparse.Namespace, index_dir: Path, env: dict[str, str], log_file: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "condsearch", "serve", "--preload", "--port", str(self.port)]
        cmd += ["--index-dir", str(index_dir)]
        if args.batch_window_ms is not None:
            cmd += ["--batch-window-ms", str(args.batch_window_ms)]
        if args.max_batch is not None:
            cmd += ["--max-batch", str(args.max_batch)]
        chosen = {"--backend": args.backend, "--threads": args.threads, "--search-threads": args.search_threads}
        for flag, value in chosen.items():
            if value is not None:
                cmd += [flag, str(value)]
        self._cmd, self._env, self._log_file, self._timeout = cmd, env, log_file, args.startup_timeout
        self.startup_s = 0.0

    def __enter__(self) -> ServerProcess:
        import httpx

        start = time.perf_counter()
        self._log = open(self._log_file, "wb")  # noqa: SIM115 - closed in __exit__
        self._proc = subprocess.Popen(self._cmd, env=self._env, stdout=self._log, stderr=subprocess.STDOUT)
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self._proc.returncode}): {self._log_file.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.perf_counter() - start > self._timeout:
                self.__exit__()
                raise RuntimeError(f"the server did not answer within {self._timeout:.0f}s")
            time.sleep(0.1)
        self.startup_s = time.perf_counter() - start
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    """Return p50, p95 and p99 in milliseconds."""
    ms = np.asarray(seconds) * 1e3
    return {f"p{q}": round(float(np.percentile(ms, q)), 2) for q in (50, 95, 99)}


async def drive(url: str, n_clients: int, texts: list[str], k: int, max_requests: int, seconds: float) -> dict:
    """Run n_clients closed-loop clients until max_requests are sent or seconds pass; return what they saw."""
    import httpx

    latencies: list[float] = []
    errors: list[str] = []
    sent = 0
    limits = httpx.Limits(max_connections=n_clients, max_keepalive_connections=n_clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        before = (await http.get("/health")).json()["batches"]
        start = time.perf_counter()
        deadline = start + seconds

        async def client() -> None:
            nonlocal sent
            while sent < max_requests and time.perf_counter() < deadline:
                text = texts[sent % len(texts)]
                sent += 1
                t0 = time.perf_counter()
                response = await http.post("/query", json={"query": text, "condition": CONDITION, "k": k})
                elapsed = time.perf_counter() - t0
                if response.status_code == 200 and len(response.json()["results"][0]["results"]) == k:
                    latencies.append(elapsed)
                else:
                    errors.append(f"{response.status_code} {response.text[:200]}")

        await asyncio.gather(*(client() for _ in range(n_clients)))
        wall = time.perf_counter() - start
        after = (await http.get("/health")).json()["batches"]
    n_batches = after["n"] - before["n"]
    return {
        "clients": n_clients,
        "requests": len(latencies),
        "errors": len(errors),
        "error_examples": errors[:3],
        "seconds": round(wall, 2),
        "queries_per_s": round(len(latencies) / wall, 2),
        "latency_ms": percentiles_ms(latencies) if latencies else None,
        "mean_batch": round((after["requests"] - before["requests"]) / n_batches, 2) if n_batches else None,
        "largest_batch": after["largest"],
    }


def measure_server(args: argparse.Namespace, index_dir: Path, env: dict[str, str], tmp: Path) -> dict[str, object]:
    """Start the server and drive it at each concurrency level."""
    import httpx

    texts = queries(max(args.requests, 64))
    levels = []
    with ServerProcess(args, index_dir, env, tmp / "server.log") as server:
        _log(f"server up on {server.url} after {server.startup_s:.1f}s (model and index preloaded)")
        asyncio.run(drive(server.url, 1, texts[-8:], args.k, 8, args.seconds))  # warm-up
        health = httpx.get(server.url + "/health", timeout=10).json()
        _log(f"encoders: {health['models']}, threads: {health['threads']}")
        for n_clients in args.clients:
            row = asyncio.run(drive(server.url, n_clients, texts, args.k, args.requests, args.seconds))
            lat = row["latency_ms"] or {}
            _log(
                f"{n_clients:>3} clients: {row['queries_per_s']} queries/s, p50 {lat.get('p50')} ms, "
                f"p99 {lat.get('p99')} ms, mean batch {row['mean_batch']}, {row['errors']} errors"
            )
            levels.append(row)
    return {"startup_s": round(server.startup_s, 2), "backend": health["backend"], "models": health["models"],
            "threads": health["threads"], "levels": levels}  # fmt: skip


STAGES = ("tokenize", "forward", "condition_pass", "search", "json")


def measure_stages(args: argparse.Namespace, index_dir: Path) -> list[dict[str, object]]:
    """Time each stage of answering, in this process, for each backend and a batch of 1 and of the most clients."""
    import json

    from condsearch.base.faiss_indexes import search_threads
    from condsearch.model.encoders.bert_inputs import case_inputs
    from condsearch.query.as_json import query_answer
    from condsearch.query.resident import Resident, backend_of
    from condsearch.query.search import Answer
    from condsearch.serve.config import ServeConfig
    from condsearch.store.folder import IndexStore

    texts = queries(max(args.clients))
    rows = []
    for backend in args.stage_backends:
        config = ServeConfig(index_dir=index_dir, backend=backend, threads=args.threads, device="cpu",
                             search_threads=args.search_threads)  # fmt: skip
        search_threads(config.search_threads)
        resident = Resident(IndexStore(index_dir), device="cpu", threads=config.encode_threads, backend=backend)
        entry = resident.get(CONDITION)
        vec = resident.vectorizer(entry.model_key)
        encoder: Any = vec.encoder
        module = sys.modules[type(encoder).__module__]  # where the encoder calls case_inputs: timed there
        tokenizing: list[float] = []

        def timed_case_inputs(*a: Any, _inner: Any = case_inputs, _spent: list[float] = tokenizing) -> Any:
            start = time.perf_counter()
            try:
                return _inner(*a)
            finally:
                _spent.append(time.perf_counter() - start)

        module.case_inputs = timed_case_inputs  # type: ignore[attr-defined]
        for n in sorted({1, max(args.clients)}):
            batch = texts[:n]
            ms: dict[str, list[float]] = {stage: [] for stage in STAGES}
            for repeat in range(args.stage_repeats + 1):
                tokenizing.clear()
                t0 = time.perf_counter()
                vectors = vec.encode(batch, CONDITION, batch_size=n)
                t1 = time.perf_counter()
                found = entry.search(vectors, args.k)
                t2 = time.perf_counter()
                answered = Answer(tuple(batch), CONDITION, found, args.k, entry.manifest.n_vectors)
                json.dumps({"results": [query_answer(h) for h in answered.hits]}, ensure_ascii=False)
                t3 = time.perf_counter()
                encoder.encode_pairs([(CONDITION, None)], batch_size=1)
                t4 = time.perf_counter()
                if repeat:  # the first is a warm-up
                    tokenize = sum(tokenizing[:-1])  # the last is the condition pass's own, timed apart
                    spent = (tokenize, t1 - t0 - tokenize, t4 - t3, t2 - t1, t3 - t2)
                    for stage, seconds in zip(STAGES, spent, strict=True):
                        ms[stage].append(seconds * 1e3)
            row = {"backend": backend_of(vec), "asked": backend, "threads": config.encode_threads,
                   "search_threads": search_threads(), "batch": n,
                   **{f"{stage}_ms": round(statistics.median(v), 3) for stage, v in ms.items()}}  # fmt: skip
            row["total_ms"] = round(sum(row[f"{s}_ms"] for s in STAGES if s != "condition_pass"), 3)  # type: ignore[misc]
            _log("stages: " + ", ".join(f"{key} {value}" for key, value in row.items()))
            rows.append(row)
        module.case_inputs = case_inputs  # type: ignore[attr-defined]
        resident.close()
        del resident, entry, vec, encoder
    return rows


def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    index_dir = tmp / "indexes"
    index = build_index(args, index_dir, tmp)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    served = measure_server(args, index_dir, env, tmp)
    cli = measure_cli(args, index_dir, env, tmp)
    stages = measure_stages(args, index_dir)
    by_clients = {row["clients"]: row for row in served["levels"]}  # type: ignore[union-attr]
    one, most = by_clients[min(by_clients)], by_clients[max(by_clients)]
    return {
        "served_p50_ms_1_client": one["latency_ms"]["p50"] if one["latency_ms"] else None,
        "served_queries_per_s_max_clients": most["queries_per_s"],
        "cli_query_median_s": cli["median_s"],
        "index": index,
        "cli": cli,
        "server": served,
        "stages": stages,
        "config": {
            "clients": args.clients,
            "requests_per_level": args.requests,
            "seconds_per_level": args.seconds,
            "k": args.k,
            "batch_window_ms": args.batch_window_ms,
            "max_batch": args.max_batch,
            "backend": args.backend,
            "threads": args.threads,
            "search_threads": args.search_threads,
            "stage_repeats": args.stage_repeats,
            "condition": CONDITION,
            "mode": args.mode,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "smoke": args.smoke,
            **run_info(),
        },
    }


def markdown(result: dict[str, object]) -> str:
    index, cli, served = result["index"], result["cli"], result["server"]
    lines = [
        f"Index: {index['n']:,} rows × {index['dim']}-d, FAISS {index['factory']} {index['search_params']}, "  # type: ignore[index]
        f"mode {index['mode']}, model {index['model']} (head {index['head']}); {index['n_real']} rows are real "  # type: ignore[index]
        f"sentences, the rest {index['filler']}; FAISS build {index['faiss_build_s']} s, "  # type: ignore[index]
        f"{index['index_bytes'] / 2**20:.0f} MiB on disk, recall@k against exact search: {index['recall_at_k']} "  # type: ignore[index]
        f"(the benchmark's queries), {index['recall_at_k_drawn_queries']} (fresh draws of the filler).",  # type: ignore[index]
        "",
        "| clients | requests | queries/s | p50 ms | p95 ms | p99 ms | mean batch | errors |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in served["levels"]:  # type: ignore[index]
        lat = r["latency_ms"] or {"p50": "–", "p95": "–", "p99": "–"}
        lines.append(
            f"| {r['clients']} | {r['requests']} | {r['queries_per_s']} | {lat['p50']} | {lat['p95']} | "
            f"{lat['p99']} | {r['mean_batch'] if r['mean_batch'] is not None else '–'} | {r['errors']} |"
        )
    lines += [
        "",
        f"Encoders: {', '.join(m['backend'] for m in served['models'])} (asked: {served['backend']}); "  # type: ignore[index]
        f"threads: {served['threads']['encode']} encoding, {served['threads']['search']} searching.",  # type: ignore[index]
        "",
        "Stages, in-process (median ms; tokenize and forward cover the queries' and the condition's own pass, "
        "forward the head too; the condition's pass is also shown alone):",
        "",
        "| backend | batch | tokenize | forward | (condition pass) | search | JSON | total |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['backend']} | {r['batch']} | {r['tokenize_ms']} | {r['forward_ms']} | {r['condition_pass_ms']} | "
            f"{r['search_ms']} | {r['json_ms']} | {r['total_ms']} |"
            for r in result["stages"]  # type: ignore[attr-defined]
        ),
        "",
        f"Server start (`serve --preload`, model and index loaded): {served['startup_s']} s.",  # type: ignore[index]
        f"One-shot `condsearch query` (a fresh process, one query): median {cli['median_s']} s over "  # type: ignore[index]
        f"{len(cli['runs_s'])} runs"  # type: ignore[index]
        + (
            f"; the first query with an empty cache: {cli['first_query_empty_cache_s']} s."  # type: ignore[index]
            if cli["first_query_empty_cache_s"] is not None  # type: ignore[index]
            else "."
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="condsearch-serve-bench-") as tmp:
        result = run(args, Path(tmp))
    write_outputs(result, markdown(result), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
