"""Refusals say their reason first and name only the asked corpus's conditions, at most ten (issue 59, item 5);
the server's /query counts [UNK] for router corpora, caps k and answers HEAD of its page (issue 59, the page).

Two router (--mode csr) corpora of the tiny BERT share one folder: ``demo`` (indexed under COLOUR) and
``pypi`` (under twelve conditions). A refusal of a condition for ``pypi`` must not list ``demo``'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import condsearch
from condsearch.errors import CondsearchError, UnknownCondition
from condsearch.query.on_demand import build_on_demand
from condsearch.serve.refusals import MAX_K
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES
from tests.query.test_on_demand import index as index_csr
from tests.query.test_on_demand import invoke, refused
from tests.serve.test_serve import serve

COLOUR = "color of the dress"
PYPI = [f"aspect number {i:02d}" for i in range(12)]  # more than a refusal lists
TOO_LONG = "x" * 201
UNREADABLE = "🙂🤖🎉🙃"  # emoji: not one of them is in the tiny BERT's vocabulary


@pytest.fixture(scope="module")
def folder(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("two-corpora")
    import pyarrow as pa
    import pyarrow.parquet as pq

    demo, pypi = root / "demo.parquet", root / "pypi.parquet"
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(len(SENTENCES))], "text": SENTENCES}), demo)
    pq.write_table(pa.table({"id": ["p0", "p1", "p2"], "text": SENTENCES[:3]}), pypi)
    out = root / "idx"
    index_csr(demo, out, tiny_bert_dir, COLOUR, name="demo")
    index_csr(pypi, out, tiny_bert_dir, *PYPI, name="pypi")
    return out


def _lists_pypi_only(line: str) -> None:
    assert COLOUR not in line  # the demo corpus's condition
    assert all(repr(c) in line for c in PYPI[:10]) and repr(PYPI[10]) not in line
    assert "and 2 more" in line


# ------------------------------------------------------------------ the CLI


def test_cli_no_build_says_too_long_first_and_lists_the_asked_corpus_only(folder: Path) -> None:
    line = refused("query", "a girl", "-c", TOO_LONG, "--corpus", "pypi", "--index-dir", folder, "--no-build")
    assert line.startswith("Error: the condition is 201 characters long; at most 200 are allowed")
    assert "no index for condition 'xxxx" in line and "(201 characters)" in line
    assert TOO_LONG not in line  # quoted in part: a refusal stays a readable line
    _lists_pypi_only(line)


def test_cli_build_says_too_long_first_once(folder: Path) -> None:
    before = sorted(p.name for p in folder.iterdir())
    line = refused("query", "a girl", "-c", TOO_LONG, "--corpus", "pypi", "--index-dir", folder)
    assert line.startswith("Error: the condition is 201 characters long")
    assert line.count("characters long") == 1
    _lists_pypi_only(line)
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing built


def test_cli_a_control_character_is_the_reason_given_first(folder: Path) -> None:
    line = refused("query", "a girl", "-c", "the\x1bmood", "--corpus", "pypi", "--index-dir", folder)
    assert line.startswith("Error: the condition has a control character (U+001B)")
    _lists_pypi_only(line)


def test_cli_an_unknown_corpus_lists_none_of_the_others(folder: Path) -> None:
    result = invoke("query", "a girl", "-c", "the mood", "--corpus", "nope", "--index-dir", folder)
    assert result.exit_code == 1
    assert "indexed: none" in result.stderr and COLOUR not in result.stderr and PYPI[0] not in result.stderr


# ------------------------------------------------------------------ the Python API


def test_api_no_build_gives_the_reason_first_and_the_asked_corpus_only(folder: Path) -> None:
    store = condsearch.open(folder)
    with pytest.raises(UnknownCondition) as caught:
        store.search("a girl", condition=TOO_LONG, corpus="pypi", build=False)
    message = str(caught.value)
    assert message.startswith("the condition is 201 characters long")
    _lists_pypi_only(message)
    assert caught.value.conditions == PYPI[:10]


def test_api_build_gives_the_reason_first(folder: Path) -> None:
    store = condsearch.open(folder)
    with pytest.raises(CondsearchError) as caught:
        store.search("a girl", condition=TOO_LONG, corpus="pypi")
    assert str(caught.value).startswith("the condition is 201 characters long")
    assert str(caught.value).count("characters long") == 1
    _lists_pypi_only(str(caught.value))


def test_a_build_for_a_corpus_never_indexed_names_no_other_corpus_conditions(folder: Path) -> None:
    with pytest.raises(UnknownCondition) as caught:
        build_on_demand(IndexStore(folder), "the mood", "nope")
    assert caught.value.conditions == []


def test_a_build_on_demand_reports_rows_within_a_chunk(tiny_bert_dir: Path, write_corpus, tmp_path: Path) -> None:
    """An ingest chunk (8,192 rows) is told as the router routes it, a batch (64 rows) at a time."""
    texts = [f"{SENTENCES[i % len(SENTENCES)]} ({i})" for i in range(200)]
    corpus = write_corpus({"id": [f"r{i}" for i in range(len(texts))], "text": texts})
    out = tmp_path / "idx"
    index_csr(corpus, out, tiny_bert_dir, COLOUR)
    told: list[tuple[int, int]] = []
    made = build_on_demand(IndexStore(out), "the mood", on_rows=lambda done, total: told.append((done, total)))
    assert made.built and made.n_rows == 200
    done = [d for d, _ in told]
    assert {t for _, t in told} == {200}
    assert done == sorted(done) and done[0] == 0 and done[-1] == 200
    assert len({d for d in done if 0 < d < 200}) >= 2  # rows told within the one chunk, not only at its ends


# ------------------------------------------------------------------ the server


@pytest.fixture(scope="module")
def http(folder: Path) -> Iterator[httpx.Client]:
    with serve(folder, build=False) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def test_server_refusals_name_the_asked_corpus_only(http: httpx.Client) -> None:
    got = http.post("/query", json={"query": "a girl", "condition": "the mood", "corpus": "pypi"})
    assert got.status_code == 404, got.text
    _lists_pypi_only(got.json()["error"])
    assert got.json()["conditions"] == PYPI[:10]
    got = http.post("/query", json={"query": "a girl", "condition": TOO_LONG, "corpus": "pypi"})
    assert got.status_code == 422
    assert got.json()["error"].startswith("condition: the condition is 201 characters long")


def test_server_counts_unknown_tokens_on_a_router_corpus(http: httpx.Client) -> None:
    body = {"queries": [UNREADABLE, "a girl in a red dress"], "condition": COLOUR, "corpus": "demo", "k": 2}
    got = http.post("/query", json=body)
    assert got.status_code == 200, got.text
    assert got.json()["unknown_tokens"] == [1.0, 0.0]


def test_server_caps_k(http: httpx.Client) -> None:
    body = {"query": "a girl", "condition": COLOUR, "corpus": "demo"}
    assert http.post("/query", json={**body, "k": MAX_K}).status_code == 200
    got = http.post("/query", json={**body, "k": MAX_K + 1})
    assert got.status_code == 422 and "k:" in got.json()["error"] and "1000" in got.json()["error"]
    schema = http.get("/openapi.json").json()["components"]["schemas"]["QueryRequest"]["properties"]["k"]
    assert schema["maximum"] == MAX_K


def test_head_of_the_page_is_200(http: httpx.Client, folder: Path) -> None:
    for path in ("/", "/static/search.js", "/docs"):
        got = http.head(path)
        assert got.status_code == 200, path
        assert got.content == b"" and got.headers["content-security-policy"]
    with serve(folder, build=False, api_key="k3y") as keyed, httpx.Client(base_url=keyed.url) as client:
        assert client.head("/").status_code == 200  # the page needs no key, HEAD or GET
        assert client.head("/indexes").status_code in (401, 405)  # data does
