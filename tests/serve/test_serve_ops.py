"""The server's operational conventions (issue 59, item 4).

/metrics in Prometheus's text format (one registry per app); /health and /metrics open without the key
unless --private-health; X-Request-ID on every answer and in every log line; --log-format json; CORS only
with --cors-origin; GET /v1/models in OpenAI's shape (a router corpus named by its router); OpenAI's
error shape on /v1 with `param`; every status a route answers listed in the OpenAPI schema.
"""

from __future__ import annotations

import io
import json
import logging
import logging.config
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from condsearch.cli import main
from condsearch.corpus.reader import read_corpus
from condsearch.ingest.chunks import index_corpus
from condsearch.serve.access import JsonFormatter, RequestIdFilter, log_config
from condsearch.serve.config import API_KEY_ENV, ServeConfig
from condsearch.serve.server import BackgroundServer, build_app
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES
from tests.csr_corpus import write_csr_corpus
from tests.query.test_on_demand import COLOUR, SPORT, index
from tests.serve.test_serve_embeddings import hash_vectorizer
from tests.serve.test_serve_hostile import make_app

ORIGIN = "https://app.example"
HEX_ID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture
def store(tmp_path: Path, corpus_file: Path) -> IndexStore:
    store = IndexStore(tmp_path / "indexes")
    index_corpus(read_corpus(corpus_file), [COLOUR], hash_vectorizer(), store, corpus_name="corpus")
    return store


def client(store: IndexStore, **settings: Any) -> TestClient:
    return TestClient(make_app(store, batch_window_ms=0.0, **settings), raise_server_exceptions=False)


def metrics_of(http: TestClient | httpx.Client, **headers: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Return /metrics' samples, {(name, labels): value}, as Prometheus's own parser reads them."""
    response = http.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def sample(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


# ---------------------------------------------------------------- /metrics


def test_metrics_count_requests_latency_batches_and_resident_indexes(store: IndexStore) -> None:
    with client(store) as http:
        assert sample(metrics_of(http), "condsearch_indexes_resident") == 0
        for _ in range(2):
            answer = http.post("/query", json={"queries": SENTENCES[:3], "condition": COLOUR, "k": 2})
            assert answer.status_code == 200, answer.text
        assert http.post("/query", json={"query": "q"}).status_code == 422
        assert http.get("/no/such/path").status_code == 404
        assert http.get("/builds/abc").status_code == 404
        got = metrics_of(http)

    requests = "condsearch_http_requests_total"
    assert sample(got, requests, route="/query", method="POST", status="200") == 2
    assert sample(got, requests, route="/query", method="POST", status="422") == 1
    assert sample(got, requests, route="other", method="GET", status="404") == 1  # no label per unknown path
    assert sample(got, requests, route="/builds/{job_id}", method="GET", status="404") == 1  # the template
    latency = "condsearch_http_request_duration_seconds"
    assert sample(got, f"{latency}_count", route="/query") == 3
    assert 0 < sample(got, f"{latency}_sum", route="/query") < 60
    assert sample(got, f"{latency}_bucket", route="/query", le="+Inf") == 3
    # two batches of three queries each (the batch window is 0 and the requests came one after the other)
    assert sample(got, "condsearch_batch_queries_count") == 2
    assert sample(got, "condsearch_batch_queries_sum") == 6
    assert sample(got, "condsearch_indexes_resident") == 1 and sample(got, "condsearch_models_resident") == 1
    for event in ("started", "finished", "failed"):  # shown before any build
        assert ("condsearch_builds_total", frozenset({("event", event)})) in got


def test_each_app_counts_in_its_own_registry(store: IndexStore) -> None:
    with client(store) as first, client(store) as second:
        for _ in range(3):
            first.get("/indexes")
        second.get("/indexes")
        requests = "condsearch_http_requests_total"
        assert sample(metrics_of(first), requests, route="/indexes", method="GET", status="200") == 3
        assert sample(metrics_of(second), requests, route="/indexes", method="GET", status="200") == 1


# ---------------------------------------------------------------- /health and /metrics behind a key


def test_health_and_metrics_answer_without_the_key_and_data_does_not(store: IndexStore) -> None:
    with client(store, api_key="k3y") as http:
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert "condsearch_http_requests_total" in http.get("/metrics").text
        assert http.get("/indexes").status_code == 401
        assert http.post("/query", json={"query": "q", "condition": COLOUR}).status_code == 401
        assert http.post("/health").status_code == 401  # only reading them is open
        assert http.get("/indexes", headers={"X-API-Key": "k3y"}).status_code == 200


def test_private_health_asks_the_key_of_health_and_metrics(store: IndexStore) -> None:
    with client(store, api_key="k3y", private_health=True) as http:
        for path in ("/health", "/metrics"):
            assert http.get(path).status_code == 401, path
            assert http.get(path, headers={"Authorization": "Bearer k3y"}).status_code == 200, path


# ---------------------------------------------------------------- X-Request-ID


def test_a_request_id_is_echoed_or_made_on_every_answer(store: IndexStore) -> None:
    with client(store, api_key="k3y", max_body_bytes=1000) as http:
        given = http.get("/health", headers={"X-Request-ID": "trace-42:abc"})
        assert given.headers["x-request-id"] == "trace-42:abc"
        made = [http.get("/health").headers["x-request-id"] for _ in range(2)]
        assert all(HEX_ID.fullmatch(m) for m in made) and made[0] != made[1]
        for unfit in ("has space", "x" * 129, "tab\there", ""):
            answered = http.get("/health", headers={"X-Request-ID": unfit}).headers["x-request-id"]
            assert HEX_ID.fullmatch(answered) and answered != unfit, unfit
        # refusals of every layer carry it: the key (401), the body limit (413), no route (404)
        refused = [
            http.get("/indexes", headers={"X-Request-ID": "r-401"}),
            http.post("/query", content=b"x" * 2000, headers={"X-Request-ID": "r-413", "X-API-Key": "k3y"}),
            http.get("/nowhere", headers={"X-Request-ID": "r-404", "X-API-Key": "k3y"}),
        ]
        assert [(r.status_code, r.headers["x-request-id"]) for r in refused] == [
            (401, "r-401"),
            (413, "r-413"),
            (404, "r-404"),
        ]
        assert refused[0].headers["x-frame-options"] == "DENY"  # the security headers still wrap it


def test_a_keyless_servers_host_refusal_carries_a_request_id(store: IndexStore) -> None:
    with BackgroundServer(make_app(store)) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        refused = http.get("/indexes", headers={"Host": "evil.example", "X-Request-ID": "r-421"})
        assert refused.status_code == 421 and refused.headers["x-request-id"] == "r-421"


# ---------------------------------------------------------------- log lines


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """condsearch's log records, as `--log-format json` writes them, into a buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("condsearch")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def test_json_log_lines_parse_and_name_their_request(store: IndexStore, json_lines: io.StringIO) -> None:
    with client(store) as http:
        answer = http.post("/query", json={"query": "q", "condition": COLOUR}, headers={"X-Request-ID": "req-1"})
        assert answer.status_code == 200
        http.get("/nowhere")
    lines = [json.loads(line) for line in json_lines.getvalue().splitlines()]
    assert lines and all({"time", "level", "message", "request_id"} <= line.keys() for line in lines)
    access = [line for line in lines if line["logger"] == "condsearch.serve.access"]
    query = next(line for line in access if line["path"] == "/query")
    assert query["request_id"] == "req-1" and query["method"] == "POST" and query["status"] == 200
    assert query["level"] == "info" and isinstance(query["ms"], float) and query["ms"] >= 0
    other = next(line for line in access if line["path"] == "/nowhere")
    assert other["status"] == 404 and HEX_ID.fullmatch(other["request_id"])
    # a line logged while the request ran, on a worker thread (loading the index), names the request too
    loaded = [line for line in lines if line["logger"] == "condsearch.query.resident"]
    assert loaded and all(line["request_id"] == "req-1" for line in loaded), loaded


@pytest.fixture
def logging_restored() -> Iterator[None]:
    names = ("condsearch", "uvicorn", "uvicorn.access")
    kept = {n: (lg.handlers[:], lg.level, lg.propagate) for n in names if (lg := logging.getLogger(n))}
    try:
        yield
    finally:
        for name, (handlers, level, propagate) in kept.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_the_servers_log_config_names_each_request(
    store: IndexStore, log_format: str, logging_restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logging.config.dictConfig(log_config(log_format))  # type: ignore[arg-type]
    with client(store) as http:
        http.get("/health", headers={"X-Request-ID": "abc"})
    lines = [line for line in capsys.readouterr().err.splitlines() if "/health" in line]
    assert len(lines) == 1, lines
    if log_format == "json":
        line = json.loads(lines[0])
        assert (line["request_id"], line["path"], line["status"]) == ("abc", "/health", 200)
    else:
        assert "[abc] GET /health 200" in lines[0]


def test_a_path_cannot_forge_a_text_log_line(store: IndexStore, logging_restored: None, capsys: Any) -> None:
    logging.config.dictConfig(log_config("text"))
    with client(store) as http:
        http.get("/a%0Afake%20line")
    err = capsys.readouterr().err
    assert "/a\\nfake line 404" in err and "\nfake line" not in err


# ---------------------------------------------------------------- CORS


def preflight(http: TestClient, origin: str = ORIGIN) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-api-key",
    }
    return http.options("/query", headers=headers)


def test_cors_is_off_unless_an_origin_is_given(store: IndexStore) -> None:
    with client(store) as http:
        refused = preflight(http)
        assert refused.status_code == 405 and "access-control-allow-origin" not in refused.headers
        posted = http.post("/query", json={"query": "q", "condition": COLOUR}, headers={"Origin": ORIGIN})
        assert posted.status_code == 200 and "access-control-allow-origin" not in posted.headers


def test_cors_origins_get_preflights_and_others_do_not(store: IndexStore) -> None:
    with client(store, api_key="k3y", cors_origins=(ORIGIN, "http://localhost:3000")) as http:
        allowed = preflight(http)  # a preflight carries no key: answered before the key is asked for
        assert allowed.status_code == 200, allowed.text
        assert allowed.headers["access-control-allow-origin"] == ORIGIN
        assert "x-api-key" in allowed.headers["access-control-allow-headers"].lower()
        assert "POST" in allowed.headers["access-control-allow-methods"]
        assert "access-control-allow-origin" not in preflight(http, "https://evil.example").headers
        posted = http.post(
            "/query", json={"query": "q", "condition": COLOUR}, headers={"Origin": ORIGIN, "X-API-Key": "k3y"}
        )
        assert posted.status_code == 200 and posted.headers["access-control-allow-origin"] == ORIGIN
        assert "x-request-id" in posted.headers["access-control-expose-headers"].lower()


# ---------------------------------------------------------------- OpenAI's shapes


def openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error.keys() == {"message", "type", "param", "code"}, error
    assert error["code"] is None or isinstance(error["code"], str), error
    return error


def test_v1_errors_are_openais_shape_and_name_the_field(store: IndexStore) -> None:
    ok = {"input": ["a text"], "model": "corpus", "condition": COLOUR}
    with client(store, api_key="k3y") as http:
        key = {"X-API-Key": "k3y"}
        for empty in ([], "", ["fine", "  "]):
            error = openai_error(http.post("/v1/embeddings", json={**ok, "input": empty}, headers=key), 400)
            assert (
                error["param"] == "input" and error["type"] == "invalid_request_error" and "empty" in error["message"]
            )
        cases = [
            ({"input": ["a"], "model": "corpus"}, 400, "condition"),
            ({**ok, "input": [[101, 102]]}, 400, "input"),
            ({**ok, "dimensions": 8}, 400, "dimensions"),
            ({**ok, "conditon": "x"}, 422, "conditon"),
            ({**ok, "encoding_format": "hex"}, 422, "encoding_format"),
            ({**ok, "input": ["a", 1]}, 422, "input"),
            ({**ok, "model": "nobody"}, 200, None),  # one model served: any name takes it
        ]
        for body, status, param in cases:
            response = http.post("/v1/embeddings", json=body, headers=key)
            if status == 200:
                assert response.status_code == 200, response.text
                continue
            assert openai_error(response, status)["param"] == param, body
        unauthorised = openai_error(http.post("/v1/embeddings", json=ok), 401)
        assert unauthorised["type"] == "authentication_error" and unauthorised["code"] == "invalid_api_key"
        missing = openai_error(http.get("/v1/models/nobody", headers=key), 404)
        assert (missing["param"], missing["code"]) == ("model", "model_not_found")
        # /query keeps its one-line errors
        assert isinstance(http.post("/query", json={"query": ""}, headers=key).json()["error"], str)


def test_the_openai_client_lists_models_and_reads_errors(store: IndexStore) -> None:
    openai = pytest.importorskip("openai")
    with BackgroundServer(make_app(store, api_key="k3y")) as server:
        api = openai.OpenAI(base_url=server.url + "/v1", api_key="k3y", max_retries=0, timeout=30)
        models = api.models.list()
        assert [m.id for m in models.data] == ["test/hash"]
        (card,) = models.data
        assert card.object == "model" and card.owned_by == "condsearch" and card.created > 1_600_000_000
        assert api.models.retrieve("test/hash").id == "test/hash"  # an id with a slash
        made = api.embeddings.create(input=["a text"], model=card.id, extra_body={"condition": COLOUR})
        assert made.model == card.id
        with pytest.raises(openai.BadRequestError) as refused:
            api.embeddings.create(input=[], model=card.id, extra_body={"condition": COLOUR})
        assert refused.value.param == "input" and refused.value.code is None
        with pytest.raises(openai.NotFoundError):
            api.models.retrieve("nobody")


def test_a_router_corpus_is_named_by_its_router(tmp_path: Path, tiny_bert_dir: Path) -> None:
    """/v1/models, /v1/embeddings' model and /health name the router; /metrics counts a build on demand."""
    folder = tmp_path / "idx"
    index(write_csr_corpus(tmp_path / "c.parquet"), folder, tiny_bert_dir, COLOUR)
    config = ServeConfig(index_dir=folder, device="cpu", reload_interval_s=0.05)
    with BackgroundServer(build_app(config)) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        named = f"{tiny_bert_dir.name}+router:none"
        listed = http.get("/v1/models").json()
        assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == [named]
        made = http.post("/v1/embeddings", json={"input": "a dog", "model": named, "condition": COLOUR})
        assert made.status_code == 200 and made.json()["model"] == named, made.text
        (model,) = http.get("/health").json()["models"]
        assert model["router"] == "none" and "profile" not in model, model
        built = http.post("/query", json={"query": "a dog", "condition": SPORT, "k": 2})  # built in the request
        assert built.status_code == 200, built.text
        got = metrics_of(http)
    assert sample(got, "condsearch_builds_total", event="started") == 1
    assert sample(got, "condsearch_builds_total", event="finished") == 1
    assert sample(got, "condsearch_builds_total", event="failed") == 0


# ---------------------------------------------------------------- OpenAPI


def test_openapi_lists_every_status_a_route_answers(store: IndexStore) -> None:
    schema = make_app(store).openapi()
    paths = schema["paths"]

    def statuses(path: str, method: str) -> set[int]:
        return {int(s) for s in paths[path][method]["responses"]}

    assert {200, 202, 400, 401, 404, 408, 409, 413, 421, 422, 429, 500, 503, 507} <= statuses("/query", "post")
    assert {200, 400, 401, 404, 408, 409, 413, 422, 500, 503} <= statuses("/v1/embeddings", "post")
    assert {200, 404, 405, 409, 401} <= statuses("/indexes/{corpus}", "delete")
    assert {200, 404, 401} <= statuses("/builds/{job_id}", "get")
    for path in ("/health", "/metrics", "/indexes", "/v1/models"):
        assert {200, 401, 421, 500} <= statuses(path, "get"), path
    error = paths["/v1/embeddings"]["post"]["responses"]["400"]["content"]["application/json"]["schema"]
    assert error["$ref"].endswith("/OpenAIError")
    assert "model" not in paths["/query"]["post"]["responses"]["202"].get("content", {}).get("application/json", {})


# ---------------------------------------------------------------- the command line


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[ServeConfig]:
    import condsearch.serve.server as server

    configs: list[ServeConfig] = []
    monkeypatch.setattr(server, "run_server", configs.append)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    return configs


def test_the_flags_reach_the_config(started: list[ServeConfig], tmp_path: Path) -> None:
    args = ["serve", "--index-dir", str(tmp_path), "--log-format", "json", "--private-health"]
    args += ["--cors-origin", ORIGIN, "--cors-origin", "http://localhost:3000"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (config,) = started
    assert config.log_format == "json" and config.private_health
    assert config.cors_origins == (ORIGIN, "http://localhost:3000")
    defaults = CliRunner().invoke(main, ["serve", "--index-dir", str(tmp_path)])
    assert defaults.exit_code == 0 and started[1] == ServeConfig(index_dir=tmp_path)  # one source of defaults
    for bad in (["--cors-origin", "app.example"], ["--cors-origin", f"{ORIGIN}/path"], ["--log-format", "xml"]):
        refused = CliRunner().invoke(main, ["serve", "--index-dir", str(tmp_path), *bad])
        assert refused.exit_code == 2 and "Traceback" not in refused.output, refused.output
    shown = CliRunner().invoke(main, ["serve", "--help"]).output
    assert all(flag in shown for flag in ("--log-format", "--cors-origin", "--private-health"))
