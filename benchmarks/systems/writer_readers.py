"""`condsearch index` under one-shot readers (issue 58, item 12): what slows the writer, and by how much.

A reader corpus (the demo captions) is indexed under one condition; --readers loops then run
`condsearch query` against that store, a fresh process each time, while `condsearch index` writes
--rows rows (demo captions, numbered so that each is new) under another condition into the same store,
in the default mode. Readers take no lock (only writers of one index do), so what they can take from
the writer is the CPU. Each --policies entry runs the writer with that ``OMP_WAIT_POLICY``
(``default``: what the CLI sets, PASSIVE, unless the environment names one; ``active``: OpenMP's
spinning, as before issue 58), without readers and with them, interleaved --repeats times; the state
cache is emptied before each write, so each encodes every sentence. Reported per run: the writer's
seconds, CPU seconds and rows/s, the readers' answers and their p50/p95 seconds, the load average.

    python -m benchmarks.systems.writer_readers --rows 3000 --readers 2 \
        --json-out benchmarks/systems/results/writer_readers.json

``--smoke`` runs 20 rows, one reader and the default policy on a tiny model (--model, a tiny BERT, with
--router none).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks._lib.common import log, write_json
from benchmarks.systems.serve_builds import percentiles, uptime, write_corpus

READ_CONDITION = "color of the dress"
WRITE_CONDITION = "the sport being played"
QUERY = "a girl in an orange dress serves the ball"
#: OMP_WAIT_POLICY per --policies name (None: the environment without it, so the CLI's default holds)
POLICIES = {"default": None, "active": "ACTIVE", "passive": "PASSIVE"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=3000, help="Rows the writer indexes [default: %(default)s].")
    p.add_argument("--readers", type=int, default=2, help="Loops of one-shot `condsearch query` [%(default)s].")
    p.add_argument("--policies", default="default,active", help="OMP_WAIT_POLICY runs: default, active, passive.")
    p.add_argument("--repeats", type=int, default=1, help="Rounds of every run, interleaved [default: 1].")
    p.add_argument("--threads", type=int, default=None, help="The writer's --threads [its default: every core].")
    p.add_argument("--timeout-s", type=float, default=900.0, help="Seconds a write may take before it is stopped.")
    p.add_argument("--model", default=None, help="Model [default: the embedded MiniLM].")
    p.add_argument("--router", default=None, help="--router of both indexes [default: index's].")
    p.add_argument("--smoke", action="store_true", help="40 rows, one reader, one round (give --model a tiny BERT).")
    p.add_argument("--work-dir", type=Path, default=None, help="Where the corpora, store and cache go [a temp dir].")
    p.add_argument("--json-out", type=Path, default=None)
    return p.parse_args(argv)


def _cli(*args: str, env: dict[str, str], timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "condsearch", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _model_flags(args: argparse.Namespace) -> list[str]:
    return [*(["--model", args.model] if args.model else []), *(["--router", args.router] if args.router else [])]


def _texts(n: int) -> list[str]:
    from condsearch.corpus.demo import read_demo_rows

    _, demo = read_demo_rows()
    return [f"{demo[i % len(demo)]} (item {i})" for i in range(n)]


class Readers:
    """--readers loops of one-shot queries of the reader index, each answer timed, until stopped."""

    def __init__(self, n: int, store: Path, env: dict[str, str]) -> None:
        self.seconds: list[float] = []
        self.failed = 0
        self._stop = threading.Event()
        argv = ["query", QUERY, "-c", READ_CONDITION, "-k", "3", "--index-dir", str(store)]
        self._threads = [threading.Thread(target=self._loop, args=(argv, env), daemon=True) for _ in range(n)]

    def _loop(self, argv: list[str], env: dict[str, str]) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            done = _cli(*argv, env=env, timeout=300)
            if done.returncode == 0:
                self.seconds.append(time.perf_counter() - start)
            else:
                self.failed += 1

    def __enter__(self) -> Readers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def _write(corpus: Path, store: Path, env: dict[str, str], args: argparse.Namespace) -> dict[str, object]:
    """Index corpus under WRITE_CONDITION from an empty state cache; return its seconds, CPU seconds and rows/s."""
    shutil.rmtree(Path(env["CONDSEARCH_CACHE_DIR"]) / "csr-states", ignore_errors=True)
    threads = ["--threads", str(args.threads)] if args.threads else []
    argv = ["index", str(corpus), "-c", WRITE_CONDITION, "--full", "--index-dir", str(store), *threads]
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "condsearch", *argv, *_model_flags(args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    timer = threading.Timer(args.timeout_s, proc.kill)
    timer.start()
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)  # the writer's own CPU time, not the readers'
    timer.cancel()
    seconds = time.perf_counter() - start
    ok = os.waitstatus_to_exitcode(status) == 0
    note = (stderr.strip().splitlines() or [""])[-1] if ok or seconds < args.timeout_s else "stopped at the timeout"
    return {
        "ok": ok,
        "seconds": round(seconds, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "rows_per_s": round(args.rows / seconds, 1) if ok else None,
        "note": note,
    }


def measure(args: argparse.Namespace, work: Path) -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    base["CONDSEARCH_CACHE_DIR"] = str(work / "cache")
    store = work / "indexes"
    reader_corpus = write_corpus(_texts(40 if args.smoke else 308), work / "readers.parquet")
    corpus = write_corpus(_texts(args.rows), work / "rows.parquet")
    built = _cli(
        "index", str(reader_corpus), "-c", READ_CONDITION, "--index-dir", str(store), *_model_flags(args), env=base
    )
    if built.returncode != 0:
        raise SystemExit(f"indexing the readers' corpus failed: {built.stderr.strip()[-500:]}")
    _cli("query", QUERY, "-c", READ_CONDITION, "--index-dir", str(store), env=base)  # caches the code and export
    runs = []
    for round_ in range(args.repeats):
        for name in args.policies.split(","):
            env = dict(base) if POLICIES[name] is None else {**base, "OMP_WAIT_POLICY": POLICIES[name]}
            for readers in (0, args.readers):
                log("writer_readers", f"round {round_ + 1}: {args.rows} rows, {name} waits, {readers} reader loop(s)")
                load = os.getloadavg()[0]
                with Readers(readers, store, base) as reading:
                    written = _write(corpus, store, env, args)
                run = {"round": round_ + 1, "wait_policy": name, "readers": readers, "load_before": round(load, 2)}
                reads = {**percentiles(reading.seconds), "failed": reading.failed}
                runs.append({**run, **written, "reads": reads})
                log("writer_readers", f"  {written['seconds']} s ({written['note']}); reads {reads}")
    return {
        "rows": args.rows,
        "readers": args.readers,
        "threads": args.threads,
        "cores": len(os.sched_getaffinity(0)),
        "uptime_after": uptime(),
        "runs": runs,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.rows, args.readers, args.repeats, args.policies = 20, 1, 1, "default"
    with tempfile.TemporaryDirectory(prefix="writer-readers-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = measure(args, work)
    write_json(result, args.json_out)
    return 0 if all(r["ok"] for r in result["runs"]) else 1  # type: ignore[index, union-attr]


if __name__ == "__main__":
    raise SystemExit(main())
