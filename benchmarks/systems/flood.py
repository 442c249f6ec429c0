"""A keyless flood of `condsearch serve` (issue 58): what strangers' requests leave on disk and in memory.

A router corpus (--mode csr, the shipped router) of --rows distinct C-STS sentences is indexed under one
condition and served by `condsearch serve` in its own process, keyless on loopback, with its defaults
(so builds on demand are open, up to --max-on-demand-indexes). Then:

- flood: --requests requests from --flooders clients, each a new condition through ``POST /query`` (a
  build on demand, refused once the cap is reached) or new texts under a new condition through
  ``POST /v1/embeddings``, while one more client (a process of its own, so that its latency is the
  server's and not this process's GIL) asks a known query in a loop. Reported: the bytes of the cache
  folder and the store, and the server's RSS, before, every --every requests and after; the statuses;
  the known query's p50/p95 before and during the flood.
- past the cap: new conditions one at a time until the server refuses one for its cap (507), then
  --past-cap more requests under new conditions, as above.
- soak (--soak-s): --clients clients for that long, each mixing known queries, new conditions,
  embeddings of new texts and (one client) deletions of indexes built on demand. Reported: good
  requests (a known query, an embedding) that failed, which must be 0; the refusals by status; RSS at
  the start, the end and its peak.

    python -m benchmarks.systems.flood --soak-s 60 --json-out benchmarks/systems/results/flood.json
    # the issue's store of 3,000 indexes, every new condition refused (--cap 0): what refusals cost others
    python -m benchmarks.systems.flood --pad 3000 --cap 0 --json-out benchmarks/systems/results/flood_3000.json

``--smoke`` runs the same on a tiny model (--model, a tiny BERT with --router none), 40 rows, a few
requests, a cap of 8 and a 3-second soak of 4 clients (the tests run it).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._lib.common import log, run_info, write_json
from benchmarks._lib.server import serving
from benchmarks.systems.on_demand import CSTS, FIRST, QUERY, corpus_texts
from benchmarks.systems.serve_builds import index, percentiles, uptime, write_corpus

#: statuses a request under a new condition may get without anything being wrong: built (200, 202), or
#: refused by a cap (429 the client's pending builds, 503 the server's, 507 the indexes built on demand)
REFUSALS = {429, 503, 507}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=300, help="Rows of the served corpus [default: %(default)s].")
    p.add_argument("--csts", type=Path, default=CSTS, help="C-STS folder (train.csv, dev.csv) [default: %(default)s].")
    p.add_argument("--requests", type=int, default=300, help="Requests of the flood [default: %(default)s].")
    p.add_argument(
        "--past-cap", type=int, default=200, help="Requests under new conditions once the flood is over [200]."
    )
    p.add_argument(
        "--pad", type=int, default=0, help="Indexes of made-up conditions added to the store first (the issue: 3000)."
    )
    p.add_argument("--cap", type=int, default=None, help="The server's --max-on-demand-indexes [its default].")
    p.add_argument("--flooders", type=int, default=4, help="Clients sending the flood [default: %(default)s].")
    p.add_argument("--texts", type=int, default=32, help="New texts per embeddings request [default: %(default)s].")
    p.add_argument("--every", type=int, default=50, help="Requests between two readings of disk and RSS.")
    p.add_argument("--soak-s", type=float, default=0.0, help="Seconds of the soak after the flood (0: none).")
    p.add_argument("--clients", type=int, default=32, help="Clients of the soak [default: %(default)s].")
    p.add_argument("--model", default=None, help="Model [default: the embedded MiniLM].")
    p.add_argument("--router", default="default", help="Router: default, none or a folder.")
    p.add_argument("--smoke", action="store_true", help="Tiny run: 40 made-up rows (give --model a tiny BERT).")
    p.add_argument("--work-dir", type=Path, default=None, help="Where the corpus, store and cache go [a temp dir].")
    p.add_argument("--json-out", type=Path, default=None)
    return p.parse_args(argv)


# ---------------------------------------------------------------- the server and what it holds


def disk_bytes(folder: Path) -> int:
    """Return the bytes of every file under folder (links not followed, a hard-linked file once)."""
    sizes: dict[tuple[int, int], int] = {}
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue  # deleted meanwhile
            sizes[(st.st_dev, st.st_ino)] = st.st_size
    return sum(sizes.values())


def pad_store(store: Path, n: int) -> None:
    """Add n indexes of the corpus under made-up conditions, sharing the first index's files (hard links): a
    store of thousands of indexes, as the issue's, on little disk."""
    import json

    from condsearch.store.folder import MANIFEST, VERSIONS, IndexStore, index_name

    first = IndexStore(store).find(FIRST)
    manifest = json.loads((store / first / MANIFEST).read_text())
    for i in range(n):
        condition = f"padding aspect {i:05d}"
        name = index_name(manifest["corpus_name"], condition)
        version = store / VERSIONS / name / "1-padding"
        version.mkdir(parents=True)
        for data in (store / first).iterdir():
            if data.name != MANIFEST:
                os.link(data, version / data.name)
        (version / MANIFEST).write_text(json.dumps({**manifest, "condition": condition}))
        (store / name).symlink_to(os.path.relpath(version, store))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


@contextmanager
def served(store: Path, cache: Path, cap: int | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run `condsearch serve` on store in its own process (keyless, loopback, defaults but ``cap``, its
    --max-on-demand-indexes); yield its URL and process."""
    env = {**os.environ, "CONDSEARCH_CACHE_DIR": str(cache), "TOKENIZERS_PARALLELISM": "false"}
    args = ["--index-dir", str(store)] + ([] if cap is None else ["--max-on-demand-indexes", str(cap)])
    with serving(args, env) as (url, server):
        yield url, server


def reading(label: str, done: int, store: Path, cache: Path, pid: int) -> dict[str, Any]:
    return {
        "at": label,
        "requests_done": done,
        "cache_mb": round(disk_bytes(cache) / 2**20, 2),
        "store_mb": round(disk_bytes(store) / 2**20, 2),
        "indexes": len([p for p in store.iterdir() if not p.name.startswith(".")]),
        "rss_mb": rss_mb(pid),
    }


# ---------------------------------------------------------------- requests


def _texts(rng: random.Random, n: int) -> list[str]:
    words = "red blue green dress shirt dog cat ball park beach street man woman child runs sits plays".split()
    return [" ".join(rng.choice(words) for _ in range(6)) + f" #{rng.randrange(10**9)}" for _ in range(n)]


def new_condition(http: Any, i: int) -> int:
    return int(http.post("/query", json={"query": QUERY, "condition": f"flood condition {i}", "k": 5}).status_code)


def new_embeddings(http: Any, i: int, texts: int) -> int:
    body = {"input": _texts(random.Random(i), texts), "condition": f"flood aspect {i}"}
    return int(http.post("/v1/embeddings", json=body).status_code)


def known_query(http: Any) -> tuple[int, float]:
    start = time.perf_counter()
    status = http.post("/query", json={"query": QUERY, "condition": FIRST, "k": 10}).status_code
    return int(status), time.perf_counter() - start


def known_client(url: str, stop: Any, out: Any) -> None:
    """Ask the known query in a loop until stop is set (run in a process of its own); put "ready" once it asks,
    then its latencies and statuses."""
    import httpx

    seconds: list[float] = []
    statuses: Counter[int] = Counter()
    with httpx.Client(base_url=url, timeout=600) as http:
        known_query(http)  # connected and warm
        out.put("ready")
        while not stop.is_set():
            status, took = known_query(http)
            seconds.append(took)
            statuses[status] += 1
    out.put((seconds, dict(statuses)))


# ---------------------------------------------------------------- flood


def flood(
    url: str, pid: int, store: Path, cache: Path, args: argparse.Namespace, *, requests: int, first: int, mixed: bool
) -> dict[str, Any]:
    """Send requests (new conditions, and with ``mixed`` every other one new embeddings) beside a known-query loop;
    return the readings, statuses and the known query's latency. ``first`` numbers the first new condition."""
    import httpx

    with httpx.Client(base_url=url, timeout=600) as http:
        baseline = [known_query(http) for _ in range(10 if args.smoke else 40)]
    readings = [reading("before", 0, store, cache, pid)]
    statuses: Counter[str] = Counter()
    done = 0
    lock = threading.Lock()

    clients = threading.local()  # one client a flooding thread, as a flooding program would keep

    def one(i: int) -> None:
        nonlocal done
        if not hasattr(clients, "http"):
            clients.http = httpx.Client(base_url=url, timeout=600)
        if i % 2 or not mixed:
            kind = f"new condition {new_condition(clients.http, first + i)}"
        else:
            kind = f"embeddings {new_embeddings(clients.http, first + i, args.texts)}"
        with lock:
            statuses[kind] += 1
            done += 1
            if done % args.every == 0:
                readings.append(reading(f"after {done}", done, store, cache, pid))

    # the known client is a process of its own: its latency is the server's, not that of this process's GIL,
    # which the flooding threads hold while they build requests and read answers
    spawn = multiprocessing.get_context("spawn")
    known_stop, known_out = spawn.Event(), spawn.Queue()
    known = spawn.Process(target=known_client, args=(url, known_stop, known_out), daemon=True)
    known.start()
    if known_out.get(timeout=600) != "ready":
        raise SystemExit("the known-query client did not start")
    started = time.perf_counter()
    with ThreadPoolExecutor(args.flooders) as pool:
        list(pool.map(one, range(requests)))
    known_stop.set()
    during, known_statuses = known_out.get(timeout=600)
    known.join()
    statuses.update({f"known {status}": n for status, n in known_statuses.items()})
    seconds = time.perf_counter() - started
    readings.append(reading("after", done, store, cache, pid))
    log("flood", f"{done} requests in {seconds:.0f} s; {dict(statuses)}")
    return {
        "seconds": round(seconds, 1),
        "statuses": dict(sorted(statuses.items())),
        "readings": readings,
        "known_query": {"before": percentiles([s for _, s in baseline]), "during_flood": percentiles(during)},
    }


def fill_to_cap(url: str, most: int = 256) -> int:
    """Ask for new conditions one at a time until the server refuses one for its cap (507); return how many it built."""
    import httpx

    with httpx.Client(base_url=url, timeout=600) as http:
        for n in range(most):
            status = new_condition(http, 10**8 + n)
            if status == 507:
                return n
            if status not in (200, 202):
                raise SystemExit(f"a new condition got {status} on the way to the cap")
    raise SystemExit(f"no cap after {most} new conditions")


# ---------------------------------------------------------------- soak


def _delete_built(store: Path) -> int:
    """Delete one index that was built on demand (as a user would, rm -r), if any; return how many were deleted."""
    from condsearch.store.built_on_demand import MARK
    from condsearch.store.folder import VERSIONS

    marked = sorted(p for p in (store / VERSIONS).glob(f"*{MARK}"))
    for mark in marked:
        name = mark.name.removesuffix(MARK)
        if (store / name).is_symlink():
            (store / name).unlink()
            shutil.rmtree(store / VERSIONS / name, ignore_errors=True)
            mark.unlink(missing_ok=True)
            return 1
    return 0


def soak(url: str, pid: int, store: Path, cache: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Run --clients clients for --soak-s seconds; return failed good requests, refusals and RSS."""
    import httpx

    seconds = 3.0 if args.smoke else args.soak_s
    clients = 4 if args.smoke else args.clients
    tally: Counter[str] = Counter()
    failures: list[str] = []
    rss = [rss_mb(pid)]
    start = reading("start", 0, store, cache, pid)
    stop = threading.Event()
    lock = threading.Lock()

    def good(kind: str, status: int) -> None:
        with lock:
            tally[f"{kind} {status}"] += 1
            if status != 200 and len(failures) < 20:
                failures.append(f"{kind}: {status}")

    def client(c: int) -> None:
        rng = random.Random(c)
        with httpx.Client(base_url=url, timeout=600) as http:
            n = 0
            while not stop.is_set():
                n += 1
                roll = rng.random()
                if c == 0 and roll < 0.2:
                    with lock:
                        tally["deleted"] += _delete_built(store)
                    stop.wait(1.0)
                elif roll < 0.5:
                    good("known", known_query(http)[0])
                elif roll < 0.75:
                    good("embeddings", new_embeddings(http, c * 10**6 + n, 8))
                else:
                    status = new_condition(http, 10**7 + c * 10**5 + n)
                    with lock:
                        tally[f"new condition {status}"] += 1
                        if status not in {200, 202, *REFUSALS} and len(failures) < 20:
                            failures.append(f"new condition: {status}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        rss.append(rss_mb(pid))
    stop.set()
    for t in threads:
        t.join()
    rss.append(rss_mb(pid))
    failed = [f for f in failures if not f.startswith("new condition")]
    good_failed = sum(n for k, n in tally.items() if k.split()[0] in {"known", "embeddings"} and not k.endswith(" 200"))
    log("soak", f"{clients} clients, {seconds:.0f} s: {dict(tally)}; good failed {good_failed}")
    return {
        "clients": clients,
        "seconds": seconds,
        "requests": dict(sorted(tally.items())),
        "good_failed": good_failed,
        "failures": failed,
        "rss_mb": {"start": rss[0], "end": rss[-1], "peak": max(rss)},
        # the peak of each minute (samples a second apart): whether RSS levels off or keeps growing
        "rss_mb_peak_each_minute": [max(rss[i : i + 60]) for i in range(0, len(rss), 60)],
        "readings": [start, reading("end", sum(tally.values()), store, cache, pid)],
    }


# ---------------------------------------------------------------- run


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    cache, store = work / "cache", work / "indexes"
    os.environ["CONDSEARCH_CACHE_DIR"] = str(cache)  # the in-process `index` fills the cache the server reads
    if args.smoke:
        args.rows, args.requests, args.every, args.texts, args.past_cap = 40, 12, 6, 4, 6
        args.pad, args.cap = min(args.pad, 20), 8 if args.cap is None else args.cap
    load: dict[str, Any] = {"before": os.getloadavg(), "uptime_before": uptime()}
    corpus = write_corpus(corpus_texts(args.rows, args.smoke, args.csts), work / "corpus.parquet")
    log("flood", f"{args.rows} rows: indexing {FIRST!r}")
    index(corpus, store, FIRST, args)
    if args.pad:
        log("flood", f"padding the store to {args.pad + 1:,} indexes")
        pad_store(store, args.pad)
    with served(store, cache, args.cap) as (url, server):
        import httpx

        assert httpx.post(f"{url}/query", json={"query": QUERY, "condition": FIRST}, timeout=600).status_code == 200
        flooded = flood(url, server.pid, store, cache, args, requests=args.requests, first=0, mixed=True)
        filled = fill_to_cap(url)
        log("flood", f"{filled} more built to the cap; past it: {args.past_cap} requests under new conditions")
        past = flood(url, server.pid, store, cache, args, requests=args.past_cap, first=10**6, mixed=False)
        soaked = soak(url, server.pid, store, cache, args) if args.soak_s > 0 or args.smoke else None
    load.update({"after": os.getloadavg(), "uptime_after": uptime()})
    return {
        "config": {
            "rows": args.rows,
            "data": "made-up captions" if args.smoke else "C-STS train+dev distinct sentences, file order",
            "model": args.model or "default",
            "router": args.router,
            "requests": args.requests,
            "flooders": args.flooders,
            "padding_indexes": args.pad,
            "max_on_demand_indexes": args.cap if args.cap is not None else "the server's default",
            "texts_per_embeddings_request": args.texts,
            "server": "condsearch serve, its own process, keyless on 127.0.0.1, defaults",
            "smoke": args.smoke,
        },
        "flood": flooded,
        "built_to_reach_the_cap": filled,
        "past_the_cap": past,
        "soak": soaked,
        "load_average": load,
        "run": run_info(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        result = measure(args, args.work_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="flood-") as tmp:
            result = measure(args, Path(tmp))
    write_json(result, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
