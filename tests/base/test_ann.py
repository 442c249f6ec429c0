"""Approximate indexes: the auto choice, search parameters, and recall through the store against exact search."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np
import pytest

from condsearch.base.ann import (
    IndexConfig,
    choose_index,
    flat_bytes,
    parse_memory,
    parse_search_params,
    sample_rows,
    train_rows,
)
from condsearch.base.faiss_indexes import build_index, exact_search, normalize
from condsearch.corpus.reader import read_corpus
from condsearch.errors import CondsearchError
from condsearch.ingest.chunks import index_corpus
from condsearch.model.encoders import Encoder
from condsearch.model.encoders.base import Pair
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.search import query_index
from condsearch.store.folder import IndexStore, StoreError

_CENTERS = np.random.default_rng(0).standard_normal((48, 24))


class ClusterEncoder(Encoder):
    """Each text maps to a sha256-seeded point near one of 48 centres: data with structure for IVF to find."""

    model_id, revision, dim = "test/clusters", "1", 24

    def encode_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        out = []
        for _, sentence in pairs:
            seed = int.from_bytes(hashlib.sha256((sentence or "").encode()).digest()[:8], "little")
            rng = np.random.default_rng(seed)
            out.append(_CENTERS[rng.integers(len(_CENTERS))] + 0.6 * rng.standard_normal(self.dim))
        return np.asarray(out, dtype=np.float32)

    def encode(self, texts, condition, *, batch_size=64, progress=False):  # noqa: ANN001, ANN201
        # plain f(c; I(s)): the CASE difference would subtract one constant vector from every row
        return self.encode_pairs([(condition, t) for t in texts], batch_size=batch_size)


def _recall(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.mean([len(set(g) & set(r)) / ref.shape[1] for g, r in zip(got, ref, strict=True)]))


@pytest.fixture(scope="module")
def clustered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A 4,000-row corpus and 100 held-out queries (texts not in it) from the same distribution."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path_factory.mktemp("clustered") / "corpus.parquet"
    pq.write_table(pa.table({"id": list(range(4000)), "text": [f"row {i}" for i in range(4000)]}), path)
    return path, [f"held-out query {i}" for i in range(100)]


@pytest.mark.parametrize(
    "factory, params, floor",
    [("IVF32,Flat", "nprobe=8", 0.95), ("HNSW16", "efSearch=64", 0.95), ("IVF32,PQ8x4", "nprobe=8", 0.4)],
)
def test_recall_through_the_store_against_exact_search(
    clustered: tuple[Path, list[str]], tmp_path: Path, factory: str, params: str, floor: float
) -> None:
    corpus_path, queries = clustered
    vec = Vectorizer(ClusterEncoder(), None, "none", "")
    store = IndexStore(tmp_path)
    corpus = read_corpus(corpus_path)
    [name] = index_corpus(corpus, ["c"], vec, store, corpus_name="x", factory=factory, search_params=params)
    stored = store.load(name)
    assert (stored.manifest.factory, stored.manifest.search_params) == (factory, params)
    # set on load, which query and serve both go through
    inner = faiss.downcast_index(stored.index)
    expected = int(params.split("=")[1])
    assert (inner.hnsw.efSearch if "HNSW" in factory else faiss.extract_index_ivf(stored.index).nprobe) == expected
    exact = exact_search(np.load(tmp_path / name / "vectors.npy", allow_pickle=False), vec.encode(queries, "c"), 10)
    tuned = _recall(query_index(stored, vec, queries, 10).ids, exact.ids)
    assert tuned >= floor
    if factory.endswith(",Flat"):
        # the recorded nprobe is what query uses: at FAISS's default of 1 the same index finds less
        [again] = index_corpus(corpus, ["c"], vec, store, corpus_name="x", factory=factory)
        assert _recall(query_index(store.load(again), vec, queries, 10).ids, exact.ids) < tuned


def test_search_params_that_do_not_apply_are_refused(corpus_file: Path, tmp_path: Path) -> None:
    vec = Vectorizer(ClusterEncoder(), None, "none", "")
    with pytest.raises(CondsearchError, match="does not apply"):
        index_corpus(
            read_corpus(corpus_file), ["c"], vec, IndexStore(tmp_path), corpus_name="x", search_params="nprobe=4"
        )
    with pytest.raises(CondsearchError, match="name=value"):
        index_corpus(read_corpus(corpus_file), ["c"], vec, IndexStore(tmp_path), corpus_name="x", search_params="k=4")
    assert IndexStore(tmp_path).names() == []


def test_a_manifest_with_bad_search_params_is_store_error(corpus_file: Path, tmp_path: Path) -> None:
    import json

    store = IndexStore(tmp_path)
    vec = Vectorizer(ClusterEncoder(), None, "none", "")
    [name] = index_corpus(read_corpus(corpus_file), ["c"], vec, store, corpus_name="x")
    path = tmp_path / name / "manifest.json"
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "search_params": "efSearch=8"}))
    with pytest.raises(StoreError, match="does not apply"):
        store.load(name)


def test_auto_chooses_by_size_and_memory() -> None:
    cfg = IndexConfig()
    assert choose_index(5_000, 256, parse_memory("4G")).factory == "Flat"
    hnsw = choose_index(500_000, 256, parse_memory("4G"))
    assert hnsw.factory == f"HNSW{cfg.hnsw_m}" and hnsw.search_params == f"efSearch={cfg.hnsw_ef_search}"
    ivf = choose_index(10_000_000, 384, parse_memory("4G"))
    assert ivf.factory.startswith("IVF") and ",PQ" in ivf.factory and ivf.search_params.startswith("nprobe=")
    nlist = int(ivf.factory[3 : ivf.factory.index(",")])
    assert nlist & (nlist - 1) == 0 and 1024 <= nlist <= 16384
    # a tight budget pushes even a small corpus off exact search
    assert choose_index(50_000, 256, flat_bytes(50_000, 256) - 1).factory.startswith("IVF")
    with pytest.raises(ValueError, match="max-index-memory"):
        choose_index(10_000_000, 384, parse_memory("10M"))


def test_auto_through_the_pipeline_records_its_choice(corpus_file: Path, tmp_path: Path) -> None:
    store = IndexStore(tmp_path)
    vec = Vectorizer(ClusterEncoder(), None, "none", "")
    [name] = index_corpus(read_corpus(corpus_file), ["c"], vec, store, corpus_name="x", factory="auto")
    assert store.read_manifest(name).factory == "Flat"


@pytest.mark.parametrize("text, expected", [("4G", 4 << 30), ("512M", 512 << 20), ("1.5g", 3 << 29), ("100", 100)])
def test_parse_memory(text: str, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "4X", "-1G", "0", "lots"])
def test_parse_memory_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="memory size"):
        parse_memory(text)


def test_parse_search_params() -> None:
    assert parse_search_params("nprobe=32, efSearch=64") == {"nprobe": 32, "efSearch": 64}
    assert parse_search_params("") == {}
    for bad in ("nprobe", "nprobe=x", "nprobe=0", "nprobe=1.5", "depth=3"):
        with pytest.raises(ValueError, match="search parameter"):
            parse_search_params(bad)


def test_training_uses_a_seeded_sample() -> None:
    assert train_rows(1_000_000, "IVF4096,PQ32") == 64 * 4096
    assert train_rows(1_000, "IVF4096,PQ32") == 1_000 and train_rows(10**6, "HNSW32") == IndexConfig().train_min
    a, b = sample_rows(10_000, 500), sample_rows(10_000, 500)
    assert np.array_equal(a, b) and len(set(a.tolist())) == 500 and (np.diff(a) > 0).all()


def test_build_index_from_a_file_of_vectors_equals_from_memory(tmp_path: Path) -> None:
    from condsearch.store.vectors import VectorFile

    x = normalize(np.random.default_rng(3).standard_normal((3000, 16)).astype(np.float32))
    np.save(tmp_path / "v.npy", x, allow_pickle=False)
    queries = normalize(np.random.default_rng(4).standard_normal((20, 16)).astype(np.float32))
    mem = build_index(x, "IVF16,Flat", search_params="nprobe=4", train_size=1000, chunk_rows=700)
    disk = build_index(VectorFile(tmp_path / "v.npy"), "IVF16,Flat", search_params="nprobe=4", train_size=1000)
    np.testing.assert_array_equal(mem.search(queries, 10)[1], disk.search(queries, 10)[1])


# ---------------------------------------------------------------- k near N, and factories or parameters that crash


def _hash_rows(tmp_path: Path, n: int = 308) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(n)], "text": [f"row number {i}" for i in range(n)]}), path)
    return path


@pytest.mark.parametrize(
    "factory, params",
    [
        ("HNSW32", ""),
        ("HNSW32", "efSearch=16"),
        ("HNSW16,SQ8", ""),
        ("IVF16,Flat", "nprobe=1"),
        ("IVF16,Flat", "nprobe=2,max_codes=5"),
        ("IVF16,PQ4x4", "nprobe=1"),  # 8-bit PQ trains for seconds on a busy CPU: see test_8_bit_pq_forms_are_supported
        ("IVF16,SQ8", ""),
    ],
)
def test_k_of_every_row_returns_every_row_from_approximate_indexes(tmp_path: Path, factory: str, params: str) -> None:
    # HNSW32 over 308 rows gave 192-232 of them for k=308, FAISS filling the rest with id -1; an IVF
    # index probing one list of ~20 rows gave ~20 for k=150
    from tests.conftest import HashEncoder

    vec = Vectorizer(HashEncoder(), None, "none", "")
    store = IndexStore(tmp_path / "i")
    [name] = index_corpus(
        read_corpus(_hash_rows(tmp_path)), ["c"], vec, store, corpus_name="x", factory=factory, search_params=params
    )
    stored = store.load(name)
    queries = ["row number 3", "something else", "row number 300"]
    for k in (308, 150, 10):
        found = query_index(stored, vec, queries, k)
        assert found.ids.shape == (3, k) and (found.ids >= 0).all(), (k, (found.ids >= 0).sum(axis=1))
        assert all(len(set(row)) == k for row in found.ids.tolist())
        assert (np.diff(found.scores, axis=1) <= 1e-5).all()  # still best first
    assert {int(i) for i in query_index(stored, vec, queries, 308).ids[0]} == set(range(308))


def test_search_caps_k_at_the_index_size_and_never_pads(tmp_path: Path) -> None:
    from condsearch.base.faiss_indexes import search

    x = normalize(np.random.default_rng(5).standard_normal((40, 16)).astype(np.float32))
    for factory in ("Flat", "HNSW8", "IVF4,Flat"):
        found = search(build_index(x, factory), x[:2], 100)
        assert found.ids.shape == (2, 40) and (found.ids >= 0).all()
        assert found.n_found.tolist() == [40, 40]


@pytest.mark.parametrize(
    "factory",
    [
        "HNSW0",
        "HNSW1",
        "HNSW300",
        "HNSW99999999999999999999",
        "IDMap2,Flat",
        "IDMap,Flat",
        "NSG4",
        "NSG32",
        "IVF0,Flat",
        "IVF99999999999999999999,Flat",
        "PQ0",
        "PQ4x0",
        "PQ4x17",
        "PQ5",
        "PQ32",
        "OPQ4,IVF16,PQ4",
        "LSH",
        "Flat,RFlat",
        "IVF16",
        "IVF16,",
        " Flat",
        "SQ3",
        "",
    ],
)
def test_factories_outside_the_supported_forms_are_refused_before_faiss_sees_them(factory: str) -> None:
    from condsearch.base.ann import check_factory

    with pytest.raises(ValueError, match="factory"):
        check_factory(factory, 308, 16)
    with pytest.raises(ValueError, match="factory"):
        build_index(normalize(np.random.default_rng(0).standard_normal((308, 16)).astype(np.float32)), factory)


@pytest.mark.parametrize(
    "factory",
    ["Flat", "HNSW2", "HNSW256", "HNSW32,Flat", "HNSW16,SQ8", "HNSW16,PQ4x4", "IVF1,Flat", "IVF16,SQ8", "IVF16,PQ4x4",
     "IVF8,PQ8x4", "PQ4x4", "PQ16x1", "SQ4", "SQ6", "SQ8", "SQfp16"],
)  # fmt: skip
def test_every_supported_factory_builds_and_answers_every_row(factory: str) -> None:
    from condsearch.base.ann import check_factory
    from condsearch.base.faiss_indexes import search

    x = normalize(np.random.default_rng(1).standard_normal((308, 16)).astype(np.float32))
    check_factory(factory, 308, 16)
    found = search(build_index(x, factory), x[:3], 308)
    assert found.ids.shape == (3, 308) and all(set(row) == set(range(308)) for row in found.ids.tolist())


def test_8_bit_pq_forms_are_supported() -> None:
    from condsearch.base.ann import check_factory

    for factory in ("PQ4", "IVF8,PQ8", "HNSW16,PQ4", "IVF1024,PQ32"):
        assert check_factory(factory, 10**6, 256).pq_bits == 8


@pytest.mark.parametrize(
    "factory, n, match", [("IVF64,Flat", 10, "too few"), ("PQ4", 100, "too few"), ("PQ4x4", 10, "too few")]
)
def test_factories_too_big_for_the_corpus_are_refused_up_front(factory: str, n: int, match: str) -> None:
    from condsearch.base.ann import check_factory

    with pytest.raises(ValueError, match=match):
        check_factory(factory, n, 16)


def test_abort_prone_factories_are_one_line_errors_in_a_fresh_process(tmp_path: Path) -> None:
    # HNSW0 ended the process in a FAISS assertion (SIGABRT), HNSW1 in a segfault, PQ4x0 in SIGFPE:
    # run where such an end cannot take pytest with it
    import json
    import subprocess
    import sys

    corpus = _hash_rows(tmp_path, 40)
    script = f"""
import json, sys
import numpy as np
from click.testing import CliRunner
from condsearch.cli import main
from condsearch.corpus.reader import read_corpus
from condsearch.errors import CondsearchError
from condsearch.base.faiss_indexes import build_index
from condsearch.ingest.chunks import index_corpus
from condsearch.model.vectorizer import Vectorizer
from condsearch.store.folder import IndexStore
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from tests.conftest import HashEncoder

out = {{}}
for factory in ("HNSW0", "HNSW1", "PQ4x0"):
    r = CliRunner().invoke(main, ["index", {str(corpus)!r}, "-c", "c", "--model", "nowhere/none",
                                  "--index-factory", factory, "--index-dir", {str(tmp_path / "cli")!r}])
    try:
        index_corpus(read_corpus({str(corpus)!r}), ["c"], Vectorizer(HashEncoder(), None, "none", ""),
                     IndexStore({str(tmp_path / "api")!r}), corpus_name="x", factory=factory)
        api = "built"
    except CondsearchError as exc:
        api = str(exc)
    out[factory] = [r.exit_code, r.output, repr(r.exception), api]
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    for factory, (code, output, exception, api) in json.loads(done.stdout.splitlines()[-1]).items():
        assert code == 1 and exception.startswith("SystemExit"), (factory, output, exception)
        [line] = [x for x in output.splitlines() if x.startswith("Error:")]
        assert factory in line and "factory" in line
        assert factory in api and "factory" in api


@pytest.mark.parametrize(
    "factory, params, match",
    [
        ("HNSW16", "efSearch=99999999999999999999", "efSearch"),
        ("HNSW16", "efSearch=1000000000", "efSearch"),
        ("HNSW16", "efSearch=65537", "efSearch"),
        ("IVF16,Flat", "nprobe=17", "nprobe"),
        ("IVF16,Flat", "max_codes=99999999999999999999", "max_codes"),
        ("IVF16,PQ4x4", "ht=3", "search parameter"),
        ("PQ4x4", "ht=3", "search parameter"),
        ("HNSW16", "efSearch=1e3", "whole number"),
        ("HNSW16", "efSearch=-1", "whole number"),
    ],
)
def test_search_params_out_of_range_are_refused(tmp_path: Path, factory: str, params: str, match: str) -> None:
    from tests.conftest import HashEncoder

    vec = Vectorizer(HashEncoder(), None, "none", "")
    with pytest.raises(CondsearchError, match=match):
        index_corpus(
            read_corpus(_hash_rows(tmp_path)),
            ["c"],
            vec,
            IndexStore(tmp_path / "i"),
            corpus_name="x",
            factory=factory,
            search_params=params,
        )
    assert IndexStore(tmp_path / "i").names() == []


def test_search_params_at_their_limits_are_accepted(tmp_path: Path) -> None:
    from condsearch.base.ann import apply_search_params

    x = normalize(np.random.default_rng(2).standard_normal((308, 16)).astype(np.float32))
    hnsw, ivf = build_index(x, "HNSW16"), build_index(x, "IVF16,Flat")
    apply_search_params(hnsw, "efSearch=65536")
    apply_search_params(ivf, "nprobe=16,max_codes=1000000000")
    assert faiss.downcast_index(hnsw).hnsw.efSearch == 65536 and faiss.extract_index_ivf(ivf).nprobe == 16


@pytest.mark.parametrize("params", ["efSearch=1000000000", "efSearch=99999999999999999999", "ht=2", 5, None])
def test_a_manifest_with_out_of_range_search_params_is_store_error(
    corpus_file: Path, tmp_path: Path, params: object
) -> None:
    import json

    store = IndexStore(tmp_path)
    vec = Vectorizer(ClusterEncoder(), None, "none", "")
    [name] = index_corpus(read_corpus(corpus_file), ["c"], vec, store, corpus_name="x", factory="HNSW8")
    path = tmp_path / name / "manifest.json"
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "search_params": params}))
    with pytest.raises(StoreError):
        store.load(name)
