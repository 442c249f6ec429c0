"""The store against hostile files and disks (issue 24): special files, corruption, a full disk, bad manifests.

Every read that could block or run without end runs in a forked child under a time and memory limit,
so that a regression fails its test instead of hanging the suite or filling the machine's memory.
"""

from __future__ import annotations

import errno
import json
import logging
import multiprocessing
import os
import resource
import signal
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import condsearch.store.folder
from condsearch.corpus.reader import scan_corpus
from condsearch.errors import StoreError
from condsearch.ingest.chunks import index_conditions
from condsearch.store.folder import INDEX_FILE, MANIFEST, ROWS_FILE, IndexStore, Manifest
from condsearch.store.vectors import VECTORS_FILE, text_hash
from tests.cli.test_cli import assert_clean_error, run
from tests.ingest.test_ingest import CountingVectorizer, N, _index, _same_index, _texts, _write

# ------------------------------------------------------------------ helpers


def _bounded(fn: Callable[[], Any], seconds: float = 30.0) -> tuple[str, Any]:
    """Run fn in a forked child with a time limit and 1 GiB more memory than it starts with.

    Return ("ok", its result), ("raised", "<type>: <message>") or ("died", exit code: -9 for SIGKILL);
    fail the test if it does not finish.
    """
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        with open("/proc/self/statm") as fh:
            size = int(fh.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))
        try:
            send.send(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which judges it
            send.send(("raised", f"{type(exc).__name__}: {exc}"))

    process = context.Process(target=child, daemon=True)
    process.start()
    send.close()  # the child's copy is the only one left: its death ends the pipe
    try:
        if not receive.poll(seconds):
            pytest.fail(f"still reading after {seconds:.0f} s: a special file blocks or never ends")
        try:
            return receive.recv()
        except EOFError:
            process.join()
            return "died", process.exitcode
    finally:
        process.kill()
        process.join()


def _attempt(call: Callable[[], Any]) -> str:
    """Return "ok" if call returns, else its StoreError's message (anything else propagates)."""
    try:
        call()
    except StoreError as exc:
        return f"StoreError: {exc}"
    return "ok"


@pytest.fixture
def built(tmp_path: Path) -> tuple[IndexStore, str, Path]:
    """An index of N rows built through ingestion (so with vectors.npy), its name and its corpus file."""
    path = _write(tmp_path / "c.parquet", [f"r{i}" for i in range(N)], _texts(N))
    store = IndexStore(tmp_path / "idx")
    name = _index(store, path, CountingVectorizer().vec)[0]
    return store, name, path


def _version(store: IndexStore, name: str) -> Path:
    return (store.root / name).resolve()


# ------------------------------------------------------------------ 3: special files never block or read forever

SPECIAL = ["fifo", "dev-zero"]


def _make_special(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("file", [MANIFEST, INDEX_FILE, ROWS_FILE, VECTORS_FILE])
def test_a_special_file_in_an_index_is_refused_without_blocking(
    built: tuple[IndexStore, str, Path], file: str, kind: str
) -> None:
    store, name, _ = built
    _make_special(_version(store, name) / file, kind)

    def reads() -> dict[str, str]:
        listed = dict(store.manifests())[name]
        return {
            "list": "ok" if isinstance(listed, Manifest) else f"StoreError: {listed}",
            "load": _attempt(lambda: store.load(name)),
            "verify": _attempt(lambda: store.verify(name)),
            "kept": "ok" if store.kept_vectors(name) is not None else "none",
        }

    status, got = _bounded(reads)
    assert status == "ok", got
    fails = {"list": file == MANIFEST, "load": file != VECTORS_FILE, "verify": True}
    for call, should_fail in fails.items():
        if should_fail:
            assert got[call].startswith("StoreError") and "not a regular file" in got[call], (call, got)
        else:
            assert got[call] == "ok", (call, got)
    assert got["kept"] == ("ok" if file == INDEX_FILE else "none"), got  # damaged kept files are not reused


@pytest.mark.parametrize("kind", SPECIAL)
def test_list_and_query_report_a_special_manifest_as_damaged(built: tuple[IndexStore, str, Path], kind: str) -> None:
    store, name, _ = built
    _make_special(_version(store, name) / MANIFEST, kind)

    def cli() -> list[tuple[int, str, str]]:
        results = [
            run("list", "--index-dir", store.root),
            run("query", "a red dress", "-c", "colour", "--index-dir", store.root),
        ]
        return [(r.exit_code, r.stdout, r.stderr) for r in results]

    status, got = _bounded(cli)
    assert status == "ok", got
    (list_code, list_out, _), (query_code, _, query_err) = got
    assert list_code == 0 and f"{name}: unreadable" in list_out and "not a regular file" in list_out
    assert query_code == 1 and "Traceback" not in query_err and len(query_err.strip().splitlines()) == 1
    assert "no index for condition 'colour'" in query_err and "1 index is damaged" in query_err
    assert "not a regular file" in query_err and "condsearch verify" in query_err


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_special_file_in_the_staging_folder_is_refused(built: tuple[IndexStore, str, Path], kind: str) -> None:
    """The resume record of an interrupted build is read too: a FIFO there must not hang `index`."""
    store, name, path = built
    staging = store.root / ".versions" / f"{name}.partial"
    staging.mkdir()
    (staging / "progress.json").touch()
    _make_special(staging / "progress.json", kind)

    def reindex() -> tuple[int, int]:
        return _index(store, path, CountingVectorizer().vec)[1:]

    status, got = _bounded(reindex)
    assert status == "ok" and got == (0, N), got  # the record is ignored, the kept vectors reused


def test_an_oversized_manifest_is_refused(built: tuple[IndexStore, str, Path]) -> None:
    store, name, _ = built
    with open(_version(store, name) / MANIFEST, "r+b") as fh:
        fh.truncate(2 << 20)  # sparse: 2 MiB that read as zeros
    with pytest.raises(StoreError, match="too large"):
        store.read_manifest(name)


# ------------------------------------------------------------------ 4: verify sees every damaged file, reuse none


def _corrupt(store: IndexStore, name: str, how: str) -> None:
    folder = _version(store, name)
    vectors, rows = folder / VECTORS_FILE, folder / ROWS_FILE
    if how == "vector values":  # same size, same modification time: only a checksum tells
        stat = vectors.stat()
        data = bytearray(vectors.read_bytes())
        data[-64:] = np.full(16, 0.5, dtype="<f4").tobytes()
        vectors.write_bytes(bytes(data))
        os.utime(vectors, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    elif how == "vector shape":
        n, d = np.load(vectors).shape
        np.save(vectors, np.zeros((n, d + 1), dtype=np.float32), allow_pickle=False)
    else:
        table = pq.read_table(rows)
        ids, texts = table.column("id").to_pylist(), table.column("text").to_pylist()
        if how == "row ids":  # two rows swap ids: each id now names the other's vector
            ids[0], ids[1] = ids[1], ids[0]
        else:  # a text rewritten with a matching text hash
            texts[0] = "a red dress " + texts[0]
        hashes = pa.array([text_hash(t) for t in texts], type=pa.binary(16))
        pq.write_table(pa.table({"id": ids, "text": texts, "text_hash": hashes}), rows)


CORRUPTIONS = ["vector values", "vector shape", "row ids", "row texts"]


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_verify_finds_every_damaged_file(built: tuple[IndexStore, str, Path], how: str) -> None:
    store, name, _ = built
    assert store.verify(name).n_vectors == N
    _corrupt(store, name, how)
    damaged = VECTORS_FILE if how.startswith("vector") else ROWS_FILE
    with pytest.raises(StoreError, match=f"{damaged}: .*damaged"):
        store.verify(name)
    result = run("verify", "--index-dir", store.root)
    assert_clean_error(result, match="1 of 1 index(es) failed verification")
    assert result.stdout.startswith("FAILED") and damaged in result.stdout


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_reindexing_a_damaged_index_encodes_every_row_and_equals_a_clean_build(
    built: tuple[IndexStore, str, Path], tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, name, path = built
    _corrupt(store, name, how)
    again = CountingVectorizer()
    with caplog.at_level(logging.WARNING):
        assert _index(store, path, again.vec)[1:] == (N, 0)
    notices = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(notices) == 1 and "not reusing the kept vectors" in notices[0] and "\n" not in notices[0], notices
    clean = IndexStore(tmp_path / "clean")
    _index(clean, path, CountingVectorizer().vec)
    _same_index(store, clean, name, again.vec)
    assert store.verify(name).n_vectors == N


def test_rows_of_another_size_fail_the_cheap_load(built: tuple[IndexStore, str, Path]) -> None:
    store, name, _ = built
    _corrupt(store, name, "row texts")
    with pytest.raises(StoreError, match=f"{ROWS_FILE}: .*damaged"):
        store.load(name)


def test_a_format_3_index_still_loads_and_verifies_but_its_vectors_are_not_trusted(
    built: tuple[IndexStore, str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    store, name, path = built
    manifest = _version(store, name) / MANIFEST
    raw = json.loads(manifest.read_text())
    del raw["files"]
    manifest.write_text(json.dumps({**raw, "format_version": 3}))
    assert store.load(name).ids == [f"r{i}" for i in range(N)] and store.verify(name).format_version == 3
    with caplog.at_level(logging.WARNING):
        assert _index(store, path, CountingVectorizer().vec)[1:] == (N, 0)  # no checksums: encoded again, once
    assert "no checksums" in caplog.text and "not reusing the kept vectors" in caplog.text
    assert _index(store, path, CountingVectorizer().vec)[1:] == (0, N)


# ------------------------------------------------------------------ 11: a failed publish keeps the resumable work


class Killed(BaseException):
    """An interruption that nothing in the build catches (as KeyboardInterrupt is)."""


def _enospc(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["write_index", "manifest", "publish"])
def test_a_full_disk_at_publish_keeps_the_staged_chunks_for_the_rerun(
    built: tuple[IndexStore, str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    store, name, _ = built
    before = store.load(name)
    ids, texts = [f"r{i}" for i in range(N)], _texts(N)
    v2 = _write(tmp_path / "v2.parquet", [*ids, "x1", "x2"], [*texts, "a red dress", "tennis on clay"])
    if where == "write_index":
        monkeypatch.setattr(faiss, "write_index", _enospc)
    elif where == "manifest":
        monkeypatch.setattr(condsearch.store.folder, "fsync_dir", _enospc)  # the version's last write
    else:
        monkeypatch.setattr(os, "symlink", _enospc)
    with pytest.raises(StoreError, match="No space left on device"):
        _index(store, v2, CountingVectorizer().vec)
    monkeypatch.undo()
    assert store.load(name).ids == before.ids  # the old index still answers
    rerun = CountingVectorizer()
    [report] = index_conditions(scan_corpus(v2), ["colour"], rerun.vec, store, corpus_name="c", chunk_rows=64)
    assert rerun.encoded == [] and report.n_resumed == N + 2 and report.n_encoded == 2
    assert not (store.root / ".versions" / f"{name}.partial").exists()
    clean = IndexStore(tmp_path / "clean")
    _index(clean, v2, CountingVectorizer().vec)
    _same_index(store, clean, name, rerun.vec)


def _sigkill(*args: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("how", ["exception in write_index", "SIGKILL in write_index", "SIGKILL in publish"])
def test_a_build_killed_at_publish_leaves_its_staging_whole(
    built: tuple[IndexStore, str, Path], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    store, name, path = built
    staging = store.root / ".versions" / f"{name}.partial"

    def killed(*args: object) -> None:
        raise Killed

    if how.startswith("exception"):
        monkeypatch.setattr(faiss, "write_index", killed)
        with pytest.raises(Killed):
            _index(store, path, CountingVectorizer().vec, full=True)
        monkeypatch.undo()
    else:

        def build() -> None:  # in a forked child, which the patch kills for real
            if how.endswith("write_index"):
                monkeypatch.setattr(faiss, "write_index", _sigkill)
            else:
                monkeypatch.setattr(os, "symlink", _sigkill)
            _index(store, path, CountingVectorizer().vec, full=True)

        assert _bounded(build) == ("died", -signal.SIGKILL)
    progress = json.loads((staging / "progress.json").read_text())
    assert progress["rows_done"] == N and (staging / VECTORS_FILE).is_file()
    assert np.load(staging / VECTORS_FILE).shape[0] == N and len(list((staging / "rows").glob("*.parquet"))) == 5
    assert store.verify(name).n_vectors == N  # the published index is untouched
    rerun = CountingVectorizer()
    _index(store, path, rerun.vec)
    assert rerun.encoded == []
    assert store.verify(name).n_vectors == N and not staging.exists()


def test_staged_files_shared_with_a_published_version_are_never_rewritten_in_place(
    built: tuple[IndexStore, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the publish, before staging is deleted: a rerun killed while merging rows harms nothing."""
    store, name, path = built
    monkeypatch.setattr(condsearch.store.folder.Draft, "discard_staging", lambda self: None)
    _index(store, path, CountingVectorizer().vec, full=True)
    monkeypatch.undo()

    def killed(*args: object, **kwargs: object) -> None:
        raise Killed

    monkeypatch.setattr(pq.ParquetWriter, "write_table", killed)
    with pytest.raises(Killed):
        _index(store, path, CountingVectorizer().vec)  # resumes from the staging that the published index shares
    monkeypatch.undo()
    assert store.verify(name).n_vectors == N


# ------------------------------------------------------------------ 12: a manifest field of the wrong type is one line

BAD_FIELDS: list[tuple[str, object]] = [
    ("condition", ["colour"]),
    ("condition", None),
    ("corpus_name", 5),
    ("corpus_path", None),
    ("corpus_checksum", 1.5),
    ("model_id", {}),
    ("model_revision", 1),
    ("encoder", None),
    ("encoder", [1, 2]),
    ("mode", 5),
    ("head", 5),
    ("head_checksum", None),
    ("dim", "x"),
    ("dim", 0),
    ("dim", True),
    ("dim", 8.0),
    ("metric", None),
    ("factory", 1),
    ("n_vectors", -1),
    ("n_vectors", "5"),
    ("n_skipped", -1),
    ("search_params", 5),
    ("fingerprint", 5),
    ("index_checksum", 5),
    ("index_size", -1),
    ("index_size", "big"),
    ("index_mtime_ns", "now"),
    ("index_probe", None),
    ("condsearch_version", 1),
    ("created_at", 0),
    ("files", 5),
    ("files", {ROWS_FILE: 5}),
    ("files", {ROWS_FILE: {"sha256": 5, "size": 1}}),
    ("files", {ROWS_FILE: {"sha256": "0" * 64, "size": -1}}),
    ("files", {ROWS_FILE: {"sha256": "0" * 64}}),
    ("files", {"../../etc/passwd": {"sha256": "0" * 64, "size": 1}}),
    ("spec", 5),
    ("score_background", 5),
    ("score_background", {"mean": 0.5}),
    ("score_background", {"sample_rows": 1, "pairs": 0, "seed": 0, "mean": 0.5, "std": 0.1, "quantiles": {}}),
    ("score_background", {"sample_rows": 2, "pairs": 1, "seed": 0, "mean": "0.5", "std": 0.1, "quantiles": {}}),
    ("score_background", {"sample_rows": 2, "pairs": 1, "seed": 0, "mean": 0.5, "std": -1.0, "quantiles": {}}),
    ("score_background", {"sample_rows": 2, "pairs": 1, "seed": 0, "mean": 0.5, "std": 0.1, "quantiles": [0.9]}),
    (
        "score_background",
        {"sample_rows": 2, "pairs": 1, "seed": 0, "mean": 0.5, "std": 0.1, "quantiles": {"0.9": None}},
    ),
]


def test_every_manifest_field_is_checked() -> None:
    checked = {f for f, _ in BAD_FIELDS} | {"format_version"}  # format_version: test_wrong_format_version_…
    assert checked == {f.name for f in fields(Manifest)}


def _edit_manifest(store: IndexStore, name: str, **changes: object) -> None:
    path = _version(store, name) / MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("field, value", BAD_FIELDS, ids=[f"{f}={v!r}" for f, v in BAD_FIELDS])
def test_a_manifest_field_of_the_wrong_type_is_a_corrupt_manifest(
    built: tuple[IndexStore, str, Path], field: str, value: object
) -> None:
    store, name, _ = built
    _edit_manifest(store, name, **{field: value})
    message = f"corrupt manifest (field {field!r} should be"
    for call in (store.read_manifest, store.load, store.verify):
        with pytest.raises(StoreError) as info:
            call(name)
        assert message in str(info.value) and "\n" not in str(info.value)
    assert message in str(dict(store.manifests())[name])


def test_the_cli_reports_a_bad_manifest_field_in_one_line(built: tuple[IndexStore, str, Path]) -> None:
    store, name, _ = built
    _edit_manifest(store, name, encoder=None)
    verify = run("verify", "--index-dir", store.root)
    assert_clean_error(verify, match="1 of 1 index(es) failed verification")
    assert "corrupt manifest (field 'encoder' should be" in verify.stdout
    listed = run("list", "--index-dir", store.root)
    assert listed.exit_code == 0 and f"{name}: unreadable" in listed.stdout and "field 'encoder'" in listed.stdout
    query = run("query", "a red dress", "-c", "colour", "--index-dir", store.root)
    message = assert_clean_error(query, match="no index for condition 'colour'")
    assert "1 index is damaged" in message and "field 'encoder'" in message and "condsearch verify" in message
    named = run("query", "a red dress", "-c", "colour", "--corpus", "c", "--index-dir", store.root)
    assert_clean_error(named, match="corrupt manifest (field 'encoder' should be")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def test_any_json_in_any_manifest_field_reads_as_a_manifest_or_one_store_error(
    built: tuple[IndexStore, str, Path],
) -> None:
    store, name, _ = built
    path = _version(store, name) / MANIFEST
    good = json.loads(path.read_text())
    names = sorted(good)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(field=st.sampled_from(names), value=_JSON)
    def check(field: str, value: object) -> None:
        path.write_text(json.dumps({**good, field: value}))
        try:
            m = store.read_manifest(name)
        except StoreError as exc:
            assert "\n" not in str(exc)
            return
        for f in fields(Manifest):
            got = getattr(m, f.name)
            assert type(got) is type(good.get(f.name, got)), (f.name, got)

    check()


# ------------------------------------------------------------------ 13a: a damaged index is named, not hidden


def test_find_names_the_damaged_indexes_when_nothing_matches(built: tuple[IndexStore, str, Path]) -> None:
    store, name, _ = built
    (_version(store, name) / MANIFEST).write_text("{garbage")
    with pytest.raises(StoreError) as info:
        store.find("colour")
    message = str(info.value)
    assert message.startswith("no index for condition 'colour'") and "indexed: none" in message
    assert f"1 index is damaged: {name}" in message and "corrupt manifest" in message
    assert "run condsearch verify" in message and "\n" not in message
