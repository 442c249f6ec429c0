"""Hostile requests to the HTTP API: each gets a one-line 4xx of its own, and nobody else's answer suffers.

The hash encoder stands in for a model (the tiny BERT where its tokenizer is the point); the app
runs in-process (TestClient) or under uvicorn on a free loopback port (BackgroundServer) where
the socket matters: body and header limits, concurrent batches.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from condsearch.base.faiss_indexes import SearchResult
from condsearch.corpus.reader import read_corpus
from condsearch.ingest.chunks import index_corpus
from condsearch.model.encoders.base import Pair
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.resident import QueryJob, Resident
from condsearch.serve.app import create_app
from condsearch.serve.batching import MicroBatcher
from condsearch.serve.config import ServeConfig
from condsearch.serve.refusals import MAX_K
from condsearch.serve.server import BackgroundServer
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES, HashEncoder, WriteCorpus, assert_same_ranking

COLOUR = "color of the dress"
SPORT = "the sport being played"
POISON = "a query the model chokes on"
IDS = [f"s{i}" for i in range(len(SENTENCES))]


class PoisonedEncoder(HashEncoder):
    """The hash encoder, failing every batch that holds POISON (as a model that chokes on one input)."""

    def encode_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        if any(sentence == POISON for _, sentence in pairs):
            raise RuntimeError("the model choked")
        return super().encode_batch(pairs)


@pytest.fixture
def store(tmp_path: Path, corpus_file: Path) -> IndexStore:
    """COLOUR and SPORT indexed over the test sentences with the (poisoned) hash encoder."""
    store = IndexStore(tmp_path / "indexes")
    index_corpus(read_corpus(corpus_file), [COLOUR, SPORT], hash_vectorizer(), store, corpus_name="corpus")
    return store


def hash_vectorizer() -> Vectorizer:
    return Vectorizer(PoisonedEncoder(), None, "none", "")


def make_app(store: IndexStore, vectorizer: Vectorizer | None = None, **settings: Any):  # noqa: ANN201
    vec = vectorizer or hash_vectorizer()
    resident = Resident(store, lambda _manifest: vec, reload_interval_s=0.05)
    return create_app(resident, ServeConfig(index_dir=store.root, **settings))


@pytest.fixture
def client(store: IndexStore) -> Iterator[TestClient]:
    with TestClient(make_app(store, batch_window_ms=0.0), raise_server_exceptions=False) as http:
        yield http


def post_json(http: httpx.Client | TestClient, body: object, **headers: str | bytes) -> httpx.Response:
    """POST body as JSON text, escaping what UTF-8 cannot carry (a lone surrogate becomes \\ud800)."""
    content = json.dumps(body).encode("ascii")
    return http.post("/query", content=content, headers={"content-type": "application/json", **headers})


def assert_refused(response: httpx.Response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error, str) and error and "\n" not in error
    for word in words:
        assert word in error, error
    return error


def ranking(response: httpx.Response) -> tuple[np.ndarray, np.ndarray]:
    """Return an answer's (scores, ids), each (n_queries, k), as :func:`tests.conftest.assert_same_ranking` takes."""
    assert response.status_code == 200, response.text
    answers = response.json()["results"]
    return (
        np.array([[hit["score"] for hit in a["results"]] for a in answers]),
        np.array([[hit["id"] for hit in a["results"]] for a in answers]),
    )


def top_ids(response: httpx.Response) -> list[list[str]]:
    assert response.status_code == 200, response.text
    return [[hit["id"] for hit in answer["results"]] for answer in response.json()["results"]]


# ---------------------------------------------------------------- 2. text that is not Unicode


@pytest.mark.parametrize("text", ["\ud800", "a girl \udfff in red", "nul \x00 inside"])
@pytest.mark.parametrize("field", ["query", "queries", "condition", "corpus"])
def test_text_that_is_not_unicode_is_a_422(client: TestClient, field: str, text: str) -> None:
    body: dict[str, object] = {"query": "a girl in a red dress", "condition": COLOUR}
    if field == "queries":
        del body["query"]
        body["queries"] = ["fine", text]
    else:
        body[field] = text
    assert_refused(post_json(client, body), 422, field)
    assert client.get("/health").json()["status"] == "ok"


def test_an_unknown_key_that_is_not_unicode_is_a_4xx(client: TestClient) -> None:
    assert_refused(post_json(client, {"query": "q", "condition": COLOUR, "\ud800": 1}), 422)
    assert_refused(post_json(client, {"query": "q", "condition": "mood \ud800"}), 422)


def test_a_bad_request_fails_no_request_batched_with_it(
    tmp_path: Path, corpus_file: Path, tiny_encoder: object
) -> None:
    # the case: the tokenizer raises on a lone surrogate, and every request in its batch got a 500
    vec = Vectorizer(tiny_encoder, None, "none", "")  # type: ignore[arg-type]
    store = IndexStore(tmp_path / "indexes")
    index_corpus(read_corpus(corpus_file), [COLOUR], vec, store, corpus_name="corpus")
    app = make_app(store, vec, batch_window_ms=150.0)
    with BackgroundServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        alone = {q: ranking(post_json(http, {"query": q, "condition": COLOUR, "k": 3})) for q in SENTENCES}
        bodies = [
            {"query": SENTENCES[i // 2] if i % 2 == 0 else f"bad \ud800 {i}", "condition": COLOUR, "k": 3}
            for i in range(16)
        ]
        with ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(lambda b: post_json(http, b), bodies))
    for body, response in zip(bodies, answers, strict=True):
        if "\ud800" in str(body["query"]):
            assert_refused(response, 422, "query")
        else:  # the same rows as alone, up to rows that tie within float32 rounding (a batch is another product)
            assert_same_ranking(ranking(response), alone[str(body["query"])])


def test_a_request_failing_inside_a_batch_fails_alone(store: IndexStore) -> None:
    # a request that passes validation and still breaks the model: the batch is answered again
    # request by request, so only that request gets its 500
    with BackgroundServer(make_app(store, batch_window_ms=150.0)) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            alone = {q: top_ids(post_json(http, {"query": q, "condition": COLOUR})) for q in SENTENCES}
            queries = [POISON if i % 3 == 1 else SENTENCES[i % 8] for i in range(18)]
            with ThreadPoolExecutor(len(queries)) as pool:
                answers = list(pool.map(lambda q: post_json(http, {"query": q, "condition": COLOUR}), queries))
            batches = http.get("/health").json()["batches"]
    assert batches["largest"] > 1  # the poisoned requests really were batched with good ones
    for q, response in zip(queries, answers, strict=True):
        if q == POISON:
            assert_refused(response, 500, "internal error")
        else:
            assert top_ids(response) == alone[q]


def test_the_engine_answers_a_failed_group_job_by_job(store: IndexStore) -> None:
    resident = Resident(store, lambda _manifest: hash_vectorizer(), reload_interval_s=0.0)
    colour, sport = resident.get(COLOUR), resident.get(SPORT)
    jobs = [
        QueryJob(colour, (SENTENCES[0],), 3),
        QueryJob(colour, (SENTENCES[1], POISON), 2),
        QueryJob(colour, (SENTENCES[2], SENTENCES[3]), 4),
        QueryJob(sport, (SENTENCES[4],), 1),
    ]
    answers = resident.answer_batch(jobs)
    assert isinstance(answers[1], RuntimeError)
    for j in (0, 2, 3):
        found, [alone] = answers[j], resident.answer_batch([jobs[j]])
        assert not isinstance(found, BaseException) and not isinstance(alone, BaseException)
        np.testing.assert_array_equal(found.result.ids, alone.result.ids)


def test_the_batcher_answers_a_failed_batch_item_by_item() -> None:
    gate = threading.Event()
    calls: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        gate.wait(5)
        calls.append(list(items))
        if -1 in items:
            raise RuntimeError("one bad item")
        return [i * 10 for i in items]

    with MicroBatcher(run, max_batch=8, window_s=0.05) as batcher:
        futures = [batcher.submit(i) for i in (1, -1, 2, 3)]
        gate.set()
        assert [f.result(5) for f in (futures[0], futures[2], futures[3])] == [10, 20, 30]
        with pytest.raises(RuntimeError, match="one bad item"):
            futures[1].result(5)
    assert calls[0] == [1, -1, 2, 3] and sorted(calls[1:]) == [[-1], [1], [2], [3]]


# ---------------------------------------------------------------- 9. size limits and slow clients


def test_an_oversize_body_is_a_413(store: IndexStore) -> None:
    limit = 64 * 1024
    with BackgroundServer(make_app(store, max_body_bytes=limit)) as server:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            big = json.dumps({"query": "a girl " * limit, "condition": COLOUR}).encode()
            assert_refused(http.post("/query", content=big), 413, str(limit))

            def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
                for start in range(0, len(big), 8192):
                    yield big[start : start + 8192]

            assert_refused(http.post("/query", content=chunks()), 413)
            fits = json.dumps({"query": "a girl " * 100, "condition": COLOUR}).encode()
            assert http.post("/query", content=fits, headers={"content-type": "application/json"}).status_code == 200
    assert ServeConfig.max_body_bytes == 1024 * 1024


def test_an_overlong_query_or_condition_is_a_422(client: TestClient) -> None:
    n = ServeConfig.max_text_chars
    assert n == 10_000
    assert_refused(post_json(client, {"query": "x" * (n + 1), "condition": COLOUR}), 422, f"{n:,} characters")
    assert_refused(post_json(client, {"queries": ["ok", "y" * (n + 1)], "condition": COLOUR}), 422, "characters")
    assert_refused(post_json(client, {"query": "ok", "condition": "c" * (n + 1)}), 422, "condition")
    assert post_json(client, {"query": "z" * n, "condition": COLOUR}).status_code == 200


def test_a_small_request_is_answered_while_a_big_one_is_refused(store: IndexStore) -> None:
    big = json.dumps({"query": "a girl in a red dress " * 500_000, "condition": COLOUR}).encode()  # 11 MB
    with BackgroundServer(make_app(store)) as server:
        with httpx.Client(base_url=server.url, timeout=60) as http, httpx.Client(base_url=server.url) as other:
            post_json(other, {"query": "warm up", "condition": COLOUR})
            with ThreadPoolExecutor(1) as pool:
                refused = pool.submit(http.post, "/query", content=big, headers={"content-type": "application/json"})
                started = time.monotonic()
                for i, q in enumerate(SENTENCES):  # a sentence of the corpus finds itself first
                    assert top_ids(post_json(other, {"query": q, "condition": COLOUR, "k": 1})) == [[IDS[i]]]
                assert time.monotonic() - started < 10
                assert_refused(refused.result(60), 413, "too large")
            assert post_json(other, {"query": "still here", "condition": COLOUR}).status_code == 200


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_a_client_that_stalls_is_disconnected(store: IndexStore) -> None:
    with BackgroundServer(make_app(store, head_timeout_s=0.3, body_timeout_s=0.3)) as server:
        started = time.monotonic()
        with _raw(server.url) as silent, _raw(server.url) as half_head, _raw(server.url) as half_body:
            host = server.url.removeprefix("http://").encode()  # a keyless loopback server checks it (issue 58)
            half_head.sendall(b"POST /query HTTP/1.1\r\nHost: " + host + b"\r\nContent-Type: application/json\r\n")
            half_body.sendall(b"POST /query HTTP/1.1\r\nHost: " + host + b'\r\nContent-Length: 100\r\n\r\n{"query": ')
            assert _read_until_closed(silent) == b""  # nothing asked, nothing answered: just closed
            assert _read_until_closed(half_head) == b""
            answer = _read_until_closed(half_body)
        assert time.monotonic() - started < 8
        assert answer.startswith(b"HTTP/1.1 408") and b"too slowly" in answer, answer
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert post_json(http, {"query": "still here", "condition": COLOUR}).status_code == 200


# ---------------------------------------------------------------- 13c, 13d: API key bytes, JSON types


def test_a_non_ascii_api_key_is_compared_as_utf8(store: IndexStore) -> None:
    # over a real socket: the test client re-encodes header bytes that are not UTF-8
    def server(key: str) -> BackgroundServer:
        return BackgroundServer(make_app(store, api_key=key))

    key = "clé-ßüñ-密钥"
    with server(key) as up, httpx.Client(base_url=up.url, timeout=30) as http:
        assert http.get("/indexes", headers={"X-API-Key": key.encode()}).status_code == 200
        assert http.get("/indexes", headers={"Authorization": b"Bearer " + key.encode()}).status_code == 200
        assert post_json(http, {"query": "q", "condition": COLOUR}, **{"X-API-Key": key.encode()}).status_code == 200
        for wrong in (key.encode()[:-1], "clé-ßüñ".encode("latin-1"), b"\xff\xfe\x80", b""):
            assert_refused(http.get("/indexes", headers={"X-API-Key": wrong}), 401, "API key")
    latin = "clé"
    with server(latin) as up, httpx.Client(base_url=up.url, timeout=30) as http:
        assert http.get("/indexes", headers={"X-API-Key": latin.encode()}).status_code == 200
        assert_refused(http.get("/indexes", headers={"X-API-Key": latin.encode("latin-1")}), 401)
    # a key from an argv or environment that is not UTF-8 (click hands it over surrogate-escaped)
    raw = b"k\xe9y".decode("utf-8", "surrogateescape")
    with server(raw) as up, httpx.Client(base_url=up.url, timeout=30) as http:
        assert http.get("/indexes", headers={"X-API-Key": b"k\xe9y"}).status_code == 200
        assert_refused(http.get("/indexes", headers={"X-API-Key": "kéy".encode()}), 401)


@pytest.mark.parametrize("k", [True, False, "5", 5.0, 2.5, None, [5], {"n": 5}, "many"])
def test_k_must_be_a_json_integer(client: TestClient, k: object) -> None:
    assert_refused(post_json(client, {"query": "q", "condition": COLOUR, "k": k}), 422, "k")


@pytest.mark.parametrize(
    "body",
    [
        {"queries": ["ok", 5], "condition": COLOUR},
        {"queries": "not a list", "condition": COLOUR},
        {"queries": [["nested"]], "condition": COLOUR},
        {"query": 5, "condition": COLOUR},
        {"query": True, "condition": COLOUR},
        {"query": "q", "condition": 7},
        {"query": "q", "condition": COLOUR, "corpus": 5},
        {"query": "q", "condition": COLOUR, "corpus": ["corpus"]},
    ],
)
def test_texts_must_be_json_strings(client: TestClient, body: dict) -> None:
    assert_refused(post_json(client, body), 422)


def test_k_may_be_any_integer_from_1_to_max_k(client: TestClient) -> None:
    body = post_json(client, {"query": "q", "condition": COLOUR, "k": MAX_K}).json()
    assert (body["k"], body["k_requested"], body["k_capped"]) == (len(SENTENCES), MAX_K, True)
    for k in (MAX_K + 1, 2**70):  # the page's box says 1000 at most, and so does the server (issue 59)
        assert_refused(post_json(client, {"query": "q", "condition": COLOUR, "k": k}), 422, "k:", "1000")


# ---------------------------------------------------------------- 5. the k an approximate index returned


def test_k_counts_the_results_found_not_those_asked(store: IndexStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import condsearch.store.searchable as engine  # where every FAISS index the server answers from is searched

    real = engine.search

    def finds_three(searcher: object, queries: np.ndarray, k: int) -> SearchResult:
        # as an approximate index can: FAISS pads what it did not find with id -1
        found = real(searcher, queries, k)  # type: ignore[arg-type]
        ids, scores = found.ids.copy(), found.scores.copy()
        ids[:, 3:], scores[:, 3:] = -1, -3.4e38
        return SearchResult(scores, ids)

    monkeypatch.setattr(engine, "search", finds_three)
    with TestClient(make_app(store), raise_server_exceptions=False) as http:
        asked = post_json(http, {"queries": SENTENCES[:2], "condition": COLOUR, "k": len(SENTENCES)}).json()
        assert [len(a["results"]) for a in asked["results"]] == [3, 3]
        assert (asked["k"], asked["k_requested"], asked["k_capped"], asked["rows"]) == (3, 8, True, 8)
        few = post_json(http, {"query": SENTENCES[0], "condition": COLOUR, "k": 2}).json()
        assert (few["k"], few["k_requested"], few["k_capped"]) == (2, 2, False)


def test_k_is_what_an_approximate_index_returned(tmp_path: Path, write_corpus: WriteCorpus) -> None:
    n = 308
    corpus = write_corpus({"id": [f"r{i}" for i in range(n)], "text": [f"row {i} of the corpus" for i in range(n)]})
    store = IndexStore(tmp_path / "indexes")
    index_corpus(read_corpus(corpus), [COLOUR], hash_vectorizer(), store, corpus_name="big", factory="HNSW32")
    with TestClient(make_app(store), raise_server_exceptions=False) as http:
        for k in (5, 200, n, MAX_K):
            body = post_json(http, {"queries": ["row 3 of the corpus", "another query"], "condition": COLOUR, "k": k})
            assert body.status_code == 200, body.text
            got = body.json()
            counts = [len(a["results"]) for a in got["results"]]
            assert got["k"] == max(counts) and got["k_requested"] == k and got["rows"] == n
            assert got["k_capped"] == (min(counts) < k)
            for answer in got["results"]:
                ids = [hit["id"] for hit in answer["results"]]
                assert len(set(ids)) == len(ids) and all(i.startswith("r") for i in ids)
                assert [hit["rank"] for hit in answer["results"]] == list(range(1, len(ids) + 1))


# ---------------------------------------------------------------- the whole API, at random

TEXT_KEYS = ("query", "condition", "corpus")
HOSTILE_TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["\ud800", "\udfff", "a\ud83d", "\x00", " ", "\t\n", "x" * 10_001, "é" * 300_000]),
    st.lists(st.sampled_from(["a", "\ud800", "\x00", " ", "é", "🙂", "dress"]), max_size=6).map("".join),
)
GOOD_TEXT = st.sampled_from(SENTENCES + ["a girl in red", "  padded query  "])
JSON_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), HOSTILE_TEXT
)
ANY_JSON = st.recursive(
    JSON_SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
K = st.one_of(
    st.integers(min_value=-3, max_value=12), st.integers(), st.sampled_from([2**63, 2**64 + 1, -(2**70)]), ANY_JSON
)


@st.composite
def bodies(draw: st.DrawFn) -> object:
    """A request body: a valid one broken in none, one or two ways (a key dropped, added or given
    a hostile value), or now and then any JSON at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(ANY_JSON)
    body: dict[str, object] = {"condition": draw(st.sampled_from([COLOUR, SPORT, f"  {SPORT} "]))}
    if draw(st.booleans()):
        body["query"] = draw(GOOD_TEXT)
    else:
        body["queries"] = draw(st.lists(GOOD_TEXT, min_size=1, max_size=4))
    if draw(st.booleans()):
        body["k"] = draw(st.one_of(st.integers(1, 12), st.sampled_from([2**63, 10**30])))
    if draw(st.booleans()):
        body["corpus"] = draw(st.sampled_from(["corpus", None]))
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(["query", "queries", "condition", "k", "corpus", "\ud800", "extra"]))
        how = draw(st.sampled_from(["drop", "hostile", "any"]))
        if how == "drop":
            body.pop(key, None)
        elif key == "queries":
            body[key] = draw(st.one_of(st.lists(st.one_of(GOOD_TEXT, HOSTILE_TEXT), max_size=4), st.just(["q"] * 257)))
        elif key == "k":
            body[key] = draw(K)
        else:
            body[key] = draw(HOSTILE_TEXT if how == "hostile" else ANY_JSON)
    return body


def _valid_text(value: object) -> bool:
    if not isinstance(value, str) or not value.strip() or "\x00" in value or len(value) > ServeConfig.max_text_chars:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def expected_ok(body: object) -> bool:
    """Return whether the API must answer body with results (else with a 4xx)."""
    if not isinstance(body, dict) or not set(body) <= {"query", "queries", "condition", "k", "corpus"}:
        return False
    if ("query" in body) == ("queries" in body):
        return False
    texts = [body["query"]] if "query" in body else body["queries"]
    if not isinstance(texts, list) or not 1 <= len(texts) <= ServeConfig.max_queries:
        return False
    if not all(_valid_text(t) for t in texts) or not _valid_text(body.get("condition")):
        return False
    k = body.get("k", 1)
    if type(k) is not int or not 1 <= k <= MAX_K:
        return False
    corpus = body.get("corpus")
    return str(body["condition"]).strip() in (COLOUR, SPORT) and corpus in (None, "corpus")


def check_answer(body: dict, response: httpx.Response) -> None:
    got = response.json()
    texts = [body["query"]] if "query" in body else body["queries"]
    k = body.get("k", ServeConfig.k)
    assert set(got) == {"index", "corpus", "k", "k_requested", "k_capped", "rows", "results", "unknown_tokens"}
    assert (got["corpus"], got["k_requested"], got["rows"]) == ("corpus", k, len(SENTENCES))
    assert [a["query"] for a in got["results"]] == texts
    counts = [len(a["results"]) for a in got["results"]]
    assert got["k"] == max(counts) == min(k, len(SENTENCES)) and got["k_capped"] == (k > len(SENTENCES))
    for answer in got["results"]:
        assert answer["condition"] == body["condition"].strip()
        hits = answer["results"]
        assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
        assert all(h["id"] in IDS and h["text"] == SENTENCES[IDS.index(h["id"])] for h in hits)
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)


def test_any_body_gets_an_answer_or_a_one_line_4xx(store: IndexStore) -> None:
    app = make_app(store, batch_window_ms=0.0)
    with TestClient(app, raise_server_exceptions=False) as http:

        @settings(
            max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
        )
        @given(body=bodies())
        def answers(body: object) -> None:
            response = post_json(http, body)
            if expected_ok(body):
                assert response.status_code == 200, (body, response.text)
                check_answer(body, response)  # type: ignore[arg-type]
            else:
                assert 400 <= response.status_code < 500, (body, response.text)
                error = response.json()["error"]
                assert isinstance(error, str) and error and "\n" not in error

        answers()
        assert http.get("/health").json()["status"] == "ok"


@given(
    raw=st.one_of(st.binary(max_size=64), st.sampled_from([b"\xff\xfe", b'{"query": "\xff"}', b"[", b"null", b"1e999"]))
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_bytes_get_a_one_line_4xx(client: TestClient, raw: bytes) -> None:
    response = client.post("/query", content=raw, headers={"content-type": "application/json"})
    assert_refused(response, response.status_code)
    assert 400 <= response.status_code < 500, response.text
