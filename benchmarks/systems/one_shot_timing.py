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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

QUERY = "A girl in an orange dress plays tennis"
CONDITION = "the sport being played"


def _cli() -> list[str]:
    return [sys.executable, "-m", "condsearch"]


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _build(corpus: Path, folder: Path, mode: str) -> None:
    if folder.is_dir() and any(folder.iterdir()):
        return
    argv = [*_cli(), "index", str(corpus), "-c", CONDITION, "--mode", mode, "--index-dir", str(folder)]
    subprocess.run(argv, check=True, capture_output=True)


def _time(argv: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return time.perf_counter() - start, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path("build/demo_corpus.parquet"))
    parser.add_argument("--index-dir", type=Path, default=Path("build/one_shot_timing"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/systems/results/one_shot_csr.json"))
    args = parser.parse_args()
    if not args.corpus.is_file():
        subprocess.run([*_cli(), "demo-corpus", "-o", str(args.corpus)], check=True, capture_output=True)
    csr, case = args.index_dir / "csr", args.index_dir / "case"
    _build(args.corpus, csr, "csr")
    _build(args.corpus, case, "case")
    query = [*_cli(), "query", QUERY, "-c", CONDITION, "-k", "3", "--json"]
    runs = {
        "csr_torch": [*query, "--index-dir", str(csr), "--quantize", "none"],
        "csr_one_shot": [*query, "--index-dir", str(csr)],
        "case": [*query, "--index-dir", str(case)],
    }
    for argv in runs.values():  # warm: the first query of each caches what the next needs (page cache, exports)
        _time(argv)
    load_before = _loadavg()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    answers: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for name, argv in runs.items():
            took, out = _time(argv)
            seconds[name].append(round(took, 3))
            answers[name] = [json.dumps([r["id"] for r in json.loads(line)["results"]]) for line in out.splitlines()]
    load_after = _loadavg()
    from benchmarks._lib.common import run_info

    result = {
        "config": {"query": QUERY, "condition": CONDITION, "k": 3, "repeats": args.repeats, "corpus": str(args.corpus)},
        "median_seconds": {name: statistics.median(s) for name, s in seconds.items()},
        "seconds": seconds,
        "same_ids_torch_and_one_shot": answers["csr_torch"] == answers["csr_one_shot"],
        "load_average": {"before": load_before, "after": load_after},
        "run": run_info(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_seconds", "same_ids_torch_and_one_shot", "load_average")}))


if __name__ == "__main__":
    main()
