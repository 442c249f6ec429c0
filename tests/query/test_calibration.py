"""Calibrated scores (issue 25): each index's recorded background, z beside the score in the CLI, server and API.

The hash encoder stands in for a model where the model is not the point; the CLI runs the tiny BERT.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

import condsearch
from condsearch.cli import main
from condsearch.corpus.reader import read_corpus
from condsearch.errors import CondsearchError
from condsearch.ingest.chunks import index_corpus
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.calibration import Background
from condsearch.query.hits import COLUMNS, Z_COLUMN
from condsearch.query.resident import Resident
from condsearch.serve.app import create_app
from condsearch.serve.config import ServeConfig
from condsearch.store.background import QUANTILES, SAMPLE_ROWS, sample_rows, score_background
from condsearch.store.folder import IndexStore
from condsearch.store.manifest import BACKGROUND_FIELDS as FIELDS
from condsearch.store.manifest import MANIFEST
from condsearch.store.vectors import VECTORS_FILE
from tests.conftest import SENTENCES, HashEncoder, WriteCorpus

COLOUR = "color of the dress"
SPORT = "the sport being played"
MORE = ["A cat sleeps on a red car.", "A horse runs on the beach.", "A dog catches a ball in the park."]


def hash_vectorizer() -> Vectorizer:
    return Vectorizer(HashEncoder(), None, "none", "")


def unit(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def direct_stats(sample: np.ndarray) -> tuple[float, float, int]:
    """Return the mean and std of the sample's distinct pair scores, from sums over the whole Gram matrix."""
    x = sample.astype(np.float64)
    gram, m = x @ x.T, len(x)
    pairs = m * (m - 1) // 2
    off = (gram.sum() - np.trace(gram)) / 2  # each distinct pair once
    off_sq = ((gram**2).sum() - (np.diag(gram) ** 2).sum()) / 2
    mean = off / pairs
    return mean, math.sqrt(off_sq / pairs - mean**2), pairs


def version_vectors(store: IndexStore, name: str) -> np.ndarray:
    return np.load(store.root / name / VECTORS_FILE, allow_pickle=False)


def assert_matches(background: dict, vectors: np.ndarray) -> None:
    """Check a recorded background against a direct computation on the same sample of vectors."""
    rows = sample_rows(len(vectors))
    mean, std, pairs = direct_stats(vectors[rows])
    assert background["sample_rows"] == len(rows) and background["pairs"] == pairs
    assert background["mean"] == pytest.approx(mean, abs=1e-5)
    assert background["std"] == pytest.approx(std, abs=1e-5)
    quantiles = [background["quantiles"][str(q)] for q in QUANTILES]
    assert quantiles == sorted(quantiles) and -1.0 - 1e-5 <= quantiles[0] and quantiles[-1] <= 1.0 + 1e-5


@pytest.fixture
def store(tmp_path: Path, corpus_file: Path) -> IndexStore:
    store = IndexStore(tmp_path / "indexes")
    index_corpus(read_corpus(corpus_file), [COLOUR, SPORT], hash_vectorizer(), store, corpus_name="corpus")
    return store


def make_old(store: IndexStore, name: str) -> None:
    """Make an index look written before backgrounds were recorded: format 5, no score_background."""
    path = store.root / name / MANIFEST
    raw = json.loads(path.read_text())
    del raw["score_background"]
    path.write_text(json.dumps({**raw, "format_version": 5}))


# ---------------------------------------------------------------- the background


def test_the_sample_is_seeded_and_all_rows_when_few() -> None:
    assert sample_rows(0).tolist() == [] and sample_rows(5).tolist() == [0, 1, 2, 3, 4]
    assert len(sample_rows(SAMPLE_ROWS)) == SAMPLE_ROWS
    big = sample_rows(50_000)
    assert len(big) == SAMPLE_ROWS == len(set(big.tolist())) and big.tolist() == sorted(big.tolist())
    assert big.max() < 50_000 and np.array_equal(big, sample_rows(50_000))


def test_score_background_matches_numpy_on_the_same_sample() -> None:
    vectors = unit(1500, seed=3)  # more rows than the sample
    background = score_background(vectors)
    assert sorted(background) == sorted(FIELDS) and background["pairs"] == SAMPLE_ROWS * (SAMPLE_ROWS - 1) // 2
    assert_matches(background, vectors)
    again = score_background(unit(1500, seed=3))
    assert again["pairs"] == background["pairs"]
    for key in ("mean", "std"):
        assert again[key] == pytest.approx(background[key], abs=1e-6)


def test_fewer_than_two_rows_record_nothing() -> None:
    assert score_background(unit(0)) == {} and score_background(unit(1)) == {}
    assert score_background(unit(2))["pairs"] == 1


def test_an_index_records_its_background_and_the_same_vectors_the_same_one(
    store: IndexStore, corpus_file: Path, tmp_path: Path
) -> None:
    for name in store.names():
        manifest = store.read_manifest(name)
        assert manifest.score_background["sample_rows"] == len(SENTENCES)
        assert_matches(manifest.score_background, version_vectors(store, name))
    colour = store.read_manifest(store.find(COLOUR)).score_background
    assert colour != store.read_manifest(store.find(SPORT)).score_background  # per condition
    other = IndexStore(tmp_path / "again")
    index_corpus(read_corpus(corpus_file), [COLOUR], hash_vectorizer(), other, corpus_name="corpus", full=True)
    again = other.read_manifest(other.find(COLOUR)).score_background
    assert again["pairs"] == colour["pairs"]
    for key in ("mean", "std"):
        assert again[key] == pytest.approx(colour[key], abs=1e-6)


def test_an_incremental_re_index_updates_the_background(store: IndexStore, write_corpus: WriteCorpus) -> None:
    before = store.read_manifest(store.find(COLOUR)).score_background
    texts = SENTENCES + MORE
    grown = write_corpus({"id": [f"s{i}" for i in range(len(texts))], "text": texts}, name="grown.parquet")
    vec = hash_vectorizer()
    [report] = index_corpus(read_corpus(grown), [COLOUR], vec, store, corpus_name="corpus")
    assert len(vec.encoder.seen) < len(texts)  # incremental: the kept rows were reused
    name = store.find(COLOUR)
    after = store.read_manifest(name).score_background
    assert after["sample_rows"] == len(texts) and after["pairs"] > before["pairs"]
    assert_matches(after, version_vectors(store, name))


def test_store_write_records_the_background_of_the_vectors_it_is_given(tmp_path: Path) -> None:
    from condsearch.base.faiss_indexes import build_index
    from tests.store.test_store import _manifest, _write

    store = IndexStore(tmp_path)
    name, _ = _write(store, n=4)  # no vectors given: none kept, no background
    assert store.read_manifest(name).score_background == {}
    vectors = unit(6, seed=5)
    ids, texts = [f"v{i}" for i in range(6)], [f"text {i}" for i in range(6)]
    name = store.write(_manifest("other", 6), build_index(vectors), ids, texts, vectors)
    assert_matches(store.read_manifest(name).score_background, vectors)


# ---------------------------------------------------------------- z, and indexes written before it


def test_z_is_the_standard_score_against_the_background(tmp_path: Path) -> None:
    api = condsearch.open(tmp_path / "api", model=condsearch.Model(hash_vectorizer()))
    [name] = api.index(SENTENCES, COLOUR)
    store = IndexStore(tmp_path / "api")
    plain = api.search(SENTENCES[3], condition=COLOUR, k=4)
    hits = api.search(SENTENCES[3], condition=COLOUR, k=4, calibrated=True)
    recorded = store.read_manifest(name).score_background
    assert hits.calibrated and not plain.calibrated and all(h.z is None for h in plain)
    assert [h.id for h in hits] == [h.id for h in plain] and [h.score for h in hits] == [h.score for h in plain]
    for h in hits:
        assert h.z == pytest.approx((h.score - recorded["mean"]) / recorded["std"], rel=1e-9)
    assert [h.z for h in hits] == sorted((h.z for h in hits), reverse=True)  # type: ignore[misc]
    assert hits.columns == (*COLUMNS, Z_COLUMN) and plain.columns == COLUMNS
    assert [d["z"] for d in hits.to_dicts()] == [h.z for h in hits] and "z" not in plain.to_dicts()[0]
    assert hits.to_arrow().column_names == [*COLUMNS, Z_COLUMN] and hits[:2].calibrated
    [listed] = api.search([SENTENCES[3]], condition=COLOUR, k=4, calibrated=True)
    assert [h.z for h in listed] == [h.z for h in hits]


def test_an_old_manifest_still_loads_and_answers_but_refuses_calibration(store: IndexStore) -> None:
    name = store.find(COLOUR)
    make_old(store, name)
    manifest = store.load(name).manifest
    assert manifest.score_background == {} and manifest.format_version == 5
    with pytest.raises(CondsearchError, match="records no score background.*re-index it") as info:
        Background.of(manifest)
    assert "\n" not in str(info.value) and "condsearch index" in str(info.value)


def test_a_background_without_spread_or_rows_is_refused(store: IndexStore) -> None:
    from dataclasses import replace

    manifest = store.read_manifest(store.find(COLOUR))
    flat = {**manifest.score_background, "std": 0.0}
    with pytest.raises(CondsearchError, match="no spread"):
        Background.of(replace(manifest, score_background=flat))
    with pytest.raises(CondsearchError, match="too few"):
        Background.of(replace(manifest, score_background={}, n_vectors=1))


# ---------------------------------------------------------------- the CLI


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def cli_index(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "cli-indexes"
    argv = ["index", corpus_file, "-c", COLOUR, "--model", tiny_bert_dir, "--head", "none", "--index-dir", folder]
    result = run(*argv)
    assert result.exit_code == 0, result.output
    return folder


def test_query_calibrated_json_and_text(cli_index: Path) -> None:
    query = [SENTENCES[0], "-c", COLOUR, "-k", 3, "--index-dir", cli_index]
    plain = json.loads(run("query", *query, "--json").stdout)
    result = run("query", *query, "--json", "--calibrated")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    store = IndexStore(cli_index)
    recorded = store.read_manifest(store.find(COLOUR)).score_background
    assert [r["score"] for r in answer["results"]] == [r["score"] for r in plain["results"]]
    assert all("z" not in r for r in plain["results"])
    for r in answer["results"]:
        assert list(r) == ["rank", "id", "score", "z", "text"]
        assert r["z"] == pytest.approx((r["score"] - recorded["mean"]) / recorded["std"], abs=1e-3)
    text = run("query", *query, "--calibrated")
    assert text.exit_code == 0, text.output
    rows = [line for line in text.stdout.splitlines() if line.startswith("   ")]
    assert len(rows) == 3 and all(" z=" in line for line in rows)
    assert f"z={answer['results'][0]['z']:+.2f}" in rows[0]


def test_query_calibrated_on_an_old_index_is_one_line_and_exits_non_zero(cli_index: Path) -> None:
    store = IndexStore(cli_index)
    make_old(store, store.find(COLOUR))
    query = [SENTENCES[0], "-c", COLOUR, "--index-dir", cli_index]
    assert run("query", *query, "--json").exit_code == 0  # nothing else changes
    result = run("query", *query, "--calibrated")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "records no score background" in errors[0] and "condsearch index" in errors[0]
    assert "Traceback" not in result.output and not result.stdout
    listed = json.loads(run("list", "--json", "--index-dir", cli_index).stdout)
    assert listed["score_background"] == {}


# ---------------------------------------------------------------- the server


@pytest.fixture
def client(store: IndexStore) -> Iterator[TestClient]:
    vec = hash_vectorizer()
    resident = Resident(store, lambda _manifest: vec, reload_interval_s=0.05)
    app = create_app(resident, ServeConfig(index_dir=store.root, batch_window_ms=0.0))
    with TestClient(app, raise_server_exceptions=False) as http:
        yield http


def test_the_server_adds_z_when_asked(client: TestClient, store: IndexStore) -> None:
    plain = client.post("/query", json={"query": SENTENCES[1], "condition": COLOUR, "k": 3})
    asked = client.post("/query", json={"query": SENTENCES[1], "condition": COLOUR, "k": 3, "calibrated": True})
    assert plain.status_code == asked.status_code == 200, asked.text
    recorded = store.read_manifest(store.find(COLOUR)).score_background
    [plain_answer], [answer] = plain.json()["results"], asked.json()["results"]
    assert all("z" not in r for r in plain_answer["results"])
    assert [r["score"] for r in answer["results"]] == [r["score"] for r in plain_answer["results"]]
    for r in answer["results"]:
        assert r["z"] == pytest.approx((r["score"] - recorded["mean"]) / recorded["std"], abs=1e-3)
    off = client.post("/query", json={"query": SENTENCES[1], "condition": COLOUR, "calibrated": False})
    assert off.status_code == 200 and all("z" not in r for r in off.json()["results"][0]["results"])
    indexes = client.get("/indexes").json()["indexes"]
    assert all(entry["score_background"]["sample_rows"] == len(SENTENCES) for entry in indexes)


@pytest.mark.parametrize("value", ["true", 1, None, [True]])
def test_the_server_refuses_a_calibrated_that_is_not_a_boolean(client: TestClient, value: object) -> None:
    response = client.post("/query", json={"query": "a dress", "condition": COLOUR, "calibrated": value})
    assert response.status_code == 422, response.text
    assert "calibrated" in response.json()["error"]


def test_the_server_refuses_calibration_of_an_old_index_with_a_409(client: TestClient, store: IndexStore) -> None:
    make_old(store, store.find(COLOUR))
    body = {"query": SENTENCES[1], "condition": COLOUR}
    assert client.post("/query", json=body).status_code == 200
    response = client.post("/query", json={**body, "calibrated": True})
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert "records no score background" in error and "\n" not in error
    assert str(store.root) not in error and ".parquet" not in error  # the server's errors name no paths
    assert client.post("/query", json={**body, "condition": SPORT, "calibrated": True}).status_code == 200
