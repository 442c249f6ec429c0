"""Metadata and filters (issue 59 item 1): kept columns, `--where` filters before ranking, upsert's metadata."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

import condsearch
from condsearch.base.filtered_search import search_allowed
from condsearch.cli import main
from condsearch.errors import CondsearchError, CorpusError, FilterError
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.as_json import query_answer
from condsearch.query.config import QueryConfig
from condsearch.store.folder import ROWS_FILE, VECTORS_FILE, IndexStore
from tests.conftest import HashEncoder

TOPIC = "the topic"
N = 240
LANGS = ("en", "de", "fr")


def _table(n: int = N) -> pa.Table:
    return pa.table(
        {
            "id": [f"r{i}" for i in range(n)],
            "text": [f"sentence {i} about thing {i % 17}" for i in range(n)],
            "lang": [LANGS[i % 3] for i in range(n)],
            "year": pa.array([1990 + i % 40 for i in range(n)], type=pa.int32()),
            "price": [i / 4 for i in range(n)],
            "ok": [i % 2 == 0 for i in range(n)],
            "day": pa.array([datetime.date(2020, 1, 1) + datetime.timedelta(days=i) for i in range(n)]),
            "at": pa.array([datetime.datetime(2021, 5, 1, i % 24) for i in range(n)], type=pa.timestamp("ms")),
            "kind": pa.array([("a", "b")[i % 2] for i in range(n)]).dictionary_encode(),  # pandas' category
        }
    )


def _store(root: Path, factory: str = "Flat", **keep: object) -> tuple[condsearch.Store, Vectorizer]:
    vec = Vectorizer(HashEncoder(), None, "none", "")
    store = condsearch.open(root, model=condsearch.Model(vec))
    store.index(_table(), TOPIC, name="c", factory=factory, **keep)  # type: ignore[arg-type]
    return store, vec


def _brute_force(root: Path, vec: Vectorizer, query: str, keep: list[bool], k: int) -> list[str]:
    """Filter, then rank: the reference a filtered search must equal."""
    store = IndexStore(root)
    name = store.find(TOPIC, "c")
    vectors = np.load(root / name / VECTORS_FILE)
    ids = pq.read_table(root / name / ROWS_FILE, columns=["id"]).column("id").to_pylist()
    q = vec.encode([query], TOPIC)[0]
    allowed = [i for i in range(len(ids)) if keep[i]]
    scores = vectors[allowed] @ q
    order = np.argsort(-scores, kind="stable")[:k]
    return [ids[allowed[j]] for j in order]


def test_kept_columns_round_trip_typed(tmp_path: Path) -> None:
    store, _ = _store(tmp_path / "all")
    rows = pq.read_table(tmp_path / "all" / IndexStore(tmp_path / "all").find(TOPIC) / ROWS_FILE)
    expected = _table()
    assert rows.column_names == ["id", "text", "text_hash", "lang", "year", "price", "ok", "day", "at", "kind"]
    for name in ("lang", "year", "price", "ok", "day", "at"):
        assert rows.schema.field(name).type == expected.schema.field(name).type
        assert rows.column(name).to_pylist() == expected.column(name).to_pylist()
    assert rows.schema.field("kind").type == pa.string()  # a category is kept as its values
    loaded = IndexStore(tmp_path / "all").load(IndexStore(tmp_path / "all").find(TOPIC))
    assert loaded.metadata is not None and loaded.metadata.column("day").to_pylist()[3] == datetime.date(2020, 1, 4)
    [got] = store.get(["r5"], corpus="c")
    assert got["metadata"] == {
        "lang": "fr",
        "year": 1995,
        "price": 1.25,
        "ok": False,
        "day": datetime.date(2020, 1, 6),
        "at": datetime.datetime(2021, 5, 1, 5),
        "kind": "b",
    }
    some, _ = _store(tmp_path / "some", keep_columns=["year", "lang"])
    assert some.search("thing", condition=TOPIC, k=1)[0].metadata.keys() == {"year", "lang"}
    none, _ = _store(tmp_path / "none", keep_columns=[])
    hits = none.search("thing", condition=TOPIC, k=2)
    assert hits[0].metadata == {} and "metadata" not in hits.to_dicts()[0]
    assert none.get(["r1"], corpus="c") == [{"id": "r1", "text": "sentence 1 about thing 1"}]
    with pytest.raises(CorpusError, match=r"no column 'nope' to keep; columns are id, text, lang"):
        _store(tmp_path / "bad", keep_columns=["nope"])
    with pytest.raises(CorpusError, match="is the text column"):
        _store(tmp_path / "bad", keep_columns=["text"])


def test_streamed_files_keep_their_columns_across_chunks(tmp_path: Path, hash_encoder: HashEncoder) -> None:
    from condsearch.corpus.reader import scan_corpus
    from condsearch.ingest import index_corpus

    table = _table().drop_columns(["kind"])
    path = tmp_path / "corpus.csv"
    import pyarrow.csv as pacsv

    pacsv.write_csv(table.drop_columns(["at"]), path)
    blank = table.set_column(
        1, "text", pa.array([("" if i % 5 == 0 else t) for i, t in enumerate(table["text"].to_pylist())])
    )
    parquet = tmp_path / "corpus.parquet"
    pq.write_table(blank, parquet)
    store = IndexStore(tmp_path / "idx")
    vec = Vectorizer(hash_encoder, None, "none", "")
    for corpus, name in ((scan_corpus(path), "csv"), (scan_corpus(parquet, keep=["year", "day"]), "pq")):
        [index] = index_corpus(corpus, [TOPIC], vec, store, corpus_name=name, chunk_rows=7)
        rows = pq.read_table(store.root / index / ROWS_FILE)
        source = table if name == "csv" else blank.filter(pa.array([i % 5 != 0 for i in range(N)]))
        assert rows.column("id").to_pylist() == source["id"].to_pylist()
        assert rows.column("text").to_pylist() == source["text"].to_pylist()
        assert rows.column("year").to_pylist() == source["year"].to_pylist()
        assert rows.column("day").to_pylist() == source["day"].to_pylist()
        assert rows.schema.field("day").type == pa.date32()
    assert "lang" not in pq.read_schema(store.root / store.find(TOPIC, "pq") / ROWS_FILE).names


@pytest.mark.parametrize("factory", ["Flat", "HNSW16", "IVF8,Flat"])
def test_where_equals_filter_then_rank(tmp_path: Path, factory: str) -> None:
    store, vec = _store(tmp_path, factory)
    table = _table()
    cases = {
        "lang = 'en' AND year >= 2000": [
            lang == "en" and year >= 2000
            for lang, year in zip(table["lang"].to_pylist(), table["year"].to_pylist(), strict=True)
        ],
        "NOT ok OR price < 3": [
            not ok or p < 3 for ok, p in zip(table["ok"].to_pylist(), table["price"].to_pylist(), strict=True)
        ],
        "lang IN ('de', 'fr') AND day BETWEEN '2020-02-01' AND DATE '2020-05-01'": [
            lang in ("de", "fr") and datetime.date(2020, 2, 1) <= d <= datetime.date(2020, 5, 1)
            for lang, d in zip(table["lang"].to_pylist(), table["day"].to_pylist(), strict=True)
        ],
        "id = 'r7'": [i == 7 for i in range(N)],
    }
    for where, keep in cases.items():
        for query in ("thing 3", "sentence 100"):
            hits = store.search(query, condition=TOPIC, k=10, where=where)
            assert [h.id for h in hits] == _brute_force(tmp_path, vec, query, keep, 10), (where, factory)
            for h in hits:
                assert keep[h.row] and h.metadata["lang"] == table["lang"][h.row].as_py()
    assert len(store.search("thing", condition=TOPIC, where="lang = 'xx'")) == 0  # nothing matches: no error


@pytest.mark.parametrize("factory", ["Flat", "SQ8", "HNSW32", "IVF16,Flat", "IVF16,PQ8"])
def test_search_allowed_by_index_type(factory: str) -> None:
    rng = np.random.default_rng(0)
    n, d = 3000, 16
    x = rng.standard_normal((n, d)).astype(np.float32)
    faiss.normalize_L2(x)
    q = x[:4] + 0.1 * rng.standard_normal((4, d)).astype(np.float32)
    index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x)
    small = np.sort(rng.choice(n, 40, replace=False))
    large = np.sort(rng.choice(n, 2000, replace=False))
    for allowed in (small, large):
        result, exact = search_allowed(index, q, 5, allowed, exact_rows=100, widen_max=QueryConfig.filter_widen_max)
        assert result.ids.shape == (4, 5) and np.isin(result.ids, allowed).all()
        assert (np.diff(result.scores, axis=1) <= 1e-6).all()  # best first
        if exact and factory in ("Flat", "HNSW32", "IVF16,Flat"):  # exact vectors: equal to brute force
            brute = allowed[np.argsort(-(q @ x[allowed].T), axis=1)[:, :5]]
            np.testing.assert_array_equal(result.ids, brute)
        assert exact == (factory in ("Flat", "SQ8") or len(allowed) <= 100)
    empty, exact = search_allowed(index, q, 5, np.array([], dtype=np.int64), exact_rows=100, widen_max=1)
    assert empty.ids.shape == (4, 0) and exact


def test_bad_filters_are_one_line(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    bad = {
        "nope = 1": "no column 'nope'; the index keeps: lang, year, price, ok, day, at, kind, id",
        "year >= 'abc'": "holds int32, and 'abc' is not one",
        "lang = 5": "holds string, and 5 is not one",
        "year >= ": "cannot read the filter",
        "lang = 'en'; DROP TABLE x": "is not one condition",
        "year = NULL": "IS NULL",
        "": "the filter is empty",
    }
    for where, message in bad.items():
        with pytest.raises(FilterError, match=None) as caught:
            store.search("thing", condition=TOPIC, where=where)
        assert message in str(caught.value) and "\n" not in str(caught.value), (where, str(caught.value))
    assert isinstance(FilterError("x"), CondsearchError)


def test_upsert_keeps_and_replaces_metadata(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    store.upsert(["sentence 1 rewritten"], ids=["r1"], corpus="c")  # no metadata: the row keeps its columns
    [r1] = store.get(["r1"], corpus="c")
    assert (r1["text"], r1["metadata"]["lang"], r1["metadata"]["year"]) == ("sentence 1 rewritten", "de", 1991)
    store.upsert(
        ["sentence 2 rewritten", "a new row"],
        ids=["r2", "n1"],
        corpus="c",
        metadata=[{"year": 2031, "day": datetime.date(1999, 1, 1)}, {"lang": "it"}],
    )
    r2, n1 = store.get(["r2", "n1"], corpus="c")
    assert r2["metadata"]["year"] == 2031 and r2["metadata"]["lang"] == "fr"  # given replaced, the rest kept
    assert r2["metadata"]["day"] == datetime.date(1999, 1, 1)
    assert n1["metadata"]["lang"] == "it" and n1["metadata"]["year"] is None
    assert [h.id for h in store.search("row", condition=TOPIC, where="lang = 'it'")] == ["n1"]
    assert [h.id for h in store.search("x", condition=TOPIC, where="year = 2031")] == ["r2"]
    store.delete(["r3"], corpus="c")
    [r4] = store.get(["r4"], corpus="c")
    assert r4["metadata"]["year"] == 1994  # a delete moves rows, with their columns
    before = store.get(["r5"], corpus="c")
    with pytest.raises(CondsearchError, match=r"keeps no column 'colour' \(it keeps: lang, year"):
        store.upsert(["t"], ids=["r5"], corpus="c", metadata=[{"colour": "red"}])
    with pytest.raises(CondsearchError, match="column 'year' holds int32"):
        store.upsert(["t"], ids=["r5"], corpus="c", metadata=[{"year": "abc"}])
    with pytest.raises(CondsearchError, match="1 metadata entries for 2 texts"):
        store.upsert(["t", "u"], ids=["r5", "r6"], corpus="c", metadata=[{}])
    assert store.get(["r5"], corpus="c") == before  # refused: nothing changed


def test_json_answer_carries_metadata(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    hits = store.search("thing", condition=TOPIC, k=3, where="day >= '2020-03-01'")
    answer = query_answer(hits)
    row = answer["results"][0]
    assert list(row) == ["rank", "id", "score", "text", "metadata"]
    assert row["metadata"]["day"] >= "2020-03-01" and isinstance(row["metadata"]["at"], str)
    json.dumps(answer)  # every value is JSON
    table = hits.to_arrow()
    assert table.column("metadata").to_pylist() == [h.metadata for h in hits]


# ---------------------------------------------------------------- the CLI and the server


def _run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_line_error(result: Result, match: str) -> None:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and match in lines[0], result.stderr


def test_cli_keep_columns_and_where(tiny_bert_dir: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(_table(30), corpus)
    folder = tmp_path / "indexes"
    model = ["--model", tiny_bert_dir, "--head", "none", "--mode", "case", "--index-dir", folder]
    done = _run("index", corpus, "-c", TOPIC, "--keep-columns", "lang,year", *model)
    assert done.exit_code == 0, done.output
    base = ["query", "thing 3", "-c", TOPIC, "-k", "5", "--index-dir", folder, "--json"]
    result = _run(*base, "--where", "lang = 'en' AND year >= 1995")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert len(answer["results"]) == 5
    for row in answer["results"]:
        assert row["metadata"]["lang"] == "en" and row["metadata"]["year"] >= 1995
        assert set(row["metadata"]) == {"lang", "year"}
    empty = _run(*base, "--where", "year > 3000")
    assert empty.exit_code == 0 and json.loads(empty.stdout)["results"] == []
    _one_line_error(_run(*base, "--where", "price > 1"), "no column 'price'; the index keeps: lang, year, id")
    _one_line_error(_run(*base, "--where", "year >= 'abc'"), "'abc' is not one")
    _one_line_error(_run(*base, "--where", "year >="), "cannot read the filter")
    text = _run("query", "thing 3", "-c", TOPIC, "-k", "1", "--index-dir", folder, "--where", "lang = 'fr'")
    assert text.exit_code == 0 and '{"lang": "fr"' in text.stdout
    none = _run("index", corpus, "-c", TOPIC, "--keep-columns", "", "--name", "bare", *model)
    assert none.exit_code == 0, none.output
    bare = _run(*base, "--corpus", "bare")
    assert "metadata" not in json.loads(bare.stdout)["results"][0]
    _one_line_error(_run("index", corpus, "-c", TOPIC, "--keep-columns", "nope", *model), "no column 'nope' to keep")


def test_server_where(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from condsearch.query.resident import Resident
    from condsearch.serve.app import create_app
    from condsearch.serve.config import ServeConfig

    store, vec = _store(tmp_path)
    resident = Resident(IndexStore(tmp_path), lambda m: vec)
    with TestClient(create_app(resident, ServeConfig(build=False))) as client:
        body = {"query": "thing 3", "condition": TOPIC, "k": 4, "where": "lang = 'de' AND year < 2010"}
        ok = client.post("/query", json=body)
        assert ok.status_code == 200, ok.text
        results = ok.json()["results"][0]["results"]
        assert [r["id"] for r in results] == [
            h.id for h in store.search("thing 3", condition=TOPIC, k=4, where=body["where"])
        ]
        assert all(r["metadata"]["lang"] == "de" and r["metadata"]["year"] < 2010 for r in results)
        for where in ("nope = 1", "year >= 'abc'", "year >="):
            bad = client.post("/query", json={**body, "where": where})
            assert bad.status_code == 422 and "\n" not in bad.json()["error"], bad.text
        none = client.post("/query", json={**body, "where": "lang = 'xx'"})
        assert none.status_code == 200 and none.json()["results"][0]["results"] == []
        assert client.post("/query", json={**body, "where": 5}).status_code == 422
