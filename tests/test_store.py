"""The index store: round trips, atomic replacement, crash recovery and refusal of damaged indexes."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import faiss
import numpy as np
import pyarrow.parquet as pq
import pytest

import condsearch
from condsearch.errors import StoreError
from condsearch.index import build_index, exact_search, normalize, search
from condsearch.store import FORMAT_VERSION, INDEX_FILE, MANIFEST, ROWS_FILE, IndexStore, Manifest, index_name

DIM = 8


def _manifest(condition: str = "colour", n: int = 5, corpus_name: str = "corpus", **kw) -> Manifest:
    fields = dict(
        condition=condition,
        corpus_name=corpus_name,
        corpus_path="/data/corpus.parquet",
        corpus_checksum="c" * 64,
        model_id="test/hash",
        model_revision="1",
        encoder={"model_id": "test/hash", "revision": "1", "dim": DIM},
        mode="case",
        head="none",
        head_checksum="",
        dim=DIM,
        metric="inner_product",
        factory="Flat",
        n_vectors=n,
        n_skipped=0,
    )
    fields.update(kw)
    return Manifest(**fields)


def _vectors(n: int, seed: int = 0) -> np.ndarray:
    return normalize(np.random.default_rng(seed).standard_normal((n, DIM)))


def _write(
    store: IndexStore,
    condition: str = "colour",
    n: int = 5,
    seed: int = 0,
    prefix: str = "t",
    corpus_name: str = "corpus",
) -> tuple[str, np.ndarray]:
    vecs = _vectors(n, seed)
    ids = [f"{prefix}{i}" for i in range(n)]
    texts = [f"{prefix} text {i}" for i in range(n)]
    name = store.write(_manifest(condition, n, corpus_name), build_index(vecs), ids, texts)
    return name, vecs


def _visible(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_index_name_is_slug_plus_hash() -> None:
    name = index_name("corpus", "Color of the Dress!")
    slug, digest = name.rsplit("-", 1)
    assert slug == "color-of-the-dress" and len(digest) == 10
    assert index_name("corpus", "Color of the Dress!") == name
    assert index_name("other", "Color of the Dress!") != name
    assert index_name("corpus", "color of the dress") != name  # the raw string, not the slug, is hashed


@pytest.mark.parametrize(
    "condition", ["../../etc/passwd", "/abs/path", "a/../../b", "..", "颜色", "\x00nul", "x" * 300]
)
def test_index_name_is_a_single_safe_path_component(condition: str) -> None:
    name = index_name("corpus", condition)
    assert "/" not in name and "\\" not in name and "\x00" not in name
    assert name not in (".", "..") and not name.startswith(".")
    assert len(name) <= 51


def test_write_load_round_trip(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "idx")
    name, vecs = _write(store, n=20)
    assert store.names() == [name]
    assert sorted(p.name for p in (tmp_path / "idx" / name).iterdir()) == [INDEX_FILE, MANIFEST, ROWS_FILE]
    stored = store.load(name)
    assert stored.name == name
    assert stored.ids == [f"t{i}" for i in range(20)]
    assert stored.texts == [f"t text {i}" for i in range(20)]
    assert stored.index.ntotal == 20
    got = search(stored.index, vecs[:4], 3)
    ref = exact_search(vecs, vecs[:4], 3)
    np.testing.assert_array_equal(got.ids, ref.ids)
    assert got.ids[:, 0].tolist() == [0, 1, 2, 3]


def test_int_ids_round_trip(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    vecs = _vectors(3)
    name = store.write(_manifest(n=3), build_index(vecs), [10, 20, 30], ["a", "b", "c"])
    assert store.load(name).ids == [10, 20, 30]


def test_manifest_fields(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, "colour", n=5)
    raw = json.loads((tmp_path / name / MANIFEST).read_text())
    for key in (
        "format_version",
        "condsearch_version",
        "model_id",
        "model_revision",
        "mode",
        "head_checksum",
        "dim",
        "metric",
        "factory",
        "n_vectors",
        "condition",
        "corpus_path",
        "corpus_checksum",
        "index_checksum",
        "created_at",
    ):
        assert key in raw, key
    assert raw["format_version"] == FORMAT_VERSION
    assert raw["condsearch_version"] == condsearch.__version__
    assert raw["n_vectors"] == 5 and raw["dim"] == DIM and raw["condition"] == "colour"
    assert len(raw["index_checksum"]) == 64
    m = store.read_manifest(name)
    assert m == replace(
        _manifest("colour", 5),
        index_checksum=m.index_checksum,
        condsearch_version=m.condsearch_version,
        created_at=m.created_at,
    )


def test_write_refuses_mismatched_lengths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="differ in length"):
        IndexStore(tmp_path).write(_manifest(n=3), build_index(_vectors(3)), ["a", "b"], ["x", "y"])


def test_rewrite_replaces_atomically(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=5, prefix="old")
    name2, _ = _write(store, n=7, seed=1, prefix="new")
    assert name2 == name
    stored = store.load(name)
    assert stored.ids == [f"new{i}" for i in range(7)] and stored.manifest.n_vectors == 7
    assert _visible(tmp_path) == [name]  # no .tmp- or .trash- left behind


@pytest.mark.parametrize("target", ["write_index", "write_table"])
def test_failed_write_keeps_previous_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=5, prefix="old")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(faiss if target == "write_index" else pq, target, boom)
    with pytest.raises(StoreError, match="cannot write the index of 'colour' \\(No space left on device\\)"):
        _write(store, n=7, seed=1, prefix="new")
    monkeypatch.undo()
    assert _visible(tmp_path) == [name]
    assert store.load(name).ids == [f"old{i}" for i in range(5)]


def test_failed_first_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = IndexStore(tmp_path)
    monkeypatch.setattr(faiss, "write_index", lambda *a: (_ for _ in ()).throw(RuntimeError("disk")))
    with pytest.raises(RuntimeError):
        _write(store)
    assert _visible(tmp_path) == []
    assert store.names() == []


def _crash_between_renames(store: IndexStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewrite an index but die after the old directory was moved aside, before the new one lands."""
    real_rename = os.rename
    calls = []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process is killed here
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        _write(store, n=7, seed=1, prefix="new")
    monkeypatch.undo()
    assert len(calls) == 2


def test_crash_between_renames_is_recovered_by_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=5, prefix="old")
    _crash_between_renames(store, monkeypatch)
    left = _visible(tmp_path)
    assert len(left) == 1 and left[0].startswith(f".trash-{name}-")  # only the moved-aside old index
    stored = store.load(name)
    assert stored.ids == [f"old{i}" for i in range(5)]
    assert _visible(tmp_path) == [name]


def test_crash_between_renames_is_recovered_by_find_with_corpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=5, prefix="old")
    _crash_between_renames(store, monkeypatch)
    assert store.find("colour", "corpus") == name
    assert store.load(name).ids == [f"old{i}" for i in range(5)]


def test_crash_between_renames_is_recovered_by_find(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=5, prefix="old")
    _crash_between_renames(store, monkeypatch)
    assert store.find("colour") == name


def test_hidden_temporaries_are_not_listed(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store)
    (tmp_path / ".tmp-half-written").mkdir()
    (tmp_path / "stray-file.txt").write_text("x")
    assert store.names() == [name]


def _flip_bytes(path: Path, offset: int, n: int = 4) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, offset + n):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_corrupt_index_file_is_store_error(tmp_path: Path, where: str) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=20)
    path = tmp_path / name / INDEX_FILE
    size = path.stat().st_size
    _flip_bytes(path, {"start": 0, "middle": size // 2, "end": size - 4}[where])
    with pytest.raises(StoreError, match="damaged"):
        store.load(name)


def test_truncated_index_file_is_store_error(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=20)
    path = tmp_path / name / INDEX_FILE
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(StoreError):
        store.load(name)


def test_missing_index_file_is_store_error(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store)
    (tmp_path / name / INDEX_FILE).unlink()
    with pytest.raises(StoreError):
        store.load(name)


def test_corrupt_rows_file_is_store_error(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store)
    (tmp_path / name / ROWS_FILE).write_bytes(b"garbage, not parquet")
    with pytest.raises(StoreError, match="unreadable"):
        store.load(name)


def test_rows_disagreeing_with_manifest_is_store_error(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=5)
    other, _ = _write(store, "sport", n=6)
    (tmp_path / name / ROWS_FILE).write_bytes((tmp_path / other / ROWS_FILE).read_bytes())
    with pytest.raises(StoreError, match="disagree"):
        store.load(name)


@pytest.mark.parametrize("content", [b"{garbage", b"\xff\xfe\x00binary", b"[1, 2, 3]", b"null", b""])
def test_garbage_manifest_is_store_error(tmp_path: Path, content: bytes) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store)
    (tmp_path / name / MANIFEST).write_bytes(content)
    with pytest.raises(StoreError):
        store.load(name)
    listed = dict(store.manifests())
    assert isinstance(listed[name], StoreError)


def test_missing_manifest_is_store_error(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store)
    (tmp_path / name / MANIFEST).unlink()
    with pytest.raises(StoreError, match="not an index"):
        store.load(name)


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_wrong_format_version_is_store_error(tmp_path: Path, version) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store)
    path = tmp_path / name / MANIFEST
    raw = json.loads(path.read_text())
    raw["format_version"] = version
    path.write_text(json.dumps(raw))
    with pytest.raises(StoreError, match="unsupported index format"):
        store.load(name)


def test_manifest_with_unknown_fields_is_store_error(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store)
    path = tmp_path / name / MANIFEST
    raw = json.loads(path.read_text())
    raw["from_the_future"] = 1
    path.write_text(json.dumps(raw))
    with pytest.raises(StoreError, match="fields"):
        store.read_manifest(name)


def test_find_by_condition(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    colour, _ = _write(store, "colour")
    sport, _ = _write(store, "sport")
    assert store.find("colour") == colour
    assert store.find("sport", "corpus") == sport


def test_unknown_condition_lists_indexed_conditions(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    _write(store, "colour")
    _write(store, "sport")
    with pytest.raises(StoreError) as info:
        store.find("mood")
    msg = str(info.value)
    assert "'mood'" in msg and "'colour'" in msg and "'sport'" in msg


def test_unknown_condition_in_empty_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="indexed: none"):
        IndexStore(tmp_path / "does-not-exist").find("colour")


def test_condition_in_several_corpora_needs_a_corpus_name(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    a, _ = _write(store, "colour", corpus_name="a")
    b, _ = _write(store, "colour", corpus_name="b")
    with pytest.raises(StoreError, match="several corpora"):
        store.find("colour")
    assert store.find("colour", "a") == a and store.find("colour", "b") == b


def test_default_index_dir_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CONDSEARCH_INDEX_DIR", str(tmp_path / "env"))
    assert IndexStore().root == tmp_path / "env"
    monkeypatch.delenv("CONDSEARCH_INDEX_DIR")
    assert IndexStore().root == Path("indexes")
