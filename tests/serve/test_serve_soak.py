"""A bounded soak of `condsearch serve`: a real server process on loopback, 32 clients sending good and
bad requests for SOAK_S seconds (and one leaving half-sent requests open) while the index is replaced
every few seconds.

It asserts that no good request failed, that every bad one got a one-line 4xx, that every answer
came from one whole index (each version's rows carry its number), that half-open connections were
closed, and that the server's memory stayed flat. Its figures go to stdout and to build/soak.json.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from condsearch.cli import main
from condsearch.serve.config import ServeConfig
from tests.conftest import SENTENCES

pytestmark = pytest.mark.slow

SOAK_S = float(os.environ.get("CONDSEARCH_SOAK_S", "25"))  # a longer soak by hand
WARM_UP_S = 4.0
REPLACE_EVERY_S = 3.0
N_CLIENTS = 32
#: RSS growth allowed from the end of the warm-up to the end of the run (about 1 MB measured here,
#: on 25 s and about 15,000 requests; the issue's 10 MB query alone left 900 MB)
RSS_BOUND_MB = 25.0
CONDITION = "color of the dress"
FIGURES = Path(__file__).resolve().parents[2] / "build" / "soak.json"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _version_rows(version: int) -> dict[str, list[str]]:
    """Return the corpus of one index version: 6 to 12 rows whose ids name the version."""
    n = 6 + version % 7
    return {
        "id": [f"v{version}-{i}" for i in range(n)],
        "text": [f"{SENTENCES[(i + version) % len(SENTENCES)]} {'red ' * (version % 3)}v{version}" for i in range(n)],
    }


def _write_version(folder: Path, version: int) -> dict[str, list[str]]:
    rows = _version_rows(version)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows), folder / "corpus.parquet")  # one corpus name: each version replaces the last
    return rows


def _index(corpus_dir: Path, index_dir: Path, model: Path) -> None:
    argv = ["index", str(corpus_dir / "corpus.parquet"), "-c", CONDITION, "--model", str(model), "--head", "none"]
    result = CliRunner().invoke(main, [*argv, "--index-dir", str(index_dir)])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"


def _bad_request(rng: random.Random) -> tuple[str, bytes]:
    """Return (kind, body) of a request the server must refuse with a 4xx."""
    kind = rng.choice(["surrogate", "k", "overlong", "oversize", "unknown", "malformed", "not-object", "types"])
    body: object
    if kind == "surrogate":
        body = {"query": f"a girl \ud800 {rng.random()}", "condition": CONDITION}
    elif kind == "k":
        body = {"query": "a girl", "condition": CONDITION, "k": rng.choice([True, "5", 0, -1, 2.5, None])}
    elif kind == "overlong":
        body = {"query": "dress " * 2000, "condition": CONDITION}
    elif kind == "oversize":
        body = {"query": "x" * (1024 * 1024 + 10), "condition": CONDITION}
    elif kind == "unknown":
        body = {"query": "a girl", "condition": "the mood"}
    elif kind == "malformed":
        return kind, b'{"query": "a girl", "condition": '
    elif kind == "not-object":
        body = ["a girl", CONDITION]
    else:
        body = {"queries": ["a girl", 5], "condition": CONDITION}
    return kind, json.dumps(body).encode("ascii")


class Tally:
    """What the clients saw, counted under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.versions: set[str] = set()

    def add(self, key: str, failure: str | None = None) -> None:
        with self.lock:
            self.counts[key] += 1
            if failure is not None and len(self.failures) < 20:
                self.failures.append(failure)


def _check_whole(answer: dict, tally: Tally) -> str | None:
    """Return why answer did not come from one whole index version, or None."""
    versions = {hit["id"].split("-")[0] for a in answer["results"] for hit in a["results"]}
    if len(versions) != 1:
        return f"rows of versions {sorted(versions)} in one answer"
    [version] = versions
    rows = _version_rows(int(version[1:]))
    if answer["rows"] != len(rows["id"]):
        return f"{version}: {answer['rows']} rows, the version has {len(rows['id'])}"
    for a in answer["results"]:
        for hit in a["results"]:
            if rows["text"][rows["id"].index(hit["id"])] != hit["text"]:
                return f"{hit['id']}: text {hit['text']!r} is not its version's"
    with tally.lock:
        tally.versions.add(version)
    return None


def _client(url: str, seed: int, stop: threading.Event, tally: Tally) -> None:
    rng = random.Random(seed)
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=url, timeout=60) as http:
        while not stop.is_set():
            if rng.random() < 0.3:
                kind, content = _bad_request(rng)
                try:
                    response = http.post("/query", content=content, headers=headers)
                except httpx.HTTPError as exc:
                    tally.add("bad-transport-error", f"{kind}: {exc!r}")
                    continue
                ok = 400 <= response.status_code < 500 and "\n" not in response.json().get("error", "\n")
                tally.add("bad" if ok else "bad-misanswered", None if ok else f"{kind}: {response.text[:200]}")
                continue
            queries = rng.sample(SENTENCES, rng.randint(1, 3))
            body = {"queries": queries, "condition": CONDITION, "k": rng.randint(1, 15)}
            try:
                response = http.post("/query", json=body)
            except httpx.HTTPError as exc:
                tally.add("good-failed", f"transport: {exc!r}")
                continue
            if response.status_code != 200:
                tally.add("good-failed", f"{response.status_code}: {response.text[:200]}")
                continue
            why = _check_whole(response.json(), tally)
            tally.add("good" if why is None else "good-mixed", why)


def _staller(port: int, stop: threading.Event, tally: Tally) -> None:
    """Open a connection a second that sends half a request head and then nothing; count those the
    server closed once they were older than its head timeout."""
    opened: list[tuple[float, socket.socket]] = []
    while not stop.is_set():
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"POST /query HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
        opened.append((time.monotonic(), sock))
        stop.wait(1.0)
    for at, sock in opened:
        if time.monotonic() - at > ServeConfig.head_timeout_s + 2:
            tally.add("half-open-old")
            sock.settimeout(1.0)
            try:
                tally.add("half-open-closed" if sock.recv(1) == b"" else "half-open-answered")
            except OSError:
                tally.add("half-open-still-open")
        sock.close()


def test_serve_soak(tiny_bert_dir: Path, tmp_path: Path) -> None:
    index_dir, corpus_dir = tmp_path / "indexes", tmp_path / "corpus"
    _write_version(corpus_dir, 0)
    _index(corpus_dir, index_dir, tiny_bert_dir)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "condsearch", "serve", "--port", str(port), "--index-dir", str(index_dir)]
    with open(log_path, "wb") as log:
        server = subprocess.Popen([*argv, "--device", "cpu", "--threads", "1"], stdout=log, stderr=log)
    try:
        _wait_until_up(url, server, log_path)
        stop, tally = threading.Event(), Tally()
        clients = [
            threading.Thread(target=_client, args=(url, seed, stop, tally), daemon=True) for seed in range(N_CLIENTS)
        ]
        clients.append(threading.Thread(target=_staller, args=(port, stop, tally), daemon=True))
        started = time.monotonic()
        for thread in clients:
            thread.start()
        time.sleep(WARM_UP_S)
        rss_warm = _rss_mb(server.pid)
        version, n_replaced = 0, 0
        while time.monotonic() - started < SOAK_S:
            time.sleep(REPLACE_EVERY_S)
            version += 1
            _write_version(corpus_dir, version)
            _index(corpus_dir, index_dir, tiny_bert_dir)
            n_replaced += 1
        stop.set()
        for thread in clients:
            thread.join(90)
        elapsed = time.monotonic() - started
        rss_end = _rss_mb(server.pid)
        health = httpx.get(url + "/health", timeout=30).json()
        still_up = server.poll() is None
    finally:
        server.terminate()
        server.wait(30)
    counts = tally.counts
    n_requests = sum(n for key, n in counts.items() if not key.startswith("half-open"))
    figures = {
        "seconds": round(elapsed, 1),
        "clients": N_CLIENTS,
        "requests": n_requests,
        "requests_per_s": round(n_requests / elapsed, 1),
        "good": counts["good"],
        "bad": counts["bad"],
        "good_failed": counts["good-failed"],
        "good_mixed_index": counts["good-mixed"],
        "bad_misanswered": counts["bad-misanswered"] + counts["bad-transport-error"],
        "half_open_connections_past_timeout": counts["half-open-old"],
        "half_open_closed_by_server": counts["half-open-closed"],
        "index_replacements": n_replaced,
        "versions_seen": len(tally.versions),
        "batches": health["batches"],
        "rss_after_warm_up_mb": round(rss_warm, 1),
        "rss_end_mb": round(rss_end, 1),
        "rss_growth_mb": round(rss_end - rss_warm, 1),
        "failures": tally.failures,
    }
    FIGURES.parent.mkdir(exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
    print("soak:", json.dumps(figures))
    assert still_up and health["status"] == "ok"
    assert counts["good"] > 0 and counts["bad"] > 0
    assert counts["good-failed"] == 0 and counts["good-mixed"] == 0, tally.failures
    assert counts["bad-misanswered"] == 0 and counts["bad-transport-error"] == 0, tally.failures
    assert len(tally.versions) >= 3, tally.versions  # the replacements really were served
    assert counts["half-open-old"] > 0 and counts["half-open-closed"] == counts["half-open-old"], figures
    assert rss_end - rss_warm < RSS_BOUND_MB, figures


def _wait_until_up(url: str, server: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"serve exited {server.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                # load the model and index before the clock starts
                warm = {"query": "warm up", "condition": CONDITION}
                assert httpx.post(url + "/query", json=warm, timeout=120).status_code == 200
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"serve did not start:\n{log_path.read_text()[-3000:]}")
