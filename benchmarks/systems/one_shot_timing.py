"""Time one-shot `condsearch query` on the demo corpus: a router index on torch, without torch, and a CASE index.

Builds (once, into ``--index-dir``) the demo corpus's index under one condition twice: ``--mode csr``
(the default router: `index` on the CPU caches the router's float32 export and the condition's code)
and ``--mode case``. Then runs, interleaved, ``--repeats`` rounds of three one-shot queries, each a
fresh process, and reports each one's median wall time:

- ``csr_torch``: the router index with ``--quantize none`` (an explicit flag: torch loads, as every
  router query did before the torch-free path);
- ``csr_one_shot``: the same query without it (onnxruntime, the export and the cached code);
- ``case``: the CASE index's one-shot query (onnxruntime).

Writes JSON (``--out``) with the load average before and after, and the machine (``run``).

``--smoke`` does the same on the demo corpus's first 24 rows, one round, in a temporary folder (index
folders and its own CONDSEARCH_CACHE_DIR) with every query still a fresh process (some seconds each),
and writes JSON only where --out / --json-out says; --model (a tiny BERT folder) makes it quicker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUERY = "A girl in an orange dress plays tennis"
CONDITION = "the sport being played"
RESULTS = Path("benchmarks/systems/results/one_shot_csr.json")
SMOKE_ROWS = 24


def _cli() -> list[str]:
    return [sys.executable, "-m", "condsearch"]


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _build(corpus: Path, folder: Path, mode: str, model: list[str], env: dict[str, str] | None) -> None:
    if folder.is_dir() and any(folder.iterdir()):
        return
    argv = [*_cli(), "index", str(corpus), "-c", CONDITION, "--mode", mode, *model, "--index-dir", str(folder)]
    subprocess.run(argv, check=True, capture_output=True, env=env)


def _time(argv: list[str], env: dict[str, str] | None) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - start, done.stdout


def _demo_corpus(path: Path, rows: int | None, env: dict[str, str] | None) -> None:
    """Write the bundled demo corpus to path (its first rows only, when given)."""
    subprocess.run([*_cli(), "demo-corpus", str(path)], check=True, capture_output=True, env=env)
    if rows is not None:
        import pyarrow.parquet as pq

        pq.write_table(pq.read_table(path).slice(0, rows), path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=None, help="[default: build/demo_corpus.parquet]")
    parser.add_argument("--index-dir", type=Path, default=None, help="[default: build/one_shot_timing]")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default=None, help="model id or folder for both indexes [default: the default]")
    parser.add_argument("--out", "--json-out", dest="out", type=Path, default=None, help=f"[default: {RESULTS}]")
    parser.add_argument(
        "--smoke", action="store_true", help=f"the demo corpus's first {SMOKE_ROWS} rows, one round, a temp folder"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="one-shot-timing-") as tmp:
        env = None
        if args.smoke:
            args.repeats = 1
            args.index_dir = args.index_dir or Path(tmp) / "indexes"
            env = {**os.environ, "CONDSEARCH_CACHE_DIR": str(Path(tmp) / "cache")}
            if args.corpus is None:
                args.corpus = Path(tmp) / "demo_corpus.parquet"
                _demo_corpus(args.corpus, SMOKE_ROWS, env)
        else:
            args.out = args.out or RESULTS
        return measure(args, env)


def measure(args: argparse.Namespace, env: dict[str, str] | None) -> int:
    corpus: Path = args.corpus or Path("build/demo_corpus.parquet")
    index_dir: Path = args.index_dir or Path("build/one_shot_timing")
    if not corpus.is_file():
        corpus.parent.mkdir(parents=True, exist_ok=True)
        _demo_corpus(corpus, None, env)
    model = ["--model", args.model] if args.model else []
    csr, case = index_dir / "csr", index_dir / "case"
    _build(corpus, csr, "csr", model, env)
    _build(corpus, case, "case", model, env)
    query = [*_cli(), "query", QUERY, "-c", CONDITION, "-k", "3", "--json"]
    runs = {
        "csr_torch": [*query, "--index-dir", str(csr), "--quantize", "none"],
        "csr_one_shot": [*query, "--index-dir", str(csr)],
        "case": [*query, "--index-dir", str(case)],
    }
    for argv in runs.values():  # warm: the first query of each caches what the next needs (page cache, exports)
        _time(argv, env)
    load_before = _loadavg()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    answers: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for name, argv in runs.items():
            took, out = _time(argv, env)
            seconds[name].append(round(took, 3))
            answers[name] = [json.dumps([r["id"] for r in json.loads(line)["results"]]) for line in out.splitlines()]
    load_after = _loadavg()
    from benchmarks._lib.common import run_info

    config = {"query": QUERY, "condition": CONDITION, "k": 3, "repeats": args.repeats, "corpus": str(corpus)}
    result = {
        "config": {**config, "model": args.model, "smoke": args.smoke} if args.smoke or args.model else config,
        "median_seconds": {name: statistics.median(s) for name, s in seconds.items()},
        "seconds": seconds,
        "same_ids_torch_and_one_shot": answers["csr_torch"] == answers["csr_one_shot"],
        "load_average": {"before": load_before, "after": load_after},
        "run": run_info(),
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_seconds", "same_ids_torch_and_one_shot", "load_average")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
