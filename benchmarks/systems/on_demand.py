"""Conditions on demand (issue 41): seconds for a router corpus to answer a condition nobody indexed.

A corpus of --rows distinct C-STS sentences (train then dev, in file order) is indexed with
`condsearch index --mode csr` under one condition, which caches every sentence's states. Then, each
under a condition never indexed before, timed as a user meets it:

- ``cli_warm``: `condsearch query Q -c C` (a fresh process: Python, torch and the model load, the
  index is built on demand, then answered);
- ``api_warm``: a fresh process running ``condsearch.open(DIR).search(Q, condition=C)`` (open and
  search timed inside it, and the process's wall time);
- ``index_new_condition``: `condsearch index CORPUS -c C` with the same cache, what one paid for a
  new condition before (the same routing work, plus reading the corpus file);
- ``cli_cold`` and ``api_cold``: as the warm ones, with the state cache (``csr-states``) cleared first,
  so the states are encoded again (the notice is checked).

It checks that an index built on demand is the one `condsearch index -c` builds: the same vectors and
the same `query --json` answers, both asked at the end from one state cache. The answer the building
run printed is compared too: the query's own states were computed by torch then, and are cached (int8)
from onnxruntime's after the cache is cleared, so its scores may differ in the last places. Every run
uses its own cache folder (CONDSEARCH_CACHE_DIR), so clearing it touches nothing else. ``--smoke`` runs
the same on the tiny stand-in model, 40 rows, each command in this process (the tests run it; a fresh
process each would take most of a minute).

    python -m benchmarks.systems.on_demand --json-out benchmarks/systems/results/on_demand.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._lib.common import log, read_texts, run_info, write_json

#: the C-STS folder beside the repository (../shared/data), as every benchmark reads it
CSTS = Path(__file__).resolve().parents[3] / "shared" / "data" / "csts-reannotated"
QUERY = "Two dogs are running through the snow."
#: the condition indexed first, then one never indexed before per measurement
FIRST = "the main activity"
NEW = {
    "cli_warm": "the number of people",
    "api_warm": "the location",
    "index_new_condition": "the weather",
    "cli_cold": "the animals",
    "api_cold": "the colors of the clothing",
}
#: the repository root, where the API script's subprocess imports this module from
REPO_ROOT = Path(__file__).resolve().parents[2]
_API = """
import json, sys, time
start = time.perf_counter()
from benchmarks.systems.on_demand import api_search
print(json.dumps(api_search(*sys.argv[1:], start=start)))
"""


def api_search(store: str, query: str, condition: str, *, start: float | None = None) -> dict[str, object]:
    """Search store under condition through the Python API (which builds it); return the seconds and the ids."""
    start = time.perf_counter() if start is None else start
    import condsearch

    hits = condsearch.open(store).search(query, condition=condition, k=10)
    return {"seconds": time.perf_counter() - start, "ids": [h.id for h in hits]}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000, help="Corpus rows (distinct C-STS sentences).")
    p.add_argument("--csts", type=Path, default=CSTS, help="C-STS folder (train.csv, dev.csv) [default: %(default)s].")
    p.add_argument("--model", default=None, help="Model [default: the embedded MiniLM].")
    p.add_argument("--router", default="default", help="Router: default, none or a folder.")
    p.add_argument("--smoke", action="store_true", help="Tiny run: 40 synthetic rows (give --model a tiny BERT).")
    p.add_argument("--work-dir", type=Path, default=None, help="Where the corpus, stores and cache go [a temp dir].")
    p.add_argument("--json-out", type=Path, default=None)
    return p.parse_args(argv)


def corpus_texts(rows: int, smoke: bool, csts: Path = CSTS) -> list[str]:
    """Return rows distinct texts: C-STS sentences from the folder csts, or for --smoke made-up captions."""
    if smoke:
        words = "girl dress red blue tennis court dog beach man park golf ball shirt horse".split()
        return [" ".join(words[(i * k) % len(words)] for k in range(1, 3 + i % 5)) + f" {i}" for i in range(rows)]
    files = [csts / "train.csv", csts / "dev.csv"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"no C-STS file {missing[0]} (give --csts the folder holding train.csv and dev.csv)")
    texts = read_texts(files)
    if len(texts) < rows:
        raise SystemExit(f"only {len(texts)} distinct C-STS sentences, fewer than --rows {rows}")
    return texts[:rows]


class Bench:
    """The commands of one run, each in a fresh process, against one cache folder."""

    def __init__(self, work: Path, corpus: Path, model: list[str], router: str, *, in_process: bool) -> None:
        self.work, self.corpus, self.model, self.router = work, corpus, model, router
        self.cache = work / "cache"
        self.env = {"CONDSEARCH_CACHE_DIR": str(self.cache), "TOKENIZERS_PARALLELISM": "false"}
        self.in_process = in_process

    def run(self, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
        start = time.perf_counter()
        if self.in_process:
            done = self._here(*args)
        else:
            env = {**os.environ, **self.env}
            done = subprocess.run(
                [sys.executable, *args], capture_output=True, text=True, env=env, check=False, cwd=REPO_ROOT
            )  # the repository root: `python -c` imports benchmarks.systems.on_demand from there
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(args[:4])}…: exit {done.returncode}\n{done.stderr[-2000:]}")
        return seconds, done

    def _here(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``-m condsearch …`` or the API script in this process, as the subprocess would."""
        from condsearch.cli import main as cli

        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        out, err, code = io.StringIO(), io.StringIO(), 0
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                if args[:2] == ("-m", "condsearch"):
                    try:
                        cli.main(list(args[2:]), prog_name="condsearch", standalone_mode=False)
                    except Exception as exc:  # noqa: BLE001 - reported as the subprocess would
                        print(exc, file=sys.stderr)
                        code = 1
                else:
                    print(json.dumps(api_search(*args[2:])))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())

    def index(self, store: Path, *conditions: str) -> float:
        cs = [x for c in conditions for x in ("-c", c)]
        flags = ["--mode", "csr", "--router", self.router, *self.model, "--index-dir", str(store)]
        return self.run("-m", "condsearch", "index", str(self.corpus), *cs, *flags)[0]

    def query(self, store: Path, condition: str) -> tuple[float, list[dict], str]:
        seconds, done = self.run(
            "-m", "condsearch", "query", QUERY, "-c", condition, "-k", "10", "--json", "--index-dir", str(store)
        )
        return seconds, [json.loads(line) for line in done.stdout.splitlines()], done.stderr

    def api(self, store: Path, condition: str) -> tuple[float, dict]:
        seconds, done = self.run("-c", _API, str(store), QUERY, condition)
        return seconds, json.loads(done.stdout.splitlines()[-1])

    def clear_states(self) -> None:
        shutil.rmtree(self.cache / "csr-states", ignore_errors=True)


def vectors_of(store: Path, condition: str) -> np.ndarray:
    from condsearch.store.folder import IndexStore

    s = IndexStore(store)
    return np.load(store / s.find(condition) / "vectors.npy")


def measure(args: argparse.Namespace, work: Path) -> dict[str, object]:
    texts = corpus_texts(40 if args.smoke else args.rows, args.smoke, args.csts)
    corpus = work / "corpus.parquet"
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), corpus)
    model = ["--model", args.model] if args.model else []
    bench = Bench(work, corpus, model, args.router, in_process=args.smoke)
    store, check = work / "indexes", work / "indexed"
    load = {"before": os.getloadavg()}
    log("on_demand", f"{len(texts)} rows: indexing {FIRST!r} (states cached)")
    seconds: dict[str, float] = {"index_first": bench.index(store, FIRST)}
    log("on_demand", "query under a new condition, warm cache")
    seconds["cli_warm"], cli_built, stderr = bench.query(store, NEW["cli_warm"])
    assert "not in the cache" not in stderr, stderr
    seconds["api_warm"], api = bench.api(store, NEW["api_warm"])
    seconds["api_warm_open_and_search"] = api["seconds"]
    log("on_demand", "index of a new condition, warm cache")
    seconds["index_new_condition"] = bench.index(store, NEW["index_new_condition"])
    log("on_demand", "the same, the state cache cleared")
    bench.clear_states()
    seconds["cli_cold"], _, stderr = bench.query(store, NEW["cli_cold"])
    notice = "are not in the cache" in stderr and "encoding them again" in stderr
    bench.clear_states()
    seconds["api_cold"], api_cold = bench.api(store, NEW["api_cold"])
    seconds["api_cold_open_and_search"] = api_cold["seconds"]
    load["after"] = os.getloadavg()
    log("on_demand", "checking: the on-demand index is the one `index -c` builds")
    bench.index(check, FIRST, NEW["cli_warm"], NEW["api_warm"])
    same = {
        c: {
            "vectors_equal": bool(np.array_equal(vectors_of(store, c), vectors_of(check, c))),
            "max_abs_diff": float(np.abs(vectors_of(store, c) - vectors_of(check, c)).max()),
        }
        for c in (NEW["cli_warm"], NEW["api_warm"])
    }
    # both stores answered now, from one state cache: the query's own states, cached by its first encoding (torch
    # in `query`, the builder's onnxruntime export in the API), are then the same for both
    cli_on_demand, cli_indexed = bench.query(store, NEW["cli_warm"])[1], bench.query(check, NEW["cli_warm"])[1]
    api_on_demand, api_indexed = bench.api(store, NEW["api_warm"])[1], bench.api(check, NEW["api_warm"])[1]
    return {
        "config": {
            "rows": len(texts),
            "data": "synthetic" if args.smoke else "C-STS train+dev distinct sentences, file order",
            "model": args.model or "default",
            "router": args.router,
            "query": QUERY,
            "first_condition": FIRST,
            "new_conditions": NEW,
            "smoke": args.smoke,
        },
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "cold_notice_printed": notice,
        "equal_to_index": {
            "vectors": same,
            "cli_answers_equal": cli_on_demand == cli_indexed,
            "api_ids_equal": api_on_demand["ids"] == api_indexed["ids"],
            "build_run_ids_equal": [r["id"] for r in cli_built[0]["results"]]
            == [r["id"] for r in cli_indexed[0]["results"]],
            "build_run_max_score_diff": max(
                abs(a["score"] - b["score"])
                for a, b in zip(cli_built[0]["results"], cli_indexed[0]["results"], strict=True)
            ),
        },
        "load_average": {k: [round(x, 2) for x in v] for k, v in load.items()},
        "run": run_info("cpu"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        result = measure(args, args.work_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="on-demand-") as tmp:
            result = measure(args, Path(tmp))
    write_json(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
