"""The Milvus store, on Milvus Lite: the FAISS Flat store's results, manifest checks, atomic replacement, export."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from condsearch.cli import main
from condsearch.errors import StoreError
from condsearch.scale.milvus import MilvusStore, milvus_index, parse_store
from tests.tolerance import score_tolerance

#: Milvus and FAISS take the inner products of the same float32 unit vectors (the tiny BERT's 32
#: entries) in their own kernels: scores agree up to the rounding of those sums
SCORE_TOL = score_tolerance(32)

WORDS = "girl dress red blue tennis court dog beach man park golf ball".split()


def _corpus(path: Path, n: int = 60, ids: bool = True) -> Path:
    texts = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 2 + i % 6)) + f" {i}" for i in range(n)]
    cols = {"id": [f"r{i}" for i in range(n)], "text": texts} if ids else {"text": texts}
    pq.write_table(pa.table(cols), path)
    return path


def _run(*args: str) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_store_specs() -> None:
    assert parse_store(None) is None
    lite = parse_store("milvus-lite:some/where.db")
    assert lite is not None and lite.lite and lite.uri.endswith("some/where.db")
    server = parse_store("milvus://db.example:19530")
    assert server is not None and not server.lite and server.uri == "http://db.example:19530"
    for bad in ("milvus-lite:x.sqlite", "milvus://nohost", "faiss:x", "milvus:x.db"):
        with pytest.raises(StoreError):
            parse_store(bad)
    assert milvus_index("Flat", "") == ("FLAT", {}, {})
    assert milvus_index("HNSW32", "efSearch=64")[0::2] == ("HNSW", {"ef": 64})
    assert milvus_index("IVF16,Flat", "nprobe=4") == ("IVF_FLAT", {"nlist": 16}, {"nprobe": 4})


def test_bad_store_is_one_line_usage_error(tmp_path: Path) -> None:
    result = _run("query", "x", "-c", "colour", "--store", "milvus:nowhere")
    assert result.exit_code == 2 and "--store" in result.output and "Traceback" not in result.output


def test_query_refuses_index_dir_beside_store(tmp_path: Path) -> None:
    (tmp_path / "m.db" / "collections").mkdir(parents=True)  # a milvus-lite 3 database's folder
    (tmp_path / "m.db" / "LOCK").touch()
    store = f"milvus-lite:{tmp_path / 'm.db'}"
    result = _run("query", "x", "-c", "colour", "--store", store, "--index-dir", str(tmp_path))
    assert result.exit_code == 2 and "--index-dir and --store" in result.output


def test_missing_pymilvus_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pymilvus", None)  # import pymilvus raises ImportError
    (tmp_path / "m.db" / "collections").mkdir(parents=True)  # a milvus-lite 3 database's folder
    (tmp_path / "m.db" / "LOCK").touch()
    result = _run("query", "x", "-c", "colour", "--store", f"milvus-lite:{tmp_path / 'm.db'}")
    assert result.exit_code == 1
    assert result.output.strip() == "Error: pymilvus is not installed: pip install 'condsearch[milvus]'"


def test_serve_with_missing_pymilvus_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """serve --store connects before it listens: a store it cannot open stops it with one line, exit 1."""
    monkeypatch.setitem(sys.modules, "pymilvus", None)
    (tmp_path / "m.db" / "collections").mkdir(parents=True)
    (tmp_path / "m.db" / "LOCK").touch()
    result = _run("serve", "--store", f"milvus-lite:{tmp_path / 'm.db'}", "--port", "1")
    assert result.exit_code == 1
    assert result.output.strip() == "Error: pymilvus is not installed: pip install 'condsearch[milvus]'"


def test_lite_paths_in_missing_or_unrelated_places_are_refused(tmp_path: Path) -> None:
    """A typo'd folder, a folder or file that is not a Milvus Lite database: refused in one line, nothing created."""
    notes = tmp_path / "notes.db"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    text = tmp_path / "text.db"
    text.write_text("not a database")
    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)  # must not be opened: reading it would block
    corpus = _corpus(tmp_path / "c.parquet", 10)
    cases = {
        tmp_path / "missing" / "m.db": f"folder {tmp_path / 'missing'} does not exist",
        notes: f"{notes} is not a Milvus Lite database",
        text: f"{text} is not a Milvus Lite database",
        fifo: f"{fifo} is not a Milvus Lite database",
    }
    for path, reason in cases.items():
        db = f"milvus-lite:{path}"
        for args in (
            ["query", "x", "-c", "colour", "--store", db],
            ["export", "--to", db],
            ["index", corpus, "-c", "colour", "--store", db],
        ):
            result = _run(*args, "--index-dir", tmp_path / "idx")
            assert result.exit_code == 2, (args, result.output)
            message = result.output.splitlines()[-1]  # usage, then one line: no traceback
            assert message.startswith("Error: Invalid value for '--") and message.endswith(f"': {reason}"), message
    assert not (tmp_path / "missing").exists() and not (tmp_path / "idx").exists()
    assert sorted(p.name for p in notes.iterdir()) == ["todo.txt"] and text.read_text() == "not a database"
    # a read never creates a database: query names a path where none is
    absent = tmp_path / "absent.db"
    result = _run("query", "x", "-c", "colour", "--store", f"milvus-lite:{absent}")
    assert result.exit_code == 2 and "no Milvus Lite database" in result.output and not absent.exists()


def _sqlite(path: Path, table: str) -> Path:
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY)")
    return path


def test_lite_path_rule(tmp_path: Path) -> None:
    """Writers may create a database in an existing folder; a path that exists must hold one; never open a device."""
    from condsearch.scale.lite import check_lite_path

    spec = "milvus-lite:x.db"
    new, empty, lite3 = tmp_path / "new.db", tmp_path / "empty.db", tmp_path / "lite3.db"
    empty.mkdir()
    (lite3 / "collections").mkdir(parents=True)
    (lite3 / "LOCK").touch()
    lite2 = _sqlite(tmp_path / "lite2.db", "collection_meta")  # milvus-lite 2's SQLite file
    for path in (new, empty):
        check_lite_path(spec, str(path), create=True)
        with pytest.raises(StoreError, match="no Milvus Lite database at"):
            check_lite_path(spec, str(path), create=False)
    for path in (lite3, lite2):
        check_lite_path(spec, str(path), create=True)
        check_lite_path(spec, str(path), create=False)
    (tmp_path / "zero.db").symlink_to("/dev/zero")
    for path in (_sqlite(tmp_path / "app.db", "users"), tmp_path / "zero.db", Path("/dev/null")):
        with pytest.raises(StoreError, match="is not a Milvus Lite database"):
            check_lite_path(spec, str(path), create=True)
    assert not new.exists() and os.listdir(empty) == []


pytest.importorskip("milvus_lite", reason="the milvus extra is not installed (pip install 'condsearch[milvus]')")


@pytest.mark.numerics
def test_milvus_lite_answers_as_faiss_flat_and_checks_the_manifest(
    tiny_bert_dir: Path, other_bert_dir: Path, tmp_path: Path
) -> None:
    corpus, where, db = _corpus(tmp_path / "c.parquet"), tmp_path / "idx", f"milvus-lite:{tmp_path / 'm.db'}"
    common = ["--model", tiny_bert_dir, "--head", "none", "--index-dir", where]
    result = _run("index", corpus, "-c", "colour", "-c", "the sport", *common, "--store", db)
    assert result.exit_code == 0, result.output
    queries = ["a girl in a red dress", "golf in the park", "dog on the beach"]
    for condition in ("colour", "the sport"):
        args = ["query", *queries, "-c", condition, "--json"]
        faiss_out = _run(*args, "-k", "60", "--index-dir", where)
        milvus_out = _run(*args, "-k", "10", "--store", db)
        assert faiss_out.exit_code == 0 and milvus_out.exit_code == 0, milvus_out.output
        for a, b in zip(faiss_out.stdout.splitlines(), milvus_out.stdout.splitlines(), strict=True):
            ra, rb = json.loads(a)["results"], json.loads(b)["results"]
            assert len(rb) == 10
            np.testing.assert_allclose([r["score"] for r in ra[:10]], [r["score"] for r in rb], rtol=0, atol=SCORE_TOL)
            # the same rows up to ties: the random tiny BERT scores many rows within 1e-6 of each other
            exact = {r["id"]: (r["score"], r["text"]) for r in ra}
            for r in rb:
                assert exact[r["id"]][1] == r["text"] and abs(exact[r["id"]][0] - r["score"]) <= SCORE_TOL
    # calibrated: the background travels with the manifest, so z is FAISS's
    calibrated = [
        _run("query", queries[0], "-c", "colour", "--json", "--calibrated", *w)
        for w in (("--index-dir", where), ("--store", db))
    ]
    za, zb = ([r["z"] for r in json.loads(c.stdout)["results"][:3]] for c in calibrated)
    np.testing.assert_allclose(za, zb, atol=1e-3)
    # the index's own model is checked as for FAISS: another one is refused in one line
    refused = _run("query", "x", "-c", "colour", "--model", other_bert_dir, "--store", db)
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    unknown = _run("query", "x", "-c", "weather", "--store", db)
    assert unknown.exit_code == 1 and "no index for condition 'weather'" in unknown.output


def test_replacement_is_atomic_and_leaves_no_rows(tiny_bert_dir: Path, tmp_path: Path) -> None:
    """A failed write leaves the old vectors answering; a finished one deletes them after the flip."""
    from condsearch.scale.export import export_index
    from condsearch.store.folder import IndexStore

    where, db = tmp_path / "idx", f"milvus-lite:{tmp_path / 'm.db'}"
    common = ["-c", "colour", "--model", tiny_bert_dir, "--head", "none", "--name", "c", "--index-dir", where]
    assert _run("index", _corpus(tmp_path / "v1.parquet", 40, ids=False), *common, "--store", db).exit_code == 0
    target = parse_store(db)
    assert target is not None
    milvus = MilvusStore(target)
    try:
        first = milvus.find("colour")
        assert first.partition_key  # Milvus Lite 3.2 takes a partition key
        assert _run("index", _corpus(tmp_path / "v2.parquet", 50, ids=False), *common).exit_code == 0
        store = IndexStore(where)
        calls = 0

        def failing(*args: object, **kwargs: object) -> None:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise RuntimeError("connection lost")
            real(*args, **kwargs)

        real = milvus.client.insert
        milvus.client.insert = failing
        with pytest.raises(StoreError, match="connection lost"):
            milvus.write(store.load(store.names()[0]).manifest, *_rows(store), rows=16)
        milvus.client.insert = real
        assert milvus.find("colour") == first  # the old version answers, whole
        milvus.check(first)
        assert _count(milvus, first.collection) == 40  # the failed write's rows are gone
        second = export_index(store, store.names()[0], milvus)
        assert second.tag != first.tag and second.manifest.n_vectors == 50
        milvus.check(second)
        assert _count(milvus, first.collection) == 50  # the old tag's rows were deleted after the flip
        hits = milvus.search(second, np.load(where / store.names()[0] / "vectors.npy")[:2], 3)
        assert hits.result.ids.shape == (2, 3) and hits.ids[0] == 0  # row ids are ints again
    finally:
        milvus.close()


def _rows(store: object) -> tuple[list, list, np.ndarray]:
    stored = store.load(store.names()[0])  # type: ignore[attr-defined]
    return stored.ids, stored.texts, np.load(store.root / stored.name / "vectors.npy")  # type: ignore[attr-defined]


def _count(milvus: MilvusStore, collection: str) -> int:
    return int(milvus.client.query(collection, filter="row >= 0", output_fields=["count(*)"])[0]["count(*)"])


def test_export_pushes_chosen_conditions(tiny_bert_dir: Path, tmp_path: Path) -> None:
    where, db = tmp_path / "idx", f"milvus-lite:{tmp_path / 'm.db'}"
    common = ["--model", tiny_bert_dir, "--head", "none", "--index-dir", where]
    assert _run("index", _corpus(tmp_path / "c.parquet"), "-c", "colour", "-c", "mood", *common).exit_code == 0
    result = _run("export", "--to", db, "-c", "mood", "--json", "--index-dir", where)
    assert result.exit_code == 0, result.output
    [row] = [json.loads(line) for line in result.stdout.splitlines()]
    assert row["condition"] == "mood" and row["rows"] == 60 and row["index_type"] == "FLAT"
    assert _run("query", "x", "-c", "colour", "--store", db).exit_code == 1  # not exported
    assert _run("query", "red dress", "-c", "mood", "--store", db).exit_code == 0
    none = _run("export", "--to", db, "-c", "weather", "--index-dir", where)
    assert none.exit_code == 1 and "no index for condition 'weather'" in none.output


def test_milvus_lite_2_file_is_named(tmp_path: Path) -> None:
    db = _sqlite(tmp_path / "old.db", "collection_meta")
    result = _run("query", "x", "-c", "colour", "--store", f"milvus-lite:{db}")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "a Milvus Lite 2 database: milvus-lite 3 keeps one in a folder" in result.output


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    """Run condsearch in a process of its own, as a user does: Milvus Lite's state does not carry over."""
    command = [sys.executable, "-m", "condsearch", *(str(a) for a in args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def _clean(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stderr
    for noise in ("Traceback", "NotImplementedError", "[ERROR]"):
        assert noise not in result.stderr, result.stderr
    return result


def test_round_trip_in_separate_processes(tiny_bert_dir: Path, tmp_path: Path) -> None:
    """index --store, then query --store, each in its own process; export, then query, likewise; no tracebacks.

    In one process Milvus Lite keeps its collections loaded, which hid that a new process finds them
    released (pymilvus 3 with milvus-lite 3: "call load() before search/get/query").
    """
    corpus, where = _corpus(tmp_path / "c.parquet", 40), tmp_path / "idx"
    first, second = f"milvus-lite:{tmp_path / 'first.db'}", f"milvus-lite:{tmp_path / 'second.db'}"
    common = ["--model", tiny_bert_dir, "--head", "none", "--index-dir", where]
    _clean(_cli("index", corpus, "-c", "colour", *common, "--store", first))
    ask = ["query", "a girl in a red dress", "-c", "colour", "--json", "-k", "5"]
    faiss_out = _run(*ask, "--index-dir", where)
    assert faiss_out.exit_code == 0, faiss_out.output
    exact = {r["id"]: r["score"] for r in json.loads(faiss_out.stdout)["results"]}

    def same_as_faiss(result: subprocess.CompletedProcess[str]) -> None:
        got = json.loads(_clean(result).stdout)["results"]
        assert len(got) == 5
        np.testing.assert_allclose([r["score"] for r in got], sorted(exact.values(), reverse=True), atol=1e-5)

    same_as_faiss(_cli(*ask, "--store", first))
    _clean(_cli("export", "--to", second, "--index-dir", where))  # a new database
    same_as_faiss(_cli(*ask, "--store", second))
    _clean(_cli("export", "--to", first, "--index-dir", where))  # replacing, in a database made by another process
    same_as_faiss(_cli(*ask, "--store", first))


def test_failed_export_exits_non_zero_in_one_line(tiny_bert_dir: Path, tmp_path: Path) -> None:
    """A database another process holds open: export fails with one line and exit 1."""
    where, db = tmp_path / "idx", f"milvus-lite:{tmp_path / 'm.db'}"
    common = ["--model", tiny_bert_dir, "--head", "none", "--index-dir", where]
    assert _run("index", _corpus(tmp_path / "c.parquet", 20), "-c", "colour", *common).exit_code == 0
    target = parse_store(db)
    assert target is not None
    holder = MilvusStore(target)
    holder.entries()  # opens the database here: Milvus Lite lets one process at a time in
    try:
        failed = _cli("export", "--to", db, "--index-dir", where)
    finally:
        holder.close()
    assert failed.returncode == 1, failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1 and failed.stderr.startswith("Error: "), failed.stderr
    assert failed.stdout == ""


@pytest.mark.parametrize("field,value", [("encoder", None), ("search_params", 5), ("head", 5), ("condition", ["x"])])
def test_a_catalog_manifest_field_of_the_wrong_type_is_one_store_error(field: str, value: object) -> None:
    from condsearch.scale.milvus import _parse_entry
    from condsearch.store.folder import FORMAT_VERSION, Manifest

    manifest = Manifest("c", "corpus", "", "", "m", "", {}, "case", "none", "", 4, "ip", "FLAT", 3, 0)
    body = {"collection": "c1", "tag": "1", "index_type": "FLAT", "partition_key": False}
    good = {**manifest.__dict__, "format_version": FORMAT_VERSION}
    assert _parse_entry("k", json.dumps({"manifest": good, **body}), "milvus-lite:x").manifest == Manifest(**good)
    bad = json.dumps({"manifest": {**good, field: value}, **body})
    with pytest.raises(StoreError, match=f"corrupt manifest .*{field}") as err:
        _parse_entry("k", bad, "milvus-lite:x")
    assert "\n" not in str(err.value)


@pytest.mark.numerics
def test_the_python_api_searches_milvus_as_faiss(tiny_bert_dir: Path, tmp_path: Path) -> None:
    """condsearch.open("milvus-lite:…") answers through the same query path: the FAISS store's hits, rows and all."""
    import condsearch

    corpus, where, db = _corpus(tmp_path / "c.parquet", 30), tmp_path / "idx", f"milvus-lite:{tmp_path / 'm.db'}"
    common = ["--model", tiny_bert_dir, "--head", "none", "--index-dir", where]
    assert _run("index", corpus, "-c", "colour", *common, "--store", db).exit_code == 0
    queries = ["a girl in a red dress", "golf in the park"]
    faiss_hits = condsearch.open(where).search(queries, condition="colour", k=30)
    milvus_hits = condsearch.open(db).search(queries, condition="colour", k=5)
    for a, b in zip(faiss_hits, milvus_hits, strict=True):
        assert len(b) == 5 and b.query == a.query
        np.testing.assert_allclose([h.score for h in a[:5]], [h.score for h in b], rtol=0, atol=SCORE_TOL)
        exact = {h.id: h for h in a}  # the same rows up to ties, as above
        for h in b:
            assert (exact[h.id].text, exact[h.id].row) == (h.text, h.row)
            assert abs(exact[h.id].score - h.score) <= SCORE_TOL


DEMO_QUERIES = [
    "A girl in an orange dress serves the ball",
    "Two men play soccer on a grass field",
    "A woman in a red dress walks her dog on the beach",
    "A boy rides his bicycle down a quiet street",
]


@pytest.mark.numerics
def test_serve_answers_from_milvus_as_from_faiss(tmp_path: Path) -> None:
    """serve --store milvus-lite:… answers /query through the same path as serve --index-dir: the same top 10.

    The hash encoder stands in for the model (its scores have no near-ties, so the order is exact).
    """
    import httpx

    from condsearch.corpus.demo import write_demo_corpus
    from condsearch.corpus.reader import read_corpus
    from condsearch.ingest.chunks import index_corpus
    from condsearch.model.vectorizer import Vectorizer
    from condsearch.query.resident import Resident
    from condsearch.query.sources import open_source
    from condsearch.serve.config import ServeConfig
    from condsearch.serve.server import BackgroundServer, build_app
    from condsearch.store.folder import IndexStore
    from tests.conftest import HashEncoder

    corpus, where, db = tmp_path / "demo.parquet", tmp_path / "idx", f"milvus-lite:{tmp_path / 'm.db'}"
    write_demo_corpus(corpus)
    conditions = ["color of the dress", "the sport being played"]
    vec = Vectorizer(HashEncoder(dim=32), None, "none", "")
    index_corpus(read_corpus(corpus), conditions, vec, IndexStore(where), corpus_name="demo")
    exported = _run("export", "--to", db, "--index-dir", where)
    assert exported.exit_code == 0, exported.output

    def served(**source: object) -> tuple[dict, list[dict]]:
        config = ServeConfig(reload_interval_s=0.05, **source)  # type: ignore[arg-type]
        resident = Resident(
            open_source(config.store or config.index_dir),
            lambda _manifest: vec,
            reload_interval_s=config.reload_interval_s,
        )
        with BackgroundServer(build_app(config, resident)) as server, httpx.Client(base_url=server.url) as http:
            listed = http.get("/indexes").json()
            answers = [http.post("/query", json={"queries": DEMO_QUERIES, "condition": c, "k": 10}) for c in conditions]
            assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
            unknown = http.post("/query", json={"query": "x", "condition": "the mood"})
            assert unknown.status_code == 404 and unknown.json()["conditions"] == conditions
            return listed, [a.json() for a in answers]

    faiss_listed, faiss_answers = served(index_dir=where)
    milvus_listed, milvus_answers = served(store=db)
    assert milvus_listed == faiss_listed and len(milvus_listed["indexes"]) == 2
    for f, m in zip(faiss_answers, milvus_answers, strict=True):
        assert {k: v for k, v in m.items() if k != "results"} == {k: v for k, v in f.items() if k != "results"}
        for fq, mq in zip(f["results"], m["results"], strict=True):
            assert (mq["query"], mq["condition"]) == (fq["query"], fq["condition"])
            rows = [(h["rank"], h["id"], h["text"]) for h in mq["results"]]
            assert len(rows) == 10 and rows == [(h["rank"], h["id"], h["text"]) for h in fq["results"]]
            scores = [h["score"] for h in mq["results"]]
            np.testing.assert_allclose(scores, [h["score"] for h in fq["results"]], rtol=0, atol=SCORE_TOL)
            assert min(np.diff(scores) * -1) > 1e-4  # no near-ties: the order compared above is meaningful
