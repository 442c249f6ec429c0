"""Conditions on demand in the server (issue 41): a build's seconds, and other clients' latency meanwhile.

A router corpus (--mode csr, the shipped router) of --rows distinct C-STS sentences is indexed under
one condition (which caches every sentence's states) and served (`condsearch serve`'s app under
uvicorn, in this process, with --build-inline-rows 0). One client asks under the indexed condition in
a loop, one query a request; after a while another asks under a condition never indexed: it gets a
202, polls ``GET /builds/ID`` until done, and asks again. Reported: the build's seconds (the 202 to
done, and to the answer), its progress as polled, and the first client's p50/p95 latency before and
during the build. Then, for the inline limit (``--build-inline-rows``), the seconds a request under a
new condition takes to be answered in the same request, for small corpora of --inline-sizes rows.

    python -m benchmarks.systems.serve_builds --json-out benchmarks/systems/results/serve_builds.json

``--smoke`` runs the same on a tiny model (--model, a tiny BERT with --router none), 40 rows (the tests
run it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._lib.common import log, run_info, write_json
from benchmarks.systems.on_demand import CSTS, FIRST, QUERY, corpus_texts

NEW = "the number of people"
INLINE_NEW = "the location"
PAGE_NEW = "the weather"
CHROMIUM = os.environ.get("CONDSEARCH_CHROMIUM", "/usr/bin/chromium")
BACKGROUND = "a WN18RR training job ran in the background on this 2-core machine (the load averages say how busy)"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000, help="Rows of the corpus built while queries are asked.")
    p.add_argument("--csts", type=Path, default=CSTS, help="C-STS folder (train.csv, dev.csv) [default: %(default)s].")
    p.add_argument("--inline-sizes", default="250,500,1000,2000", help="Corpus rows whose inline build is timed.")
    p.add_argument("--before-s", type=float, default=10.0, help="Seconds of queries before the build starts.")
    p.add_argument(
        "--page", action="store_true", help=f"Also build a condition from the search page, in Chromium ({CHROMIUM})."
    )
    p.add_argument("--model", default=None, help="Model [default: the embedded MiniLM].")
    p.add_argument("--router", default="default", help="Router: default, none or a folder.")
    p.add_argument("--smoke", action="store_true", help="Tiny run: 40 made-up rows (give --model a tiny BERT).")
    p.add_argument("--work-dir", type=Path, default=None, help="Where the corpora, stores and cache go [a temp dir].")
    p.add_argument("--json-out", type=Path, default=None)
    return p.parse_args(argv)


def index(corpus: Path, store: Path, condition: str, args: argparse.Namespace) -> float:
    """Index corpus under condition with `condsearch index --mode csr` (in this process); return its seconds."""
    from condsearch.cli import main as cli

    model = ["--model", args.model] if args.model else []
    start = time.perf_counter()
    cli.main(
        [
            "index",
            str(corpus),
            "-c",
            condition,
            "--mode",
            "csr",
            "--router",
            args.router,
            *model,
            "--index-dir",
            str(store),
        ],  # fmt: skip
        prog_name="condsearch",
        standalone_mode=False,
    )
    return time.perf_counter() - start


def write_corpus(texts: list[str], path: Path) -> Path:
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), path)
    return path


def percentiles(seconds: list[float]) -> dict[str, float | int | None]:
    if not seconds:
        return {"n": 0, "p50_ms": None, "p95_ms": None}
    ms = np.array(seconds) * 1000
    return {
        "n": len(ms),
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p95_ms": round(float(np.percentile(ms, 95)), 1),
    }


def during_build(store: Path, args: argparse.Namespace) -> dict[str, object]:
    """Serve store; one client queries FIRST in a loop while another has NEW built; return the timings."""
    import httpx

    from condsearch.serve.config import ServeConfig
    from condsearch.serve.server import BackgroundServer, build_app

    config = ServeConfig(index_dir=store, build_inline_rows=0, reload_interval_s=0.2)
    latencies: list[tuple[float, float]] = []  # (when it started, seconds)
    stop = threading.Event()
    with BackgroundServer(build_app(config)) as server, httpx.Client(base_url=server.url, timeout=600) as http:
        body = {"query": QUERY, "condition": FIRST, "k": 10}
        assert http.post("/query", json=body).status_code == 200  # the model loaded before timing

        def loop() -> None:
            with httpx.Client(base_url=server.url, timeout=600) as own:
                while not stop.is_set():
                    start = time.perf_counter()
                    got = own.post("/query", json=body)
                    latencies.append((start, time.perf_counter() - start))
                    assert got.status_code == 200, got.text

        querying = threading.Thread(target=loop)
        querying.start()
        time.sleep(0.5 if args.smoke else args.before_s)
        asked = time.perf_counter()
        accepted = http.post("/query", json={**body, "condition": NEW})
        assert accepted.status_code == 202, accepted.text
        job, progress = accepted.json(), []
        while job["status"] not in {"done", "failed"}:
            time.sleep(0.25)
            job = http.get(job["poll"]).json()
            progress.append([round(time.perf_counter() - asked, 2), job["status"], job["rows_done"], job["rows"]])
        done = time.perf_counter()
        assert job["status"] == "done", job
        answer = http.post("/query", json={**body, "condition": NEW})
        answered = time.perf_counter()
        assert answer.status_code == 200, answer.text
        time.sleep(0.2 if args.smoke else 3.0)
        stop.set()
        querying.join()
    before = [s for t, s in latencies if t < asked]
    during = [s for t, s in latencies if asked <= t and t + s <= done]
    return {
        "rows": job["rows"],
        "seconds": {
            "accepted_202": round(accepted.elapsed.total_seconds(), 3),
            "build_202_to_done": round(done - asked, 2),
            "build_job_seconds": job["seconds"],
            "to_answer": round(answered - asked, 2),
        },
        "progress_polled": progress,
        "other_client": {"before": percentiles(before), "during_build": percentiles(during)},
    }


def from_the_page(store: Path) -> dict[str, object]:
    """Serve store (202 path); in Chromium, search under PAGE_NEW beside FIRST; return the seconds and progress seen."""
    from playwright.sync_api import expect, sync_playwright

    from condsearch.serve.config import ServeConfig
    from condsearch.serve.server import BackgroundServer, build_app

    config = ServeConfig(index_dir=store, build_inline_rows=0, reload_interval_s=0.2)
    with BackgroundServer(build_app(config)) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"{server.url}/")
        page.wait_for_selector("#conditions option", state="attached")
        page.fill("#query", QUERY)
        page.fill("#left", FIRST)
        page.fill("#right", PAGE_NEW)
        page.fill("#k", "10")
        seen: list[str] = []
        start = time.perf_counter()
        page.click("#go")
        status = page.locator("#status")
        while page.locator("#right-results li").count() < 10:
            text = status.text_content() or ""
            if text.startswith("Building") and text not in seen:
                seen.append(text)
            assert time.perf_counter() - start < 300, text
            time.sleep(0.1)
        expect(page.locator("#right-results li")).to_have_count(10)
        seconds = time.perf_counter() - start
        browser.close()
    return {"condition": PAGE_NEW, "seconds_to_results": round(seconds, 2), "progress_shown": seen}


def inline_builds(work: Path, sizes: list[int], args: argparse.Namespace) -> list[dict[str, object]]:
    """Return, per corpus size, the seconds a request under a new condition takes to be built and answered inline."""
    import httpx

    from condsearch.serve.config import ServeConfig
    from condsearch.serve.server import BackgroundServer, build_app

    out = []
    for rows in sizes:
        corpus = write_corpus(corpus_texts(rows, args.smoke, args.csts), work / f"inline-{rows}.parquet")
        store = work / f"inline-{rows}"
        index(corpus, store, FIRST, args)
        config = ServeConfig(index_dir=store, build_inline_rows=rows, reload_interval_s=0.2)
        with BackgroundServer(build_app(config)) as server, httpx.Client(base_url=server.url, timeout=600) as http:
            assert http.post("/query", json={"query": QUERY, "condition": FIRST}).status_code == 200  # model loaded
            start = time.perf_counter()
            got = http.post("/query", json={"query": QUERY, "condition": INLINE_NEW})
            seconds = time.perf_counter() - start
            assert got.status_code == 200, got.text
        out.append({"rows": rows, "seconds_to_answer": round(seconds, 2)})
        log("serve_builds", f"inline build of {rows} rows answered in {seconds:.1f} s")
    return out


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def measure(args: argparse.Namespace, work: Path) -> dict[str, object]:
    os.environ.setdefault("CONDSEARCH_CACHE_DIR", str(work / "cache"))
    rows = 40 if args.smoke else args.rows
    sizes = [20] if args.smoke else [int(s) for s in args.inline_sizes.split(",") if s]
    load = {"before": os.getloadavg(), "uptime_before": uptime()}
    corpus = write_corpus(corpus_texts(rows, args.smoke, args.csts), work / "corpus.parquet")
    store = work / "indexes"
    log("serve_builds", f"{rows} rows: indexing {FIRST!r} (states cached)")
    index_first = index(corpus, store, FIRST, args)
    log("serve_builds", f"serving; building {NEW!r} while another client queries")
    served = during_build(store, args)
    log("serve_builds", f"built in {served['seconds']['build_202_to_done']} s; inline sizes {sizes}")  # type: ignore[index]
    page = from_the_page(store) if args.page else None
    inline = inline_builds(work, sizes, args)
    load.update({"after": os.getloadavg(), "uptime_after": uptime()})
    return {
        "config": {
            "rows": rows,
            "data": "made-up captions" if args.smoke else "C-STS train+dev distinct sentences, file order",
            "model": args.model or "default",
            "router": args.router,
            "query": QUERY,
            "indexed_condition": FIRST,
            "new_condition": NEW,
            "inline_condition": INLINE_NEW,
            "server": "ServeConfig defaults, build_inline_rows 0 (the 202 path), in this process",
            "other_client": "one query a request, in a loop, sequential",
            "smoke": args.smoke,
        },
        "seconds": {"index_first": round(index_first, 2)},
        "build_while_serving": served,
        "page": page,
        "inline": inline,
        "load_average": load,
        "note": BACKGROUND,
        "run": run_info(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        result = measure(args, args.work_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="serve-builds-") as tmp:
            result = measure(args, Path(tmp))
    write_json(result, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
