"""Every answer of `condsearch serve` carries the security headers: nosniff and no framing (issue 37).

JSON answers, every 4xx and 5xx (the app's, the body limit's, uvicorn's own 400), the OpenAPI docs
and the page: a browser must never sniff a JSON answer into HTML, nor let another site frame any
of them. The app runs under uvicorn on a loopback port, so what is checked is what a client gets.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.routing import Route

from condsearch.corpus.reader import read_corpus
from condsearch.ingest.chunks import index_corpus
from condsearch.serve.headers import SECURITY_HEADERS
from condsearch.serve.page import CONTENT_SECURITY_POLICY, PAGE_PATHS
from condsearch.serve.server import BackgroundServer
from condsearch.store.folder import IndexStore
from tests.serve.test_serve_hostile import COLOUR, SPORT, hash_vectorizer, make_app

KEY = "k3y"
WITH_KEY = {"X-API-Key": KEY}


@pytest.fixture
def store(tmp_path: Path, corpus_file: Path) -> IndexStore:
    store = IndexStore(tmp_path / "indexes")
    index_corpus(read_corpus(corpus_file), [COLOUR, SPORT], hash_vectorizer(), store, corpus_name="corpus")
    return store


def assert_secured(response: httpx.Response, what: str) -> None:
    """Assert response carries nosniff and both anti-framing headers, each once."""
    headers = response.headers
    assert headers.get_list("x-content-type-options") == ["nosniff"], what
    assert headers.get_list("x-frame-options") == ["DENY"], what
    policies = headers.get_list("content-security-policy")
    assert len(policies) == 1 and "frame-ancestors 'none'" in policies[0], (what, policies)


def _raw_answer(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    return data


def _raw_headers(answer: bytes) -> dict[str, list[str]]:
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    headers: dict[str, list[str]] = {}
    for line in head:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return headers


@pytest.fixture
def server(store: IndexStore) -> Iterator[BackgroundServer]:
    app = make_app(store, api_key=KEY, max_body_bytes=4096, body_timeout_s=0.3, batch_window_ms=0.0)
    with BackgroundServer(app) as running:
        yield running


def test_every_route_answers_with_the_security_headers(server: BackgroundServer, store: IndexStore) -> None:
    app = make_app(store)
    routes = [r for r in app.routes if isinstance(r, APIRoute | Route)]
    seen = set()
    with httpx.Client(base_url=server.url, timeout=30, headers=WITH_KEY) as http:
        for route in routes:
            for method in sorted(route.methods or ()):
                if method == "HEAD":
                    continue
                body = {"query": "a girl in a red dress", "condition": COLOUR} if method == "POST" else None
                if route.path == "/v1/embeddings":
                    body = {"input": "a girl in a red dress", "condition": COLOUR}
                response = http.request(method, route.path, json=body)
                # no build of that id, no corpus of that name (DELETE /indexes/{corpus}): still secured
                found = (
                    404 if route.path in ("/builds/{job_id}", "/indexes/{corpus}", "/v1/models/{model:path}") else 200
                )
                assert response.status_code == found, (route.path, response.text)
                assert_secured(response, f"{method} {route.path}")
                seen.add(route.path)
    # the API, its docs and the page: nothing left out of the walk
    assert {"/query", "/v1/embeddings", "/indexes", "/health", "/docs", "/openapi.json"} | PAGE_PATHS <= seen


def test_the_page_keeps_its_own_policy(server: BackgroundServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for path in PAGE_PATHS:
            response = http.get(path)
            assert response.headers.get_list("content-security-policy") == [CONTENT_SECURITY_POLICY]
            assert_secured(response, path)


def test_every_error_answers_with_the_security_headers(
    server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    query = {"query": "q", "condition": COLOUR}
    with httpx.Client(base_url=server.url, timeout=30, headers=WITH_KEY) as http:
        errors = {
            "401 no key": (httpx.get(f"{server.url}/indexes"), 401),
            "401 wrong key": (http.get("/indexes", headers={"X-API-Key": "nope"}), 401),
            "404 no route": (http.get("/no-such-path"), 404),
            "404 unknown condition": (http.post("/query", json={**query, "corpus": "no"}), 404),
            "404 cannot build": (http.post("/query", json={"query": "q", "condition": "the mood"}), 404),
            "405 wrong method": (http.get("/query"), 405),
            "405 POST to the page": (http.post("/", json={}), 405),
            "400 malformed JSON": (
                http.post("/query", content=b"{nope", headers={"content-type": "application/json"}),
                400,
            ),
            "422 validation": (http.post("/query", json={**query, "k": 0}), 422),
            "422 too many queries": (http.post("/query", json={"queries": ["q"] * 257, "condition": COLOUR}), 422),
            "413 declared too large": (http.post("/query", content=b"x" * 5000), 413),
            "413 too large as it arrives": (http.post("/query", content=iter([b"x" * 3000, b"y" * 3000])), 413),
        }
        for what, (response, status) in errors.items():
            assert response.status_code == status, (what, response.text)
            assert_secured(response, what)

        def crash(*_: object) -> None:
            raise RuntimeError("boom")

        monkeypatch.setattr("condsearch.query.resident.Resident.get", crash)
        response = http.post("/query", json=query)
        assert response.status_code == 500 and response.json() == {"error": "internal error (RuntimeError)"}
        assert_secured(response, "500 unexpected")


def test_answers_before_the_app_carry_the_headers(server: BackgroundServer) -> None:
    """uvicorn's own 400 (a request it cannot parse) and the body limit's 408 carry them too."""
    garbage = _raw_answer(server.url, b"NOT HTTP AT ALL\r\n\r\n")
    assert garbage.startswith(b"HTTP/1.1 400"), garbage
    head = b"POST /query HTTP/1.1\r\nHost: x\r\nX-API-Key: k3y\r\nContent-Length: 100\r\n\r\n"
    slow = _raw_answer(server.url, head + b'{"q')  # the rest of the body never comes
    assert slow.startswith(b"HTTP/1.1 408"), slow
    for what, answer in (("uvicorn 400", garbage), ("408", slow)):
        headers = _raw_headers(answer)
        assert headers.get("x-content-type-options") == ["nosniff"], (what, headers)
        assert headers.get("x-frame-options") == ["DENY"], (what, headers)
        assert "frame-ancestors 'none'" in headers.get("content-security-policy", [""])[0], (what, headers)


def test_the_headers_are_the_documented_ones() -> None:
    assert SECURITY_HEADERS["X-Content-Type-Options"] == "nosniff"
    assert SECURITY_HEADERS["X-Frame-Options"] == "DENY"
    assert json.dumps(SECURITY_HEADERS["Content-Security-Policy"]) == json.dumps("frame-ancestors 'none'")
