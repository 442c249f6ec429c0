"""Incremental, streamed and resumable indexing, each checked against a full rebuild (differential tests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from condsearch.corpus.reader import read_corpus, scan_corpus
from condsearch.errors import CorpusError
from condsearch.ingest.chunks import index_conditions
from condsearch.model.encoders.spec import Runtime
from condsearch.model.policy import vectorizer_for
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.search import query_index
from condsearch.store.folder import IndexStore
from condsearch.store.vectors import VectorFile
from tests.conftest import HashEncoder, WriteCorpus, assert_same_ranking
from tests.tolerance import assert_rows_close, score_tolerance, vector_tolerance

N = 300
QUERIES = ["a red dress", "tennis on clay", "a dog on the beach", "row 17 edited"]


def _texts(n: int) -> list[str]:
    return [f"row {i}: " + " ".join(f"w{(i * 7 + j) % 41}" for j in range(1 + i % 5)) for i in range(n)]


def _changed(ids: list[str], texts: list[str]) -> tuple[list[str], list[str]]:
    """About 5% of rows edited, deleted and added, and the order shuffled a little."""
    rows = dict(zip(ids, texts, strict=True))
    for i in (3, 17, 150, 299):
        rows[f"r{i}"] = texts[i] + " edited"
    for i in (0, 42, 200):
        del rows[f"r{i}"]
    for i in range(4):
        rows[f"new{i}"] = f"a new row {i} about a red dress"
    order = sorted(rows, key=lambda k: (hash_order(k), k))
    return order, [rows[k] for k in order]


def hash_order(key: str) -> int:
    return sum(key.encode()) % 7


class CountingVectorizer:
    """A hash-encoder vectorizer and the sentences it was asked to encode."""

    def __init__(self, revision: str = "1") -> None:
        self.encoder = HashEncoder(revision=revision)
        self.vec = Vectorizer(self.encoder, None, "none", "")

    @property
    def encoded(self) -> list[str]:
        return [s for _, s in self.encoder.seen if s is not None]


def _write(path: Path, ids: list[str], texts: list[str]) -> Path:
    pq.write_table(pa.table({"id": ids, "text": texts}), path, row_group_size=64)
    return path


def _index(store: IndexStore, path: Path, vec: Vectorizer, **build: object) -> tuple[str, int, int]:
    build.setdefault("chunk_rows", 64)
    [r] = index_conditions(scan_corpus(path), ["colour"], vec, store, corpus_name="c", **build)
    return r.name, r.n_encoded, r.n_reused


def _same_index(a: IndexStore, b: IndexStore, name: str, vec: Vectorizer) -> None:
    """Two stores hold the same index: the same rows, bit-identical vectors and the same results."""
    x, y = a.load(name), b.load(name)
    assert x.ids == y.ids and x.texts == y.texts and x.manifest.fingerprint == y.manifest.fingerprint
    assert (x.manifest.factory, x.manifest.search_params) == (y.manifest.factory, y.manifest.search_params)
    np.testing.assert_array_equal(np.load(a.root / name / "vectors.npy"), np.load(b.root / name / "vectors.npy"))
    queries = QUERIES + x.texts[:5]
    rx, ry = query_index(x, vec, queries, 10), query_index(y, vec, queries, 10)
    np.testing.assert_array_equal(rx.ids, ry.ids)
    np.testing.assert_array_equal(rx.scores, ry.scores)


@pytest.mark.parametrize("factory, params", [("Flat", ""), ("IVF8,Flat", "nprobe=3"), ("auto", "")])
def test_incremental_reindex_equals_full_rebuild(tmp_path: Path, factory: str, params: str) -> None:
    ids, texts = [f"r{i}" for i in range(N)], _texts(N)
    store = IndexStore(tmp_path / "inc")
    first = CountingVectorizer()
    _index(store, _write(tmp_path / "v1.parquet", ids, texts), first.vec, factory=factory, search_params=params)
    assert len(first.encoded) == N
    new_ids, new_texts = _changed(ids, texts)
    v2 = _write(tmp_path / "v2.parquet", new_ids, new_texts)
    again = CountingVectorizer()
    name, n_encoded, n_reused = _index(store, v2, again.vec, factory=factory, search_params=params)
    # only the edited and added rows went through the encoder; the deleted ones are gone
    assert sorted(again.encoded) == sorted(t for t in new_texts if "edited" in t or t.startswith("a new row"))
    assert (n_encoded, n_reused) == (8, len(new_ids) - 8)
    assert store.load(name).ids == new_ids
    full_store = IndexStore(tmp_path / "full")
    _index(full_store, v2, CountingVectorizer().vec, factory=factory, search_params=params, chunk_rows=1000)
    _same_index(store, full_store, name, again.vec)


def test_unchanged_corpus_encodes_nothing_and_full_encodes_all(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.parquet", [f"r{i}" for i in range(N)], _texts(N))
    store = IndexStore(tmp_path / "idx")
    _index(store, path, CountingVectorizer().vec)
    again = CountingVectorizer()
    # a new index type or search parameters need no encoding: the kept vectors are enough
    name, n_encoded, _ = _index(store, path, again.vec, factory="HNSW16", search_params="efSearch=32")
    assert n_encoded == 0 and again.encoded == [] and store.read_manifest(name).factory == "HNSW16"
    forced = CountingVectorizer()
    assert _index(store, path, forced.vec, full=True)[1:] == (N, 0) and len(forced.encoded) == N


def test_a_changed_fingerprint_encodes_every_row(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.parquet", [f"r{i}" for i in range(N)], _texts(N))
    store = IndexStore(tmp_path / "idx")
    _index(store, path, CountingVectorizer().vec)
    other = CountingVectorizer(revision="2")  # new weights: every kept vector is stale
    assert _index(store, path, other.vec)[1:] == (N, 0)


def test_an_index_without_kept_vectors_is_rebuilt_in_full(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.parquet", [f"r{i}" for i in range(N)], _texts(N))
    store = IndexStore(tmp_path / "idx")
    name = _index(store, path, CountingVectorizer().vec)[0]
    (store.root / name / "vectors.npy").unlink()  # as a format-2 index, or a damaged one
    assert _index(store, path, CountingVectorizer().vec)[1:] == (N, 0)


class Interrupted(Exception):
    pass


def test_interrupted_build_resumes_after_its_last_chunk_and_the_old_index_answers(tmp_path: Path) -> None:
    ids, texts = [f"r{i}" for i in range(N)], _texts(N)
    store = IndexStore(tmp_path / "idx")
    name = _index(store, _write(tmp_path / "v1.parquet", ids[:100], texts[:100]), CountingVectorizer().vec)[0]
    before = store.load(name)
    v2 = _write(tmp_path / "v2.parquet", ids, texts)

    failing = CountingVectorizer()
    real = failing.vec.encode
    calls = []

    def flaky(batch, condition, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append(len(batch))
        if len(calls) == 2:  # chunk 0 is all kept rows, chunk 1 encodes 28 new ones; chunk 2 fails
            raise Interrupted
        return real(batch, condition, **kw)

    object.__setattr__(failing.vec, "encode", flaky)
    with pytest.raises(Interrupted):
        _index(store, v2, failing.vec)
    # the old index still answers, whole
    still = store.load(name)
    assert still.ids == before.ids and still.manifest.created_at == before.manifest.created_at
    progress = json.loads((store.root / ".versions" / f"{name}.partial" / "progress.json").read_text())
    assert progress["chunks_done"] == 2 and progress["rows_done"] == 128

    resumed = CountingVectorizer()
    [r] = index_conditions(scan_corpus(v2), ["colour"], resumed.vec, store, corpus_name="c", chunk_rows=64)
    assert r.n_resumed == 128 and len(resumed.encoded) == N - 128
    assert not (store.root / ".versions" / f"{name}.partial").exists()
    full_store = IndexStore(tmp_path / "full")
    _index(full_store, v2, CountingVectorizer().vec)
    _same_index(store, full_store, name, resumed.vec)


def test_a_resume_record_of_another_corpus_is_ignored(tmp_path: Path) -> None:
    ids, texts = [f"r{i}" for i in range(N)], _texts(N)
    store = IndexStore(tmp_path / "idx")
    failing = CountingVectorizer()

    def fail(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        raise Interrupted

    object.__setattr__(failing.vec, "encode", fail)
    with pytest.raises(Interrupted):
        _index(store, _write(tmp_path / "a.parquet", ids, texts), failing.vec)
    other = CountingVectorizer()
    _index(store, _write(tmp_path / "b.parquet", ids[:50], texts[:50]), other.vec)
    assert len(other.encoded) == 50


def test_scan_corpus_streams_what_read_corpus_reads(write_corpus: WriteCorpus) -> None:
    texts = [f"t{i}" if i % 9 else "  " for i in range(20_000)]
    path = write_corpus({"id": [f"k{i}" for i in range(20_000)], "text": texts})
    whole, streamed = read_corpus(path), scan_corpus(path)
    assert (len(streamed), streamed.n_skipped, streamed.checksum) == (len(whole), whole.n_skipped, whole.checksum)
    batches = list(streamed.batches(5000))
    assert [len(b[0]) for b in batches[:-1]] == [5000] * (len(batches) - 1)
    assert [i for b in batches for i in b[0]] == whole.ids and [t for b in batches for t in b[1]] == whole.texts
    # without an id column, ids are row numbers of the file, as read_corpus gives
    plain = write_corpus({"text": texts}, name="plain.parquet")
    assert [i for b in scan_corpus(plain).batches(777) for i in b[0]] == read_corpus(plain).ids


@pytest.mark.parametrize(
    "columns, match",
    [
        ({"id": [1, 1], "text": ["a", "b"]}, "duplicate id 1"),
        ({"id": [1, None], "text": ["a", "b"]}, "null ids"),
        ({"text": [1, 2]}, "does not hold strings"),
        ({"body": ["a"]}, "no column 'text'"),
        ({"text": ["", None]}, "no non-empty texts"),
    ],
)
def test_scan_corpus_refuses_what_read_corpus_refuses(write_corpus: WriteCorpus, columns: dict, match: str) -> None:
    path = write_corpus(columns)
    for reader in (read_corpus, scan_corpus):
        with pytest.raises(CorpusError, match=match):
            reader(path)


def test_vector_file_reads_rows_in_any_order(tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
    np.save(tmp_path / "v.npy", x, allow_pickle=False)
    f = VectorFile(tmp_path / "v.npy")
    rows = np.array([499, 3, 4, 5, 0, 250, 251])
    np.testing.assert_array_equal(f.take(rows), x[rows])
    np.testing.assert_array_equal(f[100:140], x[100:140])
    f.close()


@pytest.mark.numerics
@pytest.mark.parametrize("mode", ["case", "csr"])
def test_cli_reindex_encodes_only_changes_in_both_modes(tiny_bert_dir: Path, tmp_path: Path, mode: str) -> None:
    """A real (tiny) transformer through the CLI: same rows, vectors and top-10 as a --full rebuild."""
    from click.testing import CliRunner

    from condsearch.cli import main

    words = "girl dress red blue tennis court dog beach man park golf ball".split()
    texts = [" ".join(words[(i * k) % len(words)] for k in range(1, 2 + i % 6)) + f" {i}" for i in range(120)]
    ids = [f"r{i}" for i in range(120)]
    new_ids, new_texts = ids[2:] + ["x1", "x2"], texts[2:] + ["a girl in a red dress", "a dog on the court"]
    new_texts[10] += " golf"
    extra = ["--mode", "csr", "--router", "none"] if mode == "csr" else ["--head", "none"]

    def index(path: Path, where: Path, *flags: str) -> dict:
        args = ["index", str(path), "-c", "colour", "--model", str(tiny_bert_dir), "--name", "c", "--json"]
        result = CliRunner().invoke(main, [*args, *extra, "--index-dir", str(where), *flags])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    index(_write(tmp_path / "v1.parquet", ids, texts), tmp_path / "inc")
    v2 = _write(tmp_path / "v2.parquet", new_ids, new_texts)
    row = index(v2, tmp_path / "inc")
    assert (row["encoded"], row["reused"]) == (3, len(new_ids) - 3)
    assert index(v2, tmp_path / "full", "--full")["encoded"] == len(new_ids)
    inc, full = IndexStore(tmp_path / "inc"), IndexStore(tmp_path / "full")
    name = row["index"]
    a, b = inc.load(name), full.load(name)
    assert a.ids == b.ids == new_ids and a.manifest.fingerprint == b.manifest.fingerprint
    va, vb = np.load(inc.root / name / "vectors.npy"), np.load(full.root / name / "vectors.npy")
    # rows encoded in other batches: padding differs, and so the rounding, not the values
    tolerance = vector_tolerance(vectorizer_for(b.manifest, runtime=Runtime(device="cpu")), new_texts, "colour")
    assert_rows_close(va, vb, tolerance)
    # a row's score moves by at most the length of its error, and FAISS rounds its sums
    by_row = tolerance * np.sqrt(va.shape[1]) + score_tolerance(va.shape[1])
    assert_same_ranking(a.index.search(va[:20], 10), b.index.search(va[:20], 10), lambda i: by_row[i])


@pytest.mark.parametrize("factory", ["IDMap2,Flat", "NSG4", "HNSW300"])  # the --ray path calls it directly
def test_plan_index_checks_the_factory_before_faiss_sees_it(factory: str) -> None:
    from condsearch.errors import CondsearchError
    from condsearch.ingest.chunks import plan_index

    with pytest.raises(CondsearchError, match="index factory"):
        plan_index(300, 8, factory, "", "4G")
