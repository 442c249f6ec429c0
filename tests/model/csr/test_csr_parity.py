"""The router mode through every front end (issue 39): an index built with `index --mode csr` answers alike everywhere.

`query --json`, the server's `/query` and the Python API's `Store.search` answer the same rows;
indexing in chunks stores the one-pass vectors; `condsearch export` to Milvus Lite answers the
same ids; `/indexes` (and `list --json`) say each index's mode and router, which the page shows.
The tiny BERT stands in for MiniLM: with an untrained router (``--router none``) and with a saved
router whose weights were moved off their start (so that conditions differ, as a trained one's do).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

import condsearch
from condsearch.cli import main
from condsearch.serve.config import ServeConfig
from condsearch.serve.server import build_app
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES, assert_same_ranking
from tests.csr_corpus import csr_texts, move_router, write_csr_corpus
from tests.tolerance import assert_rows_close, score_tolerance, vector_tolerance

COLOUR = "color of the dress"
SPORT = "the sport being played"
CONDITIONS = (COLOUR, SPORT)
QUERIES = ["a girl in a red dress", "two men play soccer", SENTENCES[4]]
K = 5
#: FAISS, Milvus and two encodes of one query take the same inner products in their own order
SCORE_TOL = score_tolerance(32)


def run(*args: object) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    return result


@pytest.fixture(scope="module")
def moved_router(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A router folder for the tiny BERT whose weights are off their (condition-blind) start."""
    return move_router(tiny_bert_dir, tmp_path_factory.mktemp("router"), seed=0)


@pytest.fixture(params=["none", "moved"])
def router(request: pytest.FixtureRequest, moved_router: Path) -> str:
    return "none" if request.param == "none" else str(moved_router)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_csr_corpus(tmp_path / "c.parquet")


@pytest.fixture
def index_dir(tmp_path: Path, corpus: Path, tiny_bert_dir: Path, router: str) -> Path:
    folder = tmp_path / "idx"
    flags = [x for c in CONDITIONS for x in ("-c", c)]
    run("index", corpus, *flags, "--mode", "csr", "--router", router, "--model", tiny_bert_dir, "--index-dir", folder)
    return folder


def cli_answers(where: list[object], condition: str, k: int = K) -> list[dict]:
    out = run("query", *QUERIES, "-c", condition, "-k", k, "--json", *where).stdout
    return [json.loads(line) for line in out.splitlines()]


def served(config: ServeConfig) -> Iterator[TestClient]:
    with TestClient(build_app(config), raise_server_exceptions=False) as http:
        yield http


@pytest.fixture
def client(index_dir: Path) -> Iterator[TestClient]:
    yield from served(ServeConfig(index_dir=index_dir, device="cpu", batch_window_ms=0.0))


def ranking(answers: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Return (scores, ids) of JSON answers, one row per query."""
    scores = np.array([[r["score"] for r in a["results"]] for a in answers])
    ids = np.array([[r["id"] for r in a["results"]] for a in answers])
    return scores, ids


def assert_same_answers(a: list[dict], b: list[dict]) -> None:
    """Assert two front ends' answers agree: queries, conditions, texts, and rows up to ties."""
    assert [(x["query"], x["condition"]) for x in a] == [(y["query"], y["condition"]) for y in b]
    # both print scores to 6 places, which rounds each by up to half of 1e-6
    assert_same_ranking(ranking(a), ranking(b), SCORE_TOL + 1e-6)
    texts = {r["id"]: r["text"] for x in a for r in x["results"]}
    assert all(texts.get(r["id"], r["text"]) == r["text"] for y in b for r in y["results"])


def api_answers(location: str | Path, condition: str, k: int = K) -> list[dict]:
    from condsearch.query.as_json import query_answer

    return [query_answer(h) for h in condsearch.open(location).search(QUERIES, condition=condition, k=k)]


def test_query_serve_and_the_python_api_answer_alike(index_dir: Path, client: TestClient) -> None:
    manifests = [IndexStore(index_dir).read_manifest(n) for n in IndexStore(index_dir).names()]
    assert sorted(m.mode for m in manifests) == ["csr", "csr"]
    for condition in CONDITIONS:
        cli = cli_answers(["--index-dir", index_dir], condition)
        response = client.post("/query", json={"queries": QUERIES, "condition": condition, "k": K})
        assert response.status_code == 200, response.text
        assert_same_answers(cli, response.json()["results"])
        assert_same_answers(cli, api_answers(index_dir, condition))
        assert cli[2]["results"][0]["id"] == "r4"  # a row's own text finds it first
    health = client.get("/health").json()
    assert (health["indexes_loaded"], health["models_loaded"]) == (2, 1)  # one router model for both conditions


def test_indexes_list_the_mode_and_router_as_list_json_does(index_dir: Path, client: TestClient, router: str) -> None:
    listed = client.get("/indexes").json()["indexes"]
    cli = [json.loads(line) for line in run("list", "--json", "--index-dir", index_dir).stdout.splitlines()]
    for entry in cli:  # the server names a folder (the model's, the router's) by its last part (issue 58)
        entry["model"], entry["router"] = os.path.basename(entry["model"]), os.path.basename(entry["router"])
    assert listed == cli
    assert len(listed) == 2
    for entry in listed:
        # what the page shows beside its `condsearch index` line: the mode, and the router that built the index
        assert entry["mode"] == "csr" and entry["router"] == os.path.basename(router)
        assert {"index", "condition", "corpus", "rows", "model"} <= entry.keys()
    assert "mode=csr" in run("list", "--index-dir", index_dir).stdout


@pytest.mark.numerics
def test_indexing_in_chunks_stores_the_one_pass_vectors(
    index_dir: Path, corpus: Path, tmp_path: Path, tiny_bert_dir: Path, router: str
) -> None:
    from condsearch.corpus.reader import scan_corpus
    from condsearch.ingest.chunks import index_conditions
    from condsearch.model.encoders.spec import EncoderSpec, Runtime
    from condsearch.model.vectorizer import load_vectorizer

    spec = EncoderSpec(str(tiny_bert_dir), mode="csr", router=router, runtime=Runtime(device="cpu"))
    vec = load_vectorizer(spec)
    chunked = IndexStore(tmp_path / "chunked")
    reports = index_conditions(scan_corpus(corpus), list(CONDITIONS), vec, chunked, corpus_name="c", chunk_rows=7)
    one_pass = IndexStore(index_dir)
    texts = csr_texts()
    for report in reports:
        a, b = chunked.load(report.name), one_pass.load(report.name)
        assert a.ids == b.ids and a.texts == b.texts == texts
        assert a.manifest.fingerprint == b.manifest.fingerprint and a.manifest.mode == "csr"
        tolerance = vector_tolerance(vec, texts, a.manifest.condition)
        vectors = [np.load(s.root / report.name / "vectors.npy") for s in (chunked, one_pass)]
        assert_rows_close(*vectors, tolerance)


milvus = pytest.mark.skipif(
    __import__("importlib").util.find_spec("milvus_lite") is None,
    reason="the milvus extra is not installed (pip install 'condsearch[milvus]')",
)


@milvus
@pytest.mark.numerics
def test_export_to_milvus_lite_answers_the_same_ids(index_dir: Path, tmp_path: Path, router: str) -> None:
    db = f"milvus-lite:{tmp_path / 'm.db'}"
    run("export", "--to", db, "--index-dir", index_dir)
    n_rows = len(csr_texts())
    for condition in CONDITIONS:
        exact = cli_answers(["--index-dir", index_dir], condition, k=n_rows)  # every row: ties at the cut resolved
        for answers in (cli_answers(["--store", db], condition), api_answers(db, condition)):
            assert len(answers) == len(QUERIES) and all(len(a["results"]) == K for a in answers)
            for full, got in zip(exact, answers, strict=True):
                scores = {r["id"]: (r["score"], r["text"]) for r in full["results"]}
                best = [r["score"] for r in full["results"][:K]]
                np.testing.assert_allclose([r["score"] for r in got["results"]], best, rtol=0, atol=SCORE_TOL + 1e-6)
                for r in got["results"]:
                    assert scores[r["id"]][1] == r["text"]
                    assert abs(scores[r["id"]][0] - r["score"]) <= SCORE_TOL + 1e-6
    # the server over the Milvus store lists the indexes, mode and router, as over the folder
    for http in served(ServeConfig(store=db, device="cpu", batch_window_ms=0.0)):
        listed = http.get("/indexes").json()["indexes"]
        assert sorted((e["condition"], e["mode"], e["router"]) for e in listed) == [
            (COLOUR, "csr", os.path.basename(router)),
            (SPORT, "csr", os.path.basename(router)),
        ]
        response = http.post("/query", json={"queries": QUERIES, "condition": COLOUR, "k": K})
        assert response.status_code == 200, response.text
        assert_same_answers(cli_answers(["--store", db], COLOUR), response.json()["results"])


# ------------------------------------------------------------------ the page, in a real browser (make test-browser)


@pytest.mark.browser
def test_the_page_ranks_csr_indexes_and_says_how_to_add_one(
    tmp_path: Path, corpus: Path, tiny_bert_dir: Path, moved_router: Path
) -> None:
    """Over csr indexes, the page's columns are /query's answers, and it says the mode and router to add one with."""
    from tests.serve.test_search_page import CHROMIUM, _api, _chromium, _column, _expect, _search
    from tests.serve.test_serve import serve

    sync_api = _chromium()  # skips (fails in CI) without Playwright or Chromium
    index_dir = tmp_path / "idx"
    flags = [x for c in CONDITIONS for x in ("-c", c)]
    router = ["--mode", "csr", "--router", moved_router]
    run("index", corpus, *flags, *router, "--model", tiny_bert_dir, "--index-dir", index_dir)
    model = IndexStore(index_dir).read_manifest(IndexStore(index_dir).names()[0]).model_id
    with sync_api.sync_playwright() as playwright, serve(index_dir) as server:  # type: ignore[attr-defined]
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{server.url}/")
            _expect(page.locator("#conditions option")).to_have_count(2)  # the indexed conditions, suggested
            command = page.text_content("#add-command")
            assert command.startswith('condsearch index FILE -c "the new condition" --mode csr --name ')
            assert command.endswith(" --index-dir INDEX_DIR")  # this corpus, in the server's folder (issue 59)
            # the server names a local model's and router's folders by their names, never this machine's paths
            assert page.text_content("#add-model") == f"model {Path(model).name}, router {moved_router.name}, mode csr"
            _search(page, QUERIES[0], COLOUR, SPORT, 3)
            assert _column(page, "left") == _api(server.url, QUERIES[0], COLOUR, 3)
            assert _column(page, "right") == _api(server.url, QUERIES[0], SPORT, 3)
            assert not errors
        finally:
            browser.close()
