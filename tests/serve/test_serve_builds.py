"""Conditions on demand in the server (issue 41): a query under a condition a router corpus has no index for builds it.

The real server (uvicorn on a free loopback port) and a real HTTP client; the tiny BERT stands in for
MiniLM with an untrained router. A small corpus is answered in the request, as `query --json` answers
after `index -c`; a larger one (``build_inline_rows=0`` here) gets a 202 and a job to poll. Requests
for one condition share one build; other queries are answered while a build runs (a build held on an
Event, no timing); --no-build, a missing API key, bad conditions, a CASE corpus and a changed router
are refused in one line, the store untouched.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from condsearch.query.on_demand import OnDemand, build_on_demand
from condsearch.serve.config import ServeConfig
from condsearch.serve.server import BackgroundServer, build_app
from condsearch.store.conditions import MAX_CONDITION_CHARS
from tests.conftest import assert_same_ranking
from tests.csr_corpus import move_router, write_csr_corpus
from tests.query.test_on_demand import COLOUR, QUERIES, SPORT, cli_answers, index, run, snapshot

KEY = "s3cret"
MOOD = "the mood of the scene"


def serve(folder: Path, **settings: object) -> BackgroundServer:
    config = ServeConfig(index_dir=folder, reload_interval_s=0.05, device="cpu", **settings)  # type: ignore[arg-type]
    return BackgroundServer(build_app(config))


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_csr_corpus(tmp_path / "c.parquet")


@pytest.fixture
def folder(tmp_path: Path, corpus: Path, tiny_bert_dir: Path) -> Path:
    out = tmp_path / "idx"
    index(corpus, out, tiny_bert_dir, COLOUR)
    return out


@pytest.fixture
def http(folder: Path) -> Iterator[httpx.Client]:
    with serve(folder) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def scored_ids(answers: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of a response's answers, one row per query, for assert_same_ranking."""
    return (
        np.array([[h["score"] for h in a["results"]] for a in answers]),
        np.array([[h["id"] for h in a["results"]] for a in answers]),
    )


def ask(http: httpx.Client, condition: str, **body: object) -> httpx.Response:
    return http.post("/query", json={"queries": QUERIES, "condition": condition, "k": 5, **body})


def poll(http: httpx.Client, job: str, until: set[str], **headers: str) -> dict[str, Any]:
    """Return the job's report once its status is one of until (a deadline guards a hang, not a timing)."""
    deadline = time.monotonic() + 120
    while True:
        report = http.get(f"/builds/{job}", headers=headers)
        assert report.status_code == 200, report.text
        if report.json()["status"] in until:
            return dict(report.json())
        assert time.monotonic() < deadline, report.json()
        time.sleep(0.05)


def one_line_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error, str) and "\n" not in error and "Traceback" not in error
    return error


def published(folder: Path, name: str) -> int:
    """Return how many versions of the index named name were published."""
    (index,) = [p for p in (folder / ".versions").iterdir() if p.is_dir() and p.name.startswith(name)]
    return len([v for v in index.iterdir() if (v / "manifest.json").exists()])


class HeldBuild:
    """build_on_demand, counted, each call held until released (after saying it started)."""

    def __init__(self) -> None:
        self.calls = 0
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> OnDemand:
        self.calls += 1
        self.nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if hasattr(os, "getpriority") else 0
        self.started.set()
        assert self.release.wait(60)
        return build_on_demand(*args, **kwargs)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> HeldBuild:
    import condsearch.serve.builds as builds_module

    build = HeldBuild()
    monkeypatch.setattr(builds_module, "build_on_demand", build)
    return build


def test_a_small_corpus_is_built_and_answered_in_the_request_as_index_builds_it(
    http: httpx.Client, folder: Path, tmp_path: Path, corpus: Path, tiny_bert_dir: Path
) -> None:
    response = ask(http, SPORT)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["corpus"] == "c" and body["rows"] == 40
    indexed = tmp_path / "indexed"
    index(corpus, indexed, tiny_bert_dir, COLOUR, SPORT)
    expected, _ = cli_answers(indexed, SPORT)
    assert [[h["id"] for h in a["results"]] for a in body["results"]] == [
        [h["id"] for h in a["results"]] for a in expected
    ]
    for got, want in zip(body["results"], expected, strict=True):
        assert [h["score"] for h in got["results"]] == pytest.approx([h["score"] for h in want["results"]], abs=1e-5)
    listed = {i["condition"] for i in http.get("/indexes").json()["indexes"]}
    assert listed == {COLOUR, SPORT}  # the new index is listed
    again = ask(http, SPORT)
    assert again.status_code == 200 and again.json()["results"] == body["results"]


def test_a_large_corpus_answers_202_and_a_job_to_poll(folder: Path) -> None:
    with serve(folder, build_inline_rows=0) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        accepted = ask(http, SPORT)
        assert accepted.status_code == 202, accepted.text
        job = accepted.json()
        assert job["status"] in {"queued", "building"} and job["condition"] == SPORT and job["corpus"] == "c"
        assert job["rows"] == 40 and job["poll"] == f"/builds/{job['job']}"
        done = poll(http, job["job"], {"done", "failed"})
        assert (done["status"], done["rows_done"], done["rows"]) == ("done", 40, 40) and "error" not in done
        assert done["seconds"] >= 0
        answered = ask(http, SPORT)
        assert answered.status_code == 200 and answered.json()["rows"] == 40
        assert one_line_error(http.get("/builds/nope"), 404).startswith("no build 'nope'")


def test_requests_for_one_condition_share_one_build(folder: Path, held: HeldBuild) -> None:
    with serve(folder, build_inline_rows=0) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(lambda _: ask(http, SPORT), range(4)))
        assert [r.status_code for r in responses] == [202] * 4
        assert len({r.json()["job"] for r in responses}) == 1
        held.release.set()
        poll(http, responses[0].json()["job"], {"done"})
        assert ask(http, SPORT).status_code == 200
    assert held.calls == 1
    assert published(folder, "the-sport") == 1


def test_inline_requests_share_one_build_and_publish_once(folder: Path) -> None:
    with serve(folder) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        with ThreadPoolExecutor(3) as pool:
            responses = list(pool.map(lambda _: ask(http, SPORT), range(3)))
        assert [r.status_code for r in responses] == [200] * 3
        first, *others = (r.json()["results"] for r in responses)
        for other in others:  # one build; the queries may be encoded in other batches: equal up to float32 ties
            assert [(a["query"], a["condition"]) for a in other] == [(a["query"], a["condition"]) for a in first]
            assert_same_ranking(scored_ids(first), scored_ids(other), 1e-5)
    assert published(folder, "the-sport") == 1


def test_other_queries_are_answered_while_a_build_runs(folder: Path, held: HeldBuild) -> None:
    with serve(folder) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(ask, http, SPORT)  # a small corpus: answered once built
            assert held.started.wait(60)
            other = ask(http, COLOUR)  # the build is held: the server answers this one meanwhile
            assert other.status_code == 200 and not waiting.done()
            held.release.set()
            assert waiting.result().status_code == 200
    assert held.calls == 1


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="thread priorities are Linux's")
def test_a_build_runs_at_a_lower_cpu_priority_than_the_queries(folder: Path, held: HeldBuild) -> None:
    """Issue 58: a flood of new conditions took the known queries' CPU; a build's thread (and the threads it
    starts) now runs niced, so the queries go first."""
    from condsearch.serve.priority import BACKGROUND_NICE

    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with serve(folder) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(ask, http, SPORT)
            assert held.started.wait(60)
            held.release.set()
            assert waiting.result().status_code == 200
    assert held.nice == min(19, mine + BACKGROUND_NICE)


def test_no_build_keeps_the_404(folder: Path) -> None:
    before = snapshot(folder)
    with serve(folder, build=False) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        error = one_line_error(ask(http, SPORT), 404)
        assert "no index for condition 'the sport being played'" in error
        assert one_line_error(http.get("/builds/x"), 404)
    assert snapshot(folder) == before


def test_building_and_its_jobs_need_the_api_key(folder: Path) -> None:
    before = snapshot(folder)
    with serve(folder, api_key=KEY, build_inline_rows=0) as server, httpx.Client(base_url=server.url) as http:
        assert one_line_error(ask(http, SPORT), 401).startswith("missing or wrong API key")
        assert snapshot(folder) == before  # nothing was built
        accepted = http.post("/query", json={"query": "a girl", "condition": SPORT}, headers={"X-API-Key": KEY})
        assert accepted.status_code == 202, accepted.text
        job = accepted.json()["job"]
        assert one_line_error(http.get(f"/builds/{job}"), 401)
        assert poll(http, job, {"done", "failed"}, **{"X-API-Key": KEY})["status"] == "done"


@pytest.mark.parametrize(
    ("condition", "status", "says"),
    [
        ("   ", 422, "the condition is empty"),
        ("the\tsport", 422, "control character (U+0009) at position 4"),
        ("colour\x1b[31m", 422, "control character (U+001B)"),
        ("x" * (MAX_CONDITION_CHARS + 1), 422, f"at most {MAX_CONDITION_CHARS} are allowed"),
        ("a\x00b", 422, "NUL"),
    ],
)
def test_bad_conditions_are_refused_in_one_line(
    http: httpx.Client, folder: Path, condition: str, status: int, says: str
) -> None:
    before = snapshot(folder)
    assert says in one_line_error(ask(http, condition), status)
    assert snapshot(folder) == before


def test_a_case_corpus_cannot_build_on_demand(tmp_path: Path, corpus: Path, tiny_bert_dir: Path) -> None:
    folder = tmp_path / "case"
    run("index", corpus, "-c", COLOUR, "--mode", "case", "--profile", "none", "--model", tiny_bert_dir,
        "--index-dir", folder)  # fmt: skip
    before = snapshot(folder)
    with serve(folder) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        error = one_line_error(ask(http, SPORT), 404)
        assert error.startswith("no index for condition 'the sport being played'")
        assert "indexed with --mode case" in error and "only for --mode csr corpora" in error
        assert "run condsearch index FILE --name c " in error and str(tmp_path) not in error  # no path named
    assert snapshot(folder) == before


def test_a_changed_router_fails_the_build_in_one_line_and_a_later_request_retries(
    tmp_path: Path, corpus: Path, tiny_bert_dir: Path
) -> None:
    routers = tmp_path / "routers"
    router = move_router(tiny_bert_dir, routers, seed=0)
    folder = tmp_path / "idx"
    index(corpus, folder, tiny_bert_dir, COLOUR, router=str(router))
    move_router(tiny_bert_dir, routers, seed=1)  # retrained in place
    before = snapshot(folder)
    with serve(folder) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        error = one_line_error(ask(http, SPORT), 409)
        assert "indexed with router r (sha256" in error and "which has changed since" in error
        assert str(tmp_path) not in error  # the router's folder is not named
        assert "which has changed since" in one_line_error(ask(http, SPORT), 409)  # not stuck: built again, refused
        nowhere = one_line_error(ask(http, SPORT, corpus="nope"), 404)
        assert "no index of corpus 'nope' to build" in nowhere and str(tmp_path) not in nowhere
    with serve(folder, build_inline_rows=0) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        failed = poll(http, ask(http, SPORT).json()["job"], {"done", "failed"})
        assert failed["status"] == "failed" and "which has changed since" in failed["error"]
        assert "\n" not in failed["error"]
    assert snapshot(folder) == before


def test_the_benchmark_runs_in_smoke_mode(tiny_bert_dir: Path, tmp_path: Path) -> None:
    import importlib
    import json

    module = importlib.import_module("benchmarks.systems.serve_builds")
    out = tmp_path / "out.json"
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--router", "none", "--work-dir", str(tmp_path / "w")]
    assert module.main([*argv, "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    served = result["build_while_serving"]
    assert result["config"]["rows"] == served["rows"] == 40
    assert served["progress_polled"][-1][1:] == ["done", 40, 40]
    assert served["other_client"]["before"]["n"] > 0
    assert [r["rows"] for r in result["inline"]] == [20] and result["run"]["machine"]["cpu"]


def test_a_damaged_index_is_named_not_built_again(tmp_path: Path, corpus: Path, tiny_bert_dir: Path) -> None:
    from condsearch.store.folder import MANIFEST, IndexStore

    folder = tmp_path / "idx"
    index(corpus, folder, tiny_bert_dir, COLOUR, SPORT)
    (folder / IndexStore(folder).find(SPORT) / MANIFEST).write_text("{not json")
    before = snapshot(folder)
    with serve(folder) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        error = one_line_error(ask(http, SPORT), 404)
        assert "1 index is damaged" in error and "corrupt manifest" in error
        assert ask(http, COLOUR).status_code == 200
    assert snapshot(folder) == before
