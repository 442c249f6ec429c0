"""POST /v1/embeddings (issue 41, item 5): OpenAI's request and response shape, with `condition` beside it.

The hash encoder's vectors compare exactly; the tiny BERT's, served as `condsearch serve` runs it and
asked for by the `openai` client, within the float32 tolerance of `condsearch.load_model(...).encode`.
"""

from __future__ import annotations

import base64
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

import condsearch
from condsearch.corpus.reader import read_corpus
from condsearch.ingest.chunks import index_corpus
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.resident import Resident
from condsearch.serve.app import create_app
from condsearch.serve.config import ServeConfig
from condsearch.serve.server import BackgroundServer, build_app
from condsearch.store.conditions import MAX_CONDITION_CHARS
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES, HashEncoder
from tests.serve.test_serve import index
from tests.serve.test_serve_fair import BIG, SMALL, GatedEncoder, _when_submitted
from tests.tolerance import assert_rows_close, vector_tolerance

COLOUR = "color of the dress"
SPORT = "the sport being played"  # indexed nowhere: an embedding needs no index of its condition
TEXTS = [SENTENCES[0], SENTENCES[2], SENTENCES[5]]


def hash_vectorizer(model_id: str = "test/hash", dim: int = 16) -> Vectorizer:
    return Vectorizer(HashEncoder(dim=dim, model_id=model_id), None, "none", "")


@pytest.fixture
def store(tmp_path: Path, corpus_file: Path) -> IndexStore:
    store = IndexStore(tmp_path / "indexes")
    index_corpus(read_corpus(corpus_file), [COLOUR], hash_vectorizer(), store, corpus_name="corpus")
    return store


def app_over(store: IndexStore, vectorizers: dict[str, Vectorizer] | None = None, **settings: object) -> TestClient:
    models = vectorizers or {"test/hash": hash_vectorizer()}
    resident = Resident(store, lambda m: models[m.model_id])
    config = ServeConfig(index_dir=store.root, **settings)  # type: ignore[arg-type]
    return TestClient(create_app(resident, config))


def embed(http: TestClient | httpx.Client, **body: object) -> httpx.Response:
    return http.post("/v1/embeddings", json=body)


def error_of(response: httpx.Response) -> str:
    """Return the one-line message of an error in OpenAI's shape (what its clients show)."""
    error = response.json()["error"]
    assert error.keys() == {"message", "type", "param", "code"} and error["type"], error
    assert error["code"] is None or isinstance(error["code"], str), error  # OpenAI's: a string or null
    assert isinstance(error["message"], str) and error["message"] and "\n" not in error["message"], error
    return error["message"]


def vectors_of(response: httpx.Response) -> np.ndarray:
    data = response.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data)))
    rows = [
        np.frombuffer(base64.b64decode(d["embedding"]), "<f4") if isinstance(d["embedding"], str) else d["embedding"]
        for d in data
    ]
    return np.asarray(rows, dtype=np.float32)


def test_vectors_are_model_encode_in_openai_shape(store: IndexStore) -> None:
    want = condsearch.Model(hash_vectorizer()).encode(TEXTS, SPORT)
    with app_over(store) as http:
        response = embed(http, input=TEXTS, model="corpus", condition=SPORT)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "list" and body["model"] == "test/hash"
        assert all(d["object"] == "embedding" for d in body["data"])
        usage = body["usage"]
        assert usage["prompt_tokens"] == usage["total_tokens"] > 0
        np.testing.assert_array_equal(vectors_of(response), want)  # the same path: exactly

        # one text, base64 (what the openai client asks for), dimensions equal to the model's, a user
        one = embed(http, input=TEXTS[1], model="corpus", condition=SPORT, encoding_format="base64", user="u1")
        assert one.status_code == 200, one.text
        assert isinstance(one.json()["data"][0]["embedding"], str)
        np.testing.assert_array_equal(vectors_of(one), want[1:2])
        same = embed(http, input=TEXTS, model="corpus", condition=SPORT, dimensions=16, encoding_format="float")
        np.testing.assert_array_equal(vectors_of(same), want)
        # another condition, other vectors; /query answers as before beside it
        other = vectors_of(embed(http, input=TEXTS, model="corpus", condition=COLOUR))
        np.testing.assert_array_equal(other, condsearch.Model(hash_vectorizer()).encode(TEXTS, COLOUR))
        assert not np.array_equal(other, want)
        hits = http.post("/query", json={"query": SENTENCES[3], "condition": COLOUR, "k": 1}).json()
        assert hits["results"][0]["results"][0]["id"] == "s3"
        assert "/v1/embeddings" in http.get("/openapi.json").json()["paths"]


def test_bad_requests_are_one_line_4xx_and_the_server_keeps_answering(store: IndexStore) -> None:
    ok = {"input": TEXTS, "model": "corpus", "condition": SPORT}
    bad = [
        ({**ok, "input": [101, 2023, 102]}, 400, "token ids"),
        ({**ok, "input": [[101, 2023], [101]]}, 400, "token ids"),
        ({"input": TEXTS, "model": "corpus"}, 400, "condition is required"),
        ({**ok, "dimensions": 8}, 400, "dimensions"),
        ({**ok, "dimensions": 0}, 422, "dimensions"),
        ({**ok, "input": []}, 400, "empty"),  # as OpenAI answers it
        ({**ok, "input": ""}, 400, "empty"),
        ({**ok, "input": ["fine", "  "]}, 400, "input[1]"),
        ({**ok, "input": ["a", 1]}, 422, "input: must be a text or a list of texts"),
        ({**ok, "input": ["nul \x00 here"]}, 422, "NUL"),
        ({**ok, "condition": "  "}, 422, "condition"),
        ({**ok, "encoding_format": "hex"}, 422, "encoding_format"),
        ({**ok, "input": ["q"] * 5}, 422, "at most 4 inputs"),
        ({**ok, "input": ["x" * 101]}, 422, "longer than 100"),
        ({**ok, "condition": "c" * (MAX_CONDITION_CHARS + 1)}, 422, f"at most {MAX_CONDITION_CHARS} are allowed"),
        ({**ok, "condition": "\u200b\ufeff"}, 422, "only invisible characters"),
        ({**ok, "conditon": SPORT}, 422, "conditon"),
        ({**ok, "model": 3}, 422, "model"),
    ]
    with app_over(store, max_queries=4, max_text_chars=100) as http:
        for body, status, says in bad:
            response = embed(http, **body)
            assert response.status_code == status, (body, response.text)
            assert says in error_of(response), body
        surrogate = b'{"input": ["bad \\ud800 text"], "model": "corpus", "condition": "c"}'
        lone = http.post("/v1/embeddings", content=surrogate, headers={"content-type": "application/json"})
        assert lone.status_code == 422 and "not valid Unicode" in error_of(lone)
        malformed = http.post("/v1/embeddings", content=b"{nope", headers={"content-type": "application/json"})
        assert malformed.status_code == 400 and error_of(malformed) == "malformed JSON body"
        assert http.get("/v1/embeddings").status_code == 405
        assert http.post("/query", json={"query": "q"}).json()["error"].startswith("condition")  # elsewhere as before
        assert embed(http, **ok).status_code == 200


def test_model_names_an_index_a_corpus_or_a_model_and_defaults_to_the_only_one(
    store: IndexStore, corpus_file: Path
) -> None:
    with app_over(store) as http:  # one model: any name, or none, is it
        for name in ("corpus", "test/hash", "text-embedding-3-small", None):
            body = {"input": TEXTS, "condition": SPORT} | ({"model": name} if name else {})
            assert embed(http, **body).status_code == 200, name

    other = hash_vectorizer("test/other", dim=8)
    index_corpus(read_corpus(corpus_file), [COLOUR], other, store, corpus_name="second")
    models = {"test/hash": hash_vectorizer(), "test/other": hash_vectorizer("test/other", dim=8)}
    with app_over(store, models) as http:
        [second] = [n for n, m in store.manifests() if not isinstance(m, Exception) and m.corpus_name == "second"]
        for name in ("second", "test/other", second):
            response = embed(http, input=TEXTS, model=name, condition=SPORT)
            assert response.status_code == 200, response.text
            assert response.json()["model"] == "test/other"
            np.testing.assert_array_equal(vectors_of(response), condsearch.Model(other).encode(TEXTS, SPORT))
        assert vectors_of(embed(http, input=TEXTS, model="corpus", condition=SPORT)).shape == (3, 16)
        for name in ("text-embedding-3-small", None):
            body = {"input": TEXTS, "condition": SPORT} | ({"model": name} if name else {})
            response = embed(http, **body)
            assert response.status_code == 404, response.text
            assert response.json()["models"] == ["corpus", "second", "test/hash", "test/other"]
            assert "several models" in error_of(response)
        wrong_dim = embed(http, input=TEXTS, model="second", condition=SPORT, dimensions=16)
        assert wrong_dim.status_code == 400 and "have 8" in error_of(wrong_dim)


def test_the_key_and_the_body_limit_apply(store: IndexStore) -> None:
    body = {"input": TEXTS, "model": "corpus", "condition": SPORT}
    with app_over(store, api_key="s3cret", max_body_bytes=1000) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "wrong"}):
            refused = http.post("/v1/embeddings", json=body, headers=headers)
            assert refused.status_code == 401 and "API key" in error_of(refused)
            assert refused.headers["www-authenticate"] == "Bearer"
        for headers in ({"Authorization": "Bearer s3cret"}, {"X-API-Key": "s3cret"}):
            assert http.post("/v1/embeddings", json=body, headers=headers).status_code == 200
        large = http.post("/v1/embeddings", json={**body, "input": ["x" * 600] * 2}, headers={"X-API-Key": "s3cret"})
        assert large.status_code == 413 and "too large" in error_of(large)


def test_a_large_embeddings_request_does_not_hold_up_a_query(store: IndexStore) -> None:
    """The embeddings request goes through /query's batcher in parts of bounded tokens, in turn with queries."""
    encoder = GatedEncoder()
    vec = Vectorizer(encoder, None, "none", "")
    app = create_app(Resident(store, lambda _: vec), ServeConfig(index_dir=store.root, batch_window_ms=0.0))
    small_queued = threading.Event()
    _when_submitted(app.state.batcher, SMALL, small_queued)
    with TestClient(app) as http, ThreadPoolExecutor(2) as pool:
        big = pool.submit(embed, http, input=BIG, model="corpus", condition=COLOUR)
        assert encoder.started.wait(30)  # the embeddings request's first forward pass is running
        small = pool.submit(http.post, "/query", json={"query": SMALL, "condition": COLOUR, "k": 2})
        assert small_queued.wait(30)
        encoder.release.set()
        big_answer, small_answer = big.result(60), small.result(60)
    assert big_answer.status_code == 200 and small_answer.status_code == 200, (big_answer.text, small_answer.text)

    passes = [[s for _, s in b] for b in encoder.batches if all(s is not None for _, s in b)]
    big_passes = [i for i, p in enumerate(passes) if set(p) & set(BIG)]
    small_pass = next(i for i, p in enumerate(passes) if SMALL in p)
    assert len(big_passes) > 1 and small_pass < big_passes[-1], passes
    assert set(passes[small_pass]).isdisjoint(BIG)
    # the parts add up to the vectors of every text, in order
    np.testing.assert_array_equal(vectors_of(big_answer), condsearch.Model(hash_vectorizer()).encode(BIG, COLOUR))


@pytest.fixture
def bert_index_dir(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "indexes"
    index(corpus_file, folder, tiny_bert_dir, COLOUR)
    return folder


def test_the_openai_client_gets_what_model_encode_gives(bert_index_dir: Path, tiny_bert_dir: Path) -> None:
    """The real server (onnxruntime where it serves the index so) asked by the openai client: Model.encode's vectors."""
    openai = pytest.importorskip("openai")
    model = condsearch.load_model(str(tiny_bert_dir), profile="none", device="cpu")
    texts = [*TEXTS, "A dog catches a frisbee. " * 80]  # one past the model's tokens: cut as the model reads it
    want = model.encode(texts, SPORT)
    tolerance = vector_tolerance(model.vectorizer, texts, SPORT)
    config = ServeConfig(index_dir=bert_index_dir, device="cpu", api_key="s3cret", reload_interval_s=0.05)
    with BackgroundServer(build_app(config)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0, timeout=60)
        got = client.embeddings.create(input=texts, model="corpus", extra_body={"condition": SPORT})  # base64
        assert got.model == str(tiny_bert_dir) or got.model.endswith(tiny_bert_dir.name)
        assert [d.index for d in got.data] == list(range(len(texts)))
        assert got.usage.prompt_tokens == got.usage.total_tokens > 0
        vectors = np.asarray([d.embedding for d in got.data], dtype=np.float32)
        assert_rows_close(vectors, want, tolerance)
        floats = client.embeddings.create(
            input=texts, model="corpus", encoding_format="float", extra_body={"condition": SPORT}
        )
        np.testing.assert_array_equal(np.asarray([d.embedding for d in floats.data], dtype=np.float32), vectors)

        with pytest.raises(openai.BadRequestError, match="condition is required"):
            client.embeddings.create(input=texts, model="corpus")
        with pytest.raises(openai.BadRequestError, match="token ids"):
            client.embeddings.create(input=[[101, 102]], model="corpus", extra_body={"condition": SPORT})
        keyless = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError):
            keyless.embeddings.create(input=texts, model="corpus", extra_body={"condition": SPORT})
