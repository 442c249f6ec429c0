"""Removing indexes while clients query (issue 59): `condsearch rm` and ``DELETE /indexes/...`` under load.

The demo corpus (or --rows synthetic captions) is indexed with the default model under two conditions
(corpus ``demo``) and, as a second corpus (``other``), under one. `condsearch serve --no-build` runs in
its own process on a free loopback port; --clients threads query it over HTTP in a loop, each asking the
three indexes in turn. After --phase-s seconds ("before"), one index of ``demo`` is removed through
``DELETE /indexes/demo?condition=...``, then the rest of ``demo`` by `condsearch rm demo --yes` from the
CLI side ("during", --phase-s seconds from the first removal), and the clients go on ("after", --phase-s
seconds more). Reported per phase: queries, failures (anything but a 200, or a one-line 404 for an index
removed: a 5xx, a malformed answer, a connection error), statuses, and the p50/p95 latency of the
answered queries, those to ``other`` (never removed) apart; the removals' own times; the bytes of the
store and of the removed indexes before and after (the space returned).

    nice -n 10 python -m benchmarks.systems.rm_under_load --smoke \\
        --json-out benchmarks/systems/results/rm_under_load.json

``--smoke``: the demo corpus (309 rows), 2-second phases.
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
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._lib.common import log, run_info, write_json
from benchmarks._lib.server import serving
from benchmarks.systems.flood import disk_bytes
from benchmarks.systems.serve_builds import percentiles, write_corpus

COLOUR, SPORT, PLACE = "the color of the clothing", "the sport being played", "where the scene takes place"
#: (corpus, condition) the clients ask in turn; the first two are removed, the last stays
ASKED = [("demo", COLOUR), ("demo", SPORT), ("other", PLACE)]
QUERIES = ["a girl in a red dress plays tennis", "two men on a beach", "a dog runs in the park"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=0, help="Synthetic rows instead of the demo corpus [default: demo].")
    p.add_argument("--clients", type=int, default=8, help="Client threads [default: %(default)s].")
    p.add_argument("--phase-s", type=float, default=5.0, help="Seconds of each phase [default: %(default)s].")
    p.add_argument("--model", default=None, help="Model id or folder [default: condsearch's default].")
    p.add_argument("--smoke", action="store_true", help="The demo corpus, 2-second phases.")
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.phase_s = 0, 2.0
    return args


def corpus_texts(rows: int) -> tuple[list[str], str]:
    """Return the texts to index and what they are."""
    if rows <= 0:
        from condsearch.corpus.demo import read_demo_rows

        _, texts = read_demo_rows()
        return texts, f"demo corpus ({len(texts)} rows)"
    colours = "red blue green pink black white orange yellow".split()
    sports = "tennis golf soccer swimming basketball running".split()
    places = "on a beach|in a park|in a gym|on a street|in a stadium".split("|")
    texts = [
        f"a player in {colours[i % 8]} plays {sports[(i // 8) % 6]} {places[(i // 48) % 5]}, #{i}" for i in range(rows)
    ]
    return texts, f"{rows} synthetic captions"


def cli(*args: str, env: dict[str, str]) -> float:
    """Run `condsearch ARGS` in its own process; return its seconds."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "condsearch", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"condsearch {args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - start


class Clients:
    """Threads asking ASKED in turn until stopped; each query's (sent, seconds, corpus, condition, status, failure)."""

    def __init__(self, url: str, n: int) -> None:
        self.url, self.stop = url, threading.Event()
        self.records: list[tuple[float, float, str, str, int, str | None]] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def __enter__(self) -> Clients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(60)

    def _run(self, which: int) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=60) as http:
            turn = which
            while not self.stop.is_set():
                corpus, condition = ASKED[turn % len(ASKED)]
                body = {"queries": [QUERIES[turn % len(QUERIES)]], "condition": condition, "corpus": corpus, "k": 10}
                turn += 1
                sent = time.monotonic()
                status, failure = 0, None
                try:
                    response = http.post("/query", json=body)
                    status = response.status_code
                    if status == 200:
                        if not response.json()["results"][0]["results"]:
                            failure = "200 without results"
                    elif status == 404:
                        error = response.json().get("error")
                        if not isinstance(error, str) or "\n" in error or (corpus, condition) == ASKED[-1]:
                            failure = f"404: {error!r}"
                    else:
                        failure = f"{status}: {response.text[:200]}"
                except Exception as exc:  # noqa: BLE001 - a connection error is a failed query
                    failure = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self.records.append((sent, time.monotonic() - sent, corpus, condition, status, failure))


def phase(records: list[tuple[float, float, str, str, int, str | None]], start: float, end: float) -> dict[str, Any]:
    mine = [r for r in records if start <= r[0] < end]
    answered = [r[1] for r in mine if r[4] == 200 and r[5] is None]
    kept = [r[1] for r in mine if r[4] == 200 and r[5] is None and (r[2], r[3]) == ASKED[-1]]
    failures = [r[5] for r in mine if r[5] is not None]
    return {
        "seconds": round(end - start, 2),
        "queries": len(mine),
        "queries_per_s": round(len(mine) / (end - start), 1) if end > start else None,
        "failures": len(failures),
        "first_failures": failures[:3],
        "statuses": {str(k): v for k, v in sorted(Counter(r[4] for r in mine).items())},
        "answered": percentiles(answered),
        "kept_index_answered": percentiles(kept),
    }


@contextmanager
def served(store: Path, env: dict[str, str]) -> Iterator[str]:
    """Run `condsearch serve --no-build` on store in its own process (keyless, loopback); yield its URL.

    --no-build: a query for a removed condition of a router corpus would otherwise build it again on demand.
    """
    with serving(["--no-build", "--index-dir", str(store)], env, timeout=300) as (url, _):
        yield url


@contextmanager
def store_of(texts: list[str], model: str | None, env: dict[str, str]) -> Iterator[tuple[Path, dict[str, float]]]:
    with tempfile.TemporaryDirectory(prefix="rm-under-load-") as tmp:
        root, store = Path(tmp), Path(tmp) / "indexes"
        demo = write_corpus(texts, root / "demo.parquet")
        shutil.copy(demo, root / "other.parquet")
        flags = ["--index-dir", str(store), *(["--model", model] if model else [])]
        times = {"index_demo_s": cli("index", str(demo), "-c", COLOUR, "-c", SPORT, *flags, env=env)}
        times["index_other_s"] = cli("index", str(root / "other.parquet"), "-c", PLACE, *flags, env=env)
        yield store, times


def run(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from condsearch.store.folder import IndexStore
    from condsearch.store.manifest import Manifest

    texts, what = corpus_texts(args.rows)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    with store_of(texts, args.model, env) as (store, times):
        removed = [
            (store / n).resolve()
            for n, m in IndexStore(store).manifests()
            if isinstance(m, Manifest) and m.corpus_name == "demo"
        ]
        removed_bytes = sum(disk_bytes(p) for p in removed)
        bytes_before = disk_bytes(store)
        log(
            "rm_under_load",
            f"{what}: store of {bytes_before / 2**20:.1f} MiB, {len(removed)} indexes to remove; serving",
        )
        with served(store, env) as url:
            # the server loads each index on its first query: one of each first, outside the timings
            for corpus, condition in ASKED:
                httpx.post(
                    f"{url}/query", json={"queries": ["x"], "condition": condition, "corpus": corpus}, timeout=600
                )
            with Clients(url, args.clients) as clients:
                t0 = time.monotonic()
                time.sleep(args.phase_s)
                t1 = time.monotonic()
                deleted = httpx.delete(f"{url}/indexes/demo", params={"condition": SPORT}, timeout=60)
                times["delete_route_s"] = round(time.monotonic() - t1, 3)
                if deleted.status_code != 200:
                    raise SystemExit(f"DELETE answered {deleted.status_code}: {deleted.text}")
                times["rm_cli_s"] = round(cli("rm", "demo", "--yes", "--index-dir", str(store), env=env), 3)
                time.sleep(max(0.0, args.phase_s - (time.monotonic() - t1)))
                t2 = time.monotonic()
                time.sleep(args.phase_s)
                t3 = time.monotonic()
            records = list(clients.records)
        bytes_after = disk_bytes(store)
        left = [p.name for p in removed if p.exists()]
    phases = {"before": phase(records, t0, t1), "during": phase(records, t1, t2), "after": phase(records, t2, t3)}
    return {
        "benchmark": "rm_under_load",
        "corpus": what,
        "model": args.model or "default",
        "clients": args.clients,
        "phase_s": args.phase_s,
        "indexes": [f"{c} / {k}" for c, k in ASKED],
        "removed": ["demo / " + SPORT + " (DELETE /indexes/demo?condition=)", "demo / " + COLOUR + " (condsearch rm)"],
        "times": {k: round(v, 3) for k, v in times.items()},
        "phases": phases,
        "failures": sum(p["failures"] for p in phases.values()),
        "store_bytes_before": bytes_before,
        "store_bytes_after": bytes_after,
        "bytes_freed": bytes_before - bytes_after,
        "removed_index_bytes": removed_bytes,
        "removed_versions_left": left,
        "run": run_info(),
        "config": {"smoke": args.smoke, "rows": args.rows},
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    write_json(result, args.json_out)
    freed = result["bytes_freed"] >= result["removed_index_bytes"] > 0 and not result["removed_versions_left"]
    return 0 if result["failures"] == 0 and freed else 1


if __name__ == "__main__":
    sys.exit(main())
