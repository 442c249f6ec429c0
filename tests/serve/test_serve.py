"""`condsearch serve` end to end: the real server (uvicorn on a free loopback port), a real HTTP client.

The tiny BERT stands in for the default model; indexes are built and replaced by the CLI itself.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from condsearch.cli import main
from condsearch.serve.config import ServeConfig
from condsearch.serve.server import BackgroundServer, build_app
from tests.conftest import SENTENCES

COLOUR = "color of the dress"
SPORT = "the sport being played"
NEW_SENTENCES = ["A cat sleeps on a red car.", "A horse runs on the beach.", "A dog catches a ball in the park."]


def run(*args: object) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    return result


def index(corpus: Path, index_dir: Path, model: Path, *conditions: str) -> None:
    flags = [x for c in conditions for x in ("-c", c)]
    # through torch, which writes no ONNX export: the server's first load writes it (tested below)
    run("index", corpus, *flags, "--model", model, "--head", "none", "--backend", "torch", "--index-dir", index_dir)


def cli_answers(index_dir: Path, condition: str, k: int, *queries: str) -> list[dict]:
    out = run("query", *queries, "-c", condition, "-k", k, "--json", "--index-dir", index_dir).stdout
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture
def index_dir(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "indexes"
    index(corpus_file, folder, tiny_bert_dir, COLOUR, SPORT)
    return folder


def serve(index_dir: Path, **settings: object) -> BackgroundServer:
    config = ServeConfig(index_dir=index_dir, reload_interval_s=0.05, device="cpu", **settings)  # type: ignore[arg-type]
    return BackgroundServer(build_app(config))


@pytest.fixture
def client(index_dir: Path) -> Iterator[httpx.Client]:
    with serve(index_dir) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        yield http


def post(http: httpx.Client, **body: object) -> httpx.Response:
    return http.post("/query", json=body)


def test_serve_query_replace_and_bad_requests(
    index_dir: Path, client: httpx.Client, tiny_bert_dir: Path, tmp_path: Path
) -> None:
    # 1. answers equal `condsearch query --json`, one per query, in order
    queries = [SENTENCES[2], SENTENCES[6]]
    response = post(client, queries=queries, condition=COLOUR, k=3)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["results"] == cli_answers(index_dir, COLOUR, 3, *queries)
    assert (body["k"], body["k_requested"], body["k_capped"], body["rows"]) == (3, 3, False, len(SENTENCES))
    assert [a["results"][0]["id"] for a in body["results"]] == ["s2", "s6"]
    one = post(client, query=SENTENCES[1], condition=SPORT, k=2).json()
    assert one["results"] == cli_answers(index_dir, SPORT, 2, SENTENCES[1])

    # 2. the index is replaced underneath the running server: the new rows come back, no restart
    (tmp_path / "new").mkdir()
    new_corpus = tmp_path / "new" / "corpus.parquet"  # the same corpus name, so it replaces the index
    pq.write_table(pa.table({"id": ["n0", "n1", "n2"], "text": NEW_SENTENCES}), new_corpus)
    index(new_corpus, index_dir, tiny_bert_dir, COLOUR)
    deadline = time.monotonic() + 20
    while True:
        got = post(client, query=NEW_SENTENCES[1], condition=COLOUR, k=3).json()
        if got["rows"] == 3:
            break
        assert got["rows"] == len(SENTENCES)  # the old index, whole, until the new one is in
        assert time.monotonic() < deadline, "the replaced index was never served"
        time.sleep(0.05)
    assert got["results"][0]["results"][0]["id"] == "n1"
    assert {h["id"] for h in got["results"][0]["results"]} == {"n0", "n1", "n2"}
    assert got["results"] == cli_answers(index_dir, COLOUR, 3, NEW_SENTENCES[1])
    assert client.get("/health").json()["models_loaded"] == 1  # the model was not reloaded with the index

    # 3. bad requests: each a 4xx with a one-line error, and the server keeps answering
    bad = [
        (client.post("/query", content=b"{not json", headers={"content-type": "application/json"}), 400),
        (client.post("/query", content=b"", headers={"content-type": "application/json"}), 422),
        (client.post("/query", json=["a list"]), 422),
        (post(client, condition=COLOUR), 422),  # no query
        (post(client, query="q"), 422),  # no condition
        (post(client, query="q", queries=["q"], condition=COLOUR), 422),
        (post(client, query="   ", condition=COLOUR), 422),
        (post(client, queries=[], condition=COLOUR), 422),
        (post(client, queries=["ok", ""], condition=COLOUR), 422),
        (post(client, query="q", condition="  "), 422),
        (post(client, query="q", condition=COLOUR, k=0), 422),
        (post(client, query="q", condition=COLOUR, k=-2), 422),
        (post(client, query="q", condition=COLOUR, k="many"), 422),
        (post(client, query="q", condition=COLOUR, colour="red"), 422),  # unknown field
        (post(client, query="q", condition=COLOUR, corpus="nope"), 404),
        (post(client, query="q", condition="the mood"), 404),  # not indexed, and a CASE corpus cannot build it
        (client.get("/no-such-endpoint"), 404),
        (client.get("/query"), 405),
    ]
    for response, status in bad:
        assert response.status_code == status, (response.request.content, response.text)
        error = response.json()["error"]
        assert isinstance(error, str) and error and "\n" not in error
    unknown = post(client, query="q", condition="the mood").json()
    assert unknown["conditions"] == sorted([COLOUR, SPORT]) and "indexed:" in unknown["error"]
    assert client.get("/health").json()["status"] == "ok"
    assert post(client, query=SENTENCES[3], condition=SPORT, k=1).json()["results"][0]["results"][0]["id"] == "s3"


def test_k_larger_than_the_index_returns_every_row(client: httpx.Client) -> None:
    body = post(client, query=SENTENCES[0], condition=COLOUR, k=50).json()
    assert (body["k"], body["k_requested"], body["k_capped"], body["rows"]) == (8, 50, True, 8)
    assert len(body["results"][0]["results"]) == len(SENTENCES)


def test_indexes_health_and_docs(index_dir: Path, client: httpx.Client) -> None:
    listed = [json.loads(line) for line in run("list", "--json", "--index-dir", index_dir).stdout.splitlines()]
    # as `list --json`, but a local model's folder by its last part: the server names no path (issue 58)
    assert any(os.path.isabs(i["model"]) for i in listed)
    for i in listed:
        i["model"] = os.path.basename(i["model"])
    assert client.get("/indexes").json() == {"indexes": listed}
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["indexes_loaded"] == 0  # loaded lazily, on first use
    post(client, query="q", condition=COLOUR)
    post(client, query="q", condition=SPORT)
    health = client.get("/health").json()
    assert (health["indexes_loaded"], health["models_loaded"]) == (2, 1)  # one model shared by both
    assert client.get("/docs").status_code == 200
    assert "/query" in client.get("/openapi.json").json()["paths"]


def test_concurrent_requests_are_answered_together(index_dir: Path) -> None:
    with serve(index_dir, batch_window_ms=20.0) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        post(http, query="warm up", condition=COLOUR)  # loads the model before the burst

        def ask(i: int) -> dict:
            response = http.post("/query", json={"query": SENTENCES[i % 8], "condition": COLOUR, "k": 1})
            assert response.status_code == 200, response.text
            return response.json()

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(24)))
        assert [a["results"][0]["results"][0]["id"] for a in answers] == [f"s{i % 8}" for i in range(24)]
        batches = http.get("/health").json()["batches"]
    assert batches["requests"] == 25 and batches["n"] < 25 and batches["largest"] > 1


def test_api_key_is_required_on_every_request(index_dir: Path) -> None:
    with serve(index_dir, api_key="s3cret") as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for path in ("/indexes", "/openapi.json"):  # /docs is a page: it holds no data
            assert http.get(path).status_code == 401
        assert http.get("/health").status_code == 200  # a probe's: open unless --private-health (test_serve_ops)
        denied = http.post("/query", json={"query": "q", "condition": COLOUR}, headers={"X-API-Key": "wrong"})
        assert denied.status_code == 401 and "API key" in denied.json()["error"]
        assert http.get("/indexes", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert http.get("/indexes", headers={"X-API-Key": "s3cret"}).status_code == 200
        ok = http.post("/query", json={"query": "q", "condition": COLOUR}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["k_requested"] == ServeConfig.k


def test_damaged_index_is_a_500_and_the_server_survives(index_dir: Path, client: httpx.Client) -> None:
    from condsearch.store.folder import INDEX_FILE, IndexStore

    store = IndexStore(index_dir)
    victim = index_dir / store.find(SPORT) / INDEX_FILE
    victim.write_bytes(victim.read_bytes()[:-8] + b"garbage!")
    response = post(client, query="q", condition=SPORT)
    assert response.status_code == 500 and "checksum" in response.json()["error"]
    assert post(client, query="q", condition=COLOUR).status_code == 200


def test_a_corrupt_manifest_is_named_not_taken_for_a_missing_index(index_dir: Path) -> None:
    from condsearch.store.folder import MANIFEST, IndexStore

    (index_dir / IndexStore(index_dir).find(SPORT) / MANIFEST).write_text("{not json")
    with serve(index_dir) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        response = post(http, query="q", condition=SPORT)
        assert response.status_code == 404 and "1 index is damaged" in response.json()["error"]
        assert "corrupt manifest" in response.json()["error"]
        assert post(http, query="q", condition=COLOUR).status_code == 200


@pytest.mark.parametrize(
    ("reason", "expected"), [("\n  why  \nmore", "why"), ("", "error"), (ValueError(), "ValueError")]
)
def test_an_error_body_is_the_first_non_blank_line(reason: BaseException | str, expected: str) -> None:
    from condsearch.serve.app import _error

    assert json.loads(_error(400, reason).body)["error"] == expected


def test_the_server_runs_onnxruntime_and_answers_as_query_json(index_dir: Path) -> None:
    queries = [SENTENCES[2], SENTENCES[6], "a red shirt"]
    with serve(index_dir) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        body = post(http, queries=queries, condition=COLOUR, k=5).json()  # the first load writes the ONNX export
        one = post(http, query=SENTENCES[1], condition=COLOUR, k=4).json()
        health = http.get("/health").json()
    assert health["backend"] == "auto"
    assert [m["backend"] for m in health["models"]] == ["onnxruntime"]
    assert health["threads"]["encode"] >= 1 and health["threads"]["search"] >= 1
    # `query` now finds the export the server wrote and runs it too: the same answers, to the last digit
    assert body["results"] == cli_answers(index_dir, COLOUR, 5, *queries)
    assert one["results"] == cli_answers(index_dir, COLOUR, 4, SENTENCES[1])


def test_long_queries_are_cut_yet_answered_as_query_json(index_dir: Path) -> None:
    """Queries past the model's tokens are cut before the server tokenises them; the answers are `query`'s."""
    filler = " and then the crowd watched the game in the park" * 80  # ~4,000 characters: past 128 tokens
    queries = [SENTENCES[2] + filler, SENTENCES[5] + filler, "a red shirt"]
    with serve(index_dir) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        body = post(http, queries=queries, condition=COLOUR, k=4).json()
    assert [a["query"] for a in body["results"]] == queries  # named as sent, not as cut
    assert body["results"] == cli_answers(index_dir, COLOUR, 4, *queries)


def test_backend_torch_forces_transformers(index_dir: Path) -> None:
    with serve(index_dir, backend="torch", threads=1) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        body = post(http, query=SENTENCES[2], condition=COLOUR, k=3).json()
        health = http.get("/health").json()
    assert health["backend"] == "torch" and health["threads"]["encode"] == 1
    assert [m["backend"] for m in health["models"]] == ["torch"]
    [want] = cli_answers(index_dir, COLOUR, 3, SENTENCES[2])
    got = body["results"][0]["results"]
    assert [h["id"] for h in got] == [h["id"] for h in want["results"]]
    assert [h["score"] for h in got] == pytest.approx([h["score"] for h in want["results"]], abs=1e-5)


def test_models_onnx_does_not_cover_keep_torch(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    folder = tmp_path / "mean"
    flags = ["--model", tiny_bert_dir, "--head", "none", "--pooling", "mean", "--index-dir", folder]
    run("index", corpus_file, "-c", COLOUR, *flags)
    with serve(folder) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert post(http, query=SENTENCES[2], condition=COLOUR, k=2).status_code == 200
        assert [m["backend"] for m in http.get("/health").json()["models"]] == ["torch"]


def test_only_the_cpu_runs_onnxruntime() -> None:
    from condsearch.model.policy import runs_on_cpu

    assert runs_on_cpu("cpu") and not runs_on_cpu("cuda") and not runs_on_cpu("cuda:0,cuda:1")


def test_serve_help_shows_the_backend_and_threads() -> None:
    out = run("serve", "--help").output
    assert "--backend [auto|torch]" in out and "--search-threads" in out


def test_another_quantisation_is_refused_before_onnxruntime_loads(index_dir: Path) -> None:
    cli_answers(index_dir, COLOUR, 1, SENTENCES[2])  # writes the export the server would otherwise run
    with serve(index_dir, quantize="int8") as server, httpx.Client(base_url=server.url, timeout=30) as http:
        response = post(http, query=SENTENCES[2], condition=COLOUR)
    assert response.status_code >= 400 and "--quantize none, not int8" in response.json()["error"]


def test_an_ivf_or_hnsw_index_is_searched_on_one_thread_unless_asked(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from condsearch.base.faiss_indexes import DEFAULT_SEARCH_THREADS
    from condsearch.query import resident as engine

    folder = tmp_path / "indexes"
    run("index", corpus_file, "-c", COLOUR, "--model", tiny_bert_dir, "--head", "none", "--index-dir", folder)
    run("index", corpus_file, "-c", SPORT, "--model", tiny_bert_dir, "--head", "none", "--index-dir", folder,
        "--index-factory", "HNSW8")  # fmt: skip
    seen: list[int] = []
    monkeypatch.setattr(engine, "set_search_threads", seen.append)
    with serve(folder) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert post(http, query=SENTENCES[2], condition=SPORT).status_code == 200
        assert seen[-1] == 1  # the graph's walk: one thread
        assert post(http, query=SENTENCES[2], condition=COLOUR).status_code == 200
        assert seen[-1] == DEFAULT_SEARCH_THREADS  # a flat scan: FAISS's default, every core
        threads = http.get("/health").json()["threads"]
        assert threads["search"] == DEFAULT_SEARCH_THREADS and threads["search_ivf_hnsw"] == 1
    with serve(folder, search_threads=2) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert post(http, query=SENTENCES[2], condition=SPORT).status_code == 200
        assert seen[-1] == 2  # asked: every index gets it


def test_walks_names_the_ivf_and_hnsw_factories() -> None:
    from condsearch.base.ann import walks_lists_or_graph

    assert walks_lists_or_graph("HNSW32") and walks_lists_or_graph("IVF4096,Flat") and walks_lists_or_graph("IVF64,PQ8")
    assert not any(walks_lists_or_graph(f) for f in ("Flat", "SQ8", "PQ16", "milvus", ""))


def test_search_threads_reach_faiss_on_the_searching_thread(index_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from condsearch.query import resident as engine

    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(engine, "set_search_threads", lambda n: seen.append((threading.current_thread().name, n)))
    with serve(index_dir, search_threads=1) as server, httpx.Client(base_url=server.url) as http:
        assert post(http, query=SENTENCES[2], condition=COLOUR).status_code == 200
        assert http.get("/health").json()["threads"]["search"] == 1
    assert seen and all(n == 1 and name != threading.main_thread().name for name, n in seen)
