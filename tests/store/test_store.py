"""The index store: round trips, atomic replacement, crashes, concurrent readers, old layouts, damaged indexes."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import faiss
import numpy as np
import pyarrow.parquet as pq
import pytest

import condsearch
import condsearch.store.file_checks
import condsearch.store.folder
from condsearch.base.faiss_indexes import build_index, exact_search, normalize, search
from condsearch.errors import StoreError
from condsearch.store.folder import (
    FORMAT_VERSION,
    INDEX_FILE,
    MANIFEST,
    ROWS_FILE,
    VERSIONS,
    IndexStore,
    Manifest,
    index_name,
)

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
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def _stray(root: Path) -> list[str]:
    """Return what a finished write should not have left: anything but each index's link, version and lock."""
    keep = {root / VERSIONS}
    for name in _visible(root):
        keep |= {root / name, root / VERSIONS / name, root / VERSIONS / f"{name}.lock"}
        keep.add((root / name).resolve())
    found = [*root.iterdir(), *((root / VERSIONS).iterdir() if (root / VERSIONS).is_dir() else [])]
    found += [v for d in (root / VERSIONS).glob("*") if d.is_dir() for v in d.iterdir()]
    # a lock file, or the empty folder of a first write that failed, holds no data
    found = [p for p in found if p.suffix != ".lock" and not (p.is_dir() and not any(p.iterdir()))]
    return sorted(str(p.relative_to(root)) for p in found if p not in keep and p.resolve() not in keep)


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
        "index_size",
        "index_mtime_ns",
        "index_probe",
        "created_at",
    ):
        assert key in raw, key
    assert raw["format_version"] == FORMAT_VERSION
    assert raw["condsearch_version"] == condsearch.__version__
    assert raw["n_vectors"] == 5 and raw["dim"] == DIM and raw["condition"] == "colour"
    assert len(raw["index_checksum"]) == 64 and len(raw["index_probe"]) == 64
    # format 4: every file's sha256 and size (write() was given no vectors, so there are none)
    assert sorted(raw["files"]) == [INDEX_FILE, ROWS_FILE]
    assert raw["files"][INDEX_FILE] == {"sha256": raw["index_checksum"], "size": raw["index_size"]}
    assert raw["files"][ROWS_FILE]["size"] == (tmp_path / name / ROWS_FILE).stat().st_size
    stat = (tmp_path / name / INDEX_FILE).stat()
    assert (raw["index_size"], raw["index_mtime_ns"]) == (stat.st_size, stat.st_mtime_ns)
    m = store.read_manifest(name)
    written = ("index_checksum", "index_size", "index_mtime_ns", "index_probe", "files", "condsearch_version")
    written += ("created_at",)
    assert m == replace(_manifest("colour", 5), **{k: getattr(m, k) for k in written})


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
    assert _visible(tmp_path) == [name] and _stray(tmp_path) == []  # no temporaries, no older versions
    assert (tmp_path / name).is_symlink() and (tmp_path / name / MANIFEST).is_file()


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
    assert _visible(tmp_path) == [name] and _stray(tmp_path) == []
    assert store.load(name).ids == [f"old{i}" for i in range(5)]


def test_failed_first_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = IndexStore(tmp_path)
    monkeypatch.setattr(faiss, "write_index", lambda *a: (_ for _ in ()).throw(RuntimeError("disk")))
    with pytest.raises(RuntimeError):
        _write(store)
    assert _visible(tmp_path) == [] and _stray(tmp_path) == []
    assert store.names() == []


def test_a_write_killed_before_it_is_published_leaves_the_old_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=5, prefix="old")

    def killed(src, dst):
        raise KeyboardInterrupt  # the process dies just before the symlink moves to the new version

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        _write(store, n=7, seed=1, prefix="new")
    monkeypatch.undo()
    assert _stray(tmp_path)  # the unpublished version is left, unseen
    assert store.names() == [name] and store.find("colour") == name
    assert store.load(name).ids == [f"old{i}" for i in range(5)]
    _write(store, n=3, seed=2, prefix="next")  # the next write of the index tidies up
    assert store.load(name).ids == [f"next{i}" for i in range(3)] and _stray(tmp_path) == []


def _as_format_1(store: IndexStore, name: str) -> None:
    """Turn name into what condsearch wrote before versioned folders: a real folder, manifest format 1."""
    link = store.root / name
    version = link.resolve()
    link.unlink()
    shutil.copytree(version, link)
    shutil.rmtree(store.root / VERSIONS)
    raw = json.loads((link / MANIFEST).read_text())
    for key in ("index_size", "index_mtime_ns", "index_probe", "files"):
        del raw[key]
    (link / MANIFEST).write_text(json.dumps({**raw, "format_version": 1}))


def test_format_1_folders_stay_readable_and_the_next_write_moves_them(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    name, vecs = _write(store, n=5, prefix="old")
    _as_format_1(store, name)
    assert store.names() == [name] and store.find("colour") == name
    stored = store.load(name)  # no size or mtime recorded: checked by its full sha256, as format 1 was
    assert stored.ids == [f"old{i}" for i in range(5)] and stored.manifest.format_version == 1
    assert store.verify(name).format_version == 1
    _flip_bytes(tmp_path / name / INDEX_FILE, 40)
    with pytest.raises(StoreError, match="damaged"):
        store.load(name)
    _write(store, n=7, seed=1, prefix="new")
    assert (tmp_path / name).is_symlink() and _stray(tmp_path) == []
    assert store.load(name).ids == [f"new{i}" for i in range(7)]


@pytest.mark.parametrize("how", ["renamed", "format-1 folder"])
def test_an_index_an_old_crash_left_aside_is_read_in_place(tmp_path: Path, how: str) -> None:
    """An older condsearch killed between its two renames left only .trash-<name>-*: read it, rename nothing."""
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=5, prefix="old")
    if how == "format-1 folder":
        _as_format_1(store, name)
    (tmp_path / name).rename(tmp_path / f".trash-{name}-123-456")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert store.names() == [name] and store.find("colour") == name and store.find("colour", "corpus") == name
    assert store.load(name).ids == [f"old{i}" for i in range(5)]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # readers never rename
    _write(store, n=7, seed=1, prefix="new")
    assert store.load(name).ids == [f"new{i}" for i in range(7)] and _stray(tmp_path) == []


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
@pytest.mark.parametrize("mtime", ["changed", "kept"])
def test_corrupt_index_file_is_store_error(tmp_path: Path, where: str, mtime: str) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=8000)  # 256 KB: its middle lies outside the first and last 64 KiB
    path = tmp_path / name / INDEX_FILE
    stat = path.stat()
    _flip_bytes(path, {"start": 0, "middle": stat.st_size // 2, "end": stat.st_size - 4}[where])
    shift = 10**9 if mtime == "changed" else 0
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + shift))
    with pytest.raises(StoreError, match="damaged"):
        store.verify(name)
    if where == "middle" and mtime == "kept":
        # what the cheap check cannot see: a same-size edit inside the file that kept its mtime
        assert store.load(name).index.ntotal == 8000
    else:
        with pytest.raises(StoreError, match="checksum mismatch; the index file is damaged"):
            store.load(name)


def test_load_does_not_hash_the_whole_index_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = IndexStore(tmp_path)
    name, _ = _write(store, n=20)
    hashed: list[str] = []
    real = condsearch.store.file_checks.sha256_of
    monkeypatch.setattr(condsearch.store.file_checks, "sha256_of", lambda fh: hashed.append(fh.name) or real(fh))
    assert store.load(name).index.ntotal == 20 and hashed == []
    assert store.verify(name).n_vectors == 20 and hashed == [INDEX_FILE, ROWS_FILE]


def test_a_copied_index_loads_by_its_full_checksum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = IndexStore(tmp_path / "a")
    name, _ = _write(store, n=20)
    shutil.copytree(tmp_path / "a", tmp_path / "b", symlinks=True, copy_function=shutil.copy)  # new mtimes
    copy = IndexStore(tmp_path / "b")
    assert (tmp_path / "b" / name / INDEX_FILE).stat().st_mtime_ns != copy.read_manifest(name).index_mtime_ns
    assert copy.load(name).ids == store.load(name).ids


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
    with pytest.raises(StoreError, match="rows.parquet: 20 bytes where the manifest says .*; the file is damaged"):
        store.load(name)
    raw = json.loads((tmp_path / name / MANIFEST).read_text())
    del raw["files"]  # format 3 recorded no sizes: parsing tells
    (tmp_path / name / MANIFEST).write_text(json.dumps({**raw, "format_version": 3}))
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


@pytest.mark.parametrize("version", [0, 7, "1", "2", "3", "4", "5", "6", None])
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


# ----------------------------------------------------------------- readers while a writer replaces the index

_SIZES = {"a": 5, "b": 7}


def _read_loop(root: str, seconds: float) -> tuple[int, list[str]]:
    """List, find and load the index over and over (as `list` and `query` do); return reads and problems."""
    store = IndexStore(root)
    problems: list[str] = []
    reads = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            names = store.names()
            name = store.find("colour")
            listed = dict(store.manifests())
            stored = store.load(name)
            prefixes = {str(i)[0] for i in stored.ids}
            n = _SIZES.get(next(iter(prefixes)), -1) if len(prefixes) == 1 else -1
            whole = n == len(stored.ids) == len(stored.texts) == stored.manifest.n_vectors == stored.index.ntotal
            if names != [name] or not isinstance(listed.get(name), Manifest) or not whole:
                problems.append(f"incomplete read: names={names} ids={stored.ids} listed={listed}")
        except Exception as exc:  # noqa: BLE001 - every failure is a finding
            problems.append(f"{type(exc).__name__}: {exc}")
        reads += 1
    return reads, problems


def _write_rows(store: IndexStore, prefix: str) -> None:
    n = _SIZES[prefix]
    store.write(_manifest("colour", n), build_index(_vectors(n)), [f"{prefix}{i}" for i in range(n)], [prefix] * n)


def test_readers_never_see_a_partial_index_while_a_writer_replaces_it(tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    _write_rows(store, "a")
    context = multiprocessing.get_context("spawn")  # separate processes, as `query` beside `index` are
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        readers = [pool.submit(_read_loop, str(tmp_path), 2.0) for _ in range(2)]
        writes = 0
        while not all(r.done() for r in readers):
            _write_rows(store, "ab"[writes % 2])  # the writer must never fail either
            writes += 1
        results = [r.result() for r in readers]
    problems = [p for _, found in results for p in found]
    assert problems == [], f"{len(problems)} bad reads, first: {problems[:3]}"
    assert writes >= 20 and all(reads >= 20 for reads, _ in results), (writes, [r for r, _ in results])
    assert _stray(tmp_path) == []
