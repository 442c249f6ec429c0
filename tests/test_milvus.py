"""The Milvus store, on Milvus Lite: the FAISS Flat store's results, manifest checks, atomic replacement, export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from condsearch.cli import main
from condsearch.errors import StoreError
from condsearch.scale.milvus import MilvusStore, milvus_index, parse_store

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


def test_missing_pymilvus_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pymilvus", None)  # import pymilvus raises ImportError
    result = _run("query", "x", "-c", "colour", "--store", f"milvus-lite:{tmp_path / 'm.db'}")
    assert result.exit_code == 1
    assert result.output.strip() == "Error: pymilvus is not installed: pip install 'condsearch[milvus]'"


pytest.importorskip("milvus_lite", reason="the milvus extra is not installed (pip install 'condsearch[milvus]')")


def test_milvus_lite_answers_as_faiss_flat_and_checks_the_manifest(
    tiny_bert_dir: Path, other_bert_dir: Path, tmp_path: Path
) -> None:
    corpus, where, db = _corpus(tmp_path / "c.parquet"), tmp_path / "idx", f"milvus-lite:{tmp_path / 'm.db'}"
    common = ["--model", tiny_bert_dir, "--head", "none", "--index-dir", where]
    result = _run("index", corpus, "-c", "colour", "-c", "the sport", *common, "--store", db)
    assert result.exit_code == 0, result.output
    queries = ["a girl in a red dress", "golf in the park", "dog on the beach"]
    for condition in ("colour", "the sport"):
        args = ["query", *queries, "-c", condition, "--json", "--index-dir", where]
        faiss_out, milvus_out = _run(*args, "-k", "60"), _run(*args, "-k", "10", "--store", db)
        assert faiss_out.exit_code == 0 and milvus_out.exit_code == 0, milvus_out.output
        for a, b in zip(faiss_out.stdout.splitlines(), milvus_out.stdout.splitlines(), strict=True):
            ra, rb = json.loads(a)["results"], json.loads(b)["results"]
            assert len(rb) == 10
            np.testing.assert_allclose([r["score"] for r in ra[:10]], [r["score"] for r in rb], atol=1e-5)
            # the same rows up to ties: the random tiny BERT scores many rows within 1e-6 of each other
            exact = {r["id"]: (r["score"], r["text"]) for r in ra}
            for r in rb:
                assert exact[r["id"]][1] == r["text"] and abs(exact[r["id"]][0] - r["score"]) < 1e-5
    # the index's own model is checked as for FAISS: another one is refused in one line
    refused = _run("query", "x", "-c", "colour", "--model", other_bert_dir, "--store", db)
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    unknown = _run("query", "x", "-c", "weather", "--store", db)
    assert unknown.exit_code == 1 and "no index for condition 'weather'" in unknown.output


def test_replacement_is_atomic_and_leaves_no_rows(tiny_bert_dir: Path, tmp_path: Path) -> None:
    """A failed write leaves the old vectors answering; a finished one deletes them after the flip."""
    from condsearch.scale.export import export_index
    from condsearch.store import IndexStore

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
