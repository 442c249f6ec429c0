"""What a stranger's requests make is bounded (issue 58, items 1 and 2).

Item 1: a served router query writes neither its texts' sentence states nor a new condition's code to the
cache; codes are kept in memory up to a byte bound, and a miss reads one shard. Item 2: spellings of one
condition name one index (old indexes under another spelling are still found and rewritten in place);
invisible-only conditions are refused; a server caps the indexes it builds on demand, per client and in
all, builds for keyless clients only where allowed, keeps a bounded number of indexes loaded, lists at
most a few conditions of the asked corpus in a refusal and does not list the store again for every
unknown condition. The tiny BERT (uncased, as MiniLM) stands in with an untrained router.
"""

from __future__ import annotations

import os
import threading
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

import condsearch
from condsearch.base.output_cache import EmbeddingCache
from condsearch.corpus.reader import read_corpus
from condsearch.errors import CondsearchError, UnknownCondition
from condsearch.ingest.chunks import index_corpus
from condsearch.query.on_demand import OnDemand
from condsearch.query.resident import Resident
from condsearch.serve.app import create_app
from condsearch.serve.builds import Builds, OnDemandFull, TooManyBuilds
from condsearch.serve.config import ServeConfig
from condsearch.store.conditions import MAX_CONDITION_CHARS, normalize_condition
from condsearch.store.folder import IndexStore
from condsearch.store.listing import MAX_LISTED, find_index
from tests.csr_corpus import write_csr_corpus
from tests.query.test_on_demand import COLOUR, QUERIES, SPORT, index, snapshot
from tests.query.test_search import _manifest
from tests.serve.test_serve_builds import one_line_error, serve
from tests.serve.test_serve_embeddings import hash_vectorizer

#: spellings of COLOUR that a reader and an uncased model cannot tell apart
SPELLINGS = [
    "Color of the Dress",
    "color  of   the dress",
    "color\u00a0of the dress",  # NBSP
    "colo\u200br of the dress",  # zero-width space
    "\ufeffcolor of the dress",  # BOM
    "color of the dress\u2060",  # word joiner
]


@pytest.fixture
def folder(tmp_path: Path, tiny_bert_dir: Path) -> Path:
    out = tmp_path / "idx"
    index(write_csr_corpus(tmp_path / "c.parquet"), out, tiny_bert_dir, COLOUR)
    return out


@pytest.fixture
def http(folder: Path) -> Iterator[httpx.Client]:
    with serve(folder) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def cache_files() -> set[str]:
    """Return every file under the cache folder (the conftest's, per test), relative to it."""
    root = condsearch.base.output_cache.default_cache_dir()
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


# ---------------------------------------------------------------- item 1: nothing a request sends stays on disk


def test_served_queries_and_embeddings_write_nothing_to_the_cache(http: httpx.Client) -> None:
    assert http.post("/query", json={"queries": QUERIES, "condition": COLOUR}).status_code == 200  # warm: exports
    before = cache_files()
    texts = [f"a stranger's text number {i} about a red dress" for i in range(20)]
    answered = http.post("/query", json={"queries": texts, "condition": COLOUR, "k": 3})
    assert answered.status_code == 200, answered.text
    embedded = http.post("/v1/embeddings", json={"input": texts, "condition": "the weather outside"})
    assert embedded.status_code == 200, embedded.text
    again = http.post("/v1/embeddings", json={"input": texts, "condition": "the weather outside"})
    assert again.json()["data"] == embedded.json()["data"]  # the code kept in memory gives the same vectors
    assert cache_files() == before  # no sentence states, no condition code (issue 58: 24 MB a request)


def test_the_query_cache_keeps_at_most_its_bytes_and_reads_one_shard_a_key(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path, max_bytes=3 * 4 * 8)  # three vectors of 8 float32
    keys = [f"{i:064x}" for i in range(10)]
    for i, key in enumerate(keys):
        cache.put_many([key], np.full((1, 8), i, dtype=np.float32))
        cache.keep(f"{i + 100:064x}", np.zeros(8, dtype=np.float32))  # held only: never written
    assert cache.nbytes <= 3 * 4 * 8
    assert len(list(tmp_path.glob("shard-*.npz"))) == 10
    found = cache.get(keys[0])  # dropped from memory long ago: read again from its own shard
    assert found is not None and found.tolist() == [0.0] * 8
    assert EmbeddingCache(tmp_path).get(f"{100:064x}") is None  # what was only kept is not on disk


def test_a_served_router_keeps_new_codes_in_memory_within_its_bound(folder: Path, tiny_bert_dir: Path) -> None:
    store = IndexStore(folder)
    resident = Resident(store, device="cpu")
    entry = resident.get(COLOUR)
    encoder = resident.vectorizer(entry.model_key).encoder
    encoder._queries.max_bytes = 3 * encoder._queries.get(encoder.identity.condition_key(COLOUR)).nbytes
    before = cache_files()
    for i in range(8):
        resident.vectorizer(entry.model_key).encode(["a girl"], f"new condition {i}")
    assert encoder._queries.nbytes <= encoder._queries.max_bytes
    assert cache_files() == before


# ---------------------------------------------------------------- item 2: one condition, one index


def test_normal_form() -> None:
    nfd = unicodedata.normalize("NFD", "couleur de la robe à pois")
    assert normalize_condition(nfd) == "couleur de la robe à pois"  # composed
    assert {normalize_condition(s, lowercase=True) for s in SPELLINGS} == {COLOUR}
    assert normalize_condition("Color of the Dress") == "Color of the Dress"  # a cased model keeps the case
    assert normalize_condition("\u200b\ufeff") == ""


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_spellings_of_a_condition_find_its_index_and_build_none(
    http: httpx.Client, folder: Path, spelling: str
) -> None:
    before = snapshot(folder)
    answered = http.post("/query", json={"queries": QUERIES, "condition": spelling, "k": 3})
    assert answered.status_code == 200, answered.text
    assert answered.json()["results"][0]["condition"] == COLOUR
    assert snapshot(folder) == before
    assert condsearch.open(folder).search("a girl", condition=spelling, k=1)


def test_a_new_condition_is_built_under_its_normal_form(http: httpx.Client, folder: Path) -> None:
    assert http.post("/query", json={"query": "a girl", "condition": "The  Sport\u00a0Being Played"}).status_code == 200
    assert http.post("/query", json={"query": "a girl", "condition": SPORT}).status_code == 200
    conditions = sorted(i["condition"] for i in http.get("/indexes").json()["indexes"])
    assert conditions == [COLOUR, SPORT]  # one index for both spellings


def test_an_index_written_under_another_spelling_is_found_and_rewritten_in_place(
    tmp_path: Path, corpus_file: Path
) -> None:
    scratch, store, vec = IndexStore(tmp_path / "scratch"), IndexStore(tmp_path / "idx"), hash_vectorizer()
    [built] = index_corpus(read_corpus(corpus_file), [COLOUR], vec, scratch, corpus_name="c")
    # as an older condsearch wrote it: named after the spelling it was given, which it recorded as given
    loaded = scratch.load(built)
    older = store.write(
        replace(loaded.manifest, condition="color  of the  dress"), loaded.index, loaded.ids, loaded.texts
    )
    assert older != built
    assert store.find(COLOUR) == older and store.find(COLOUR, "c") == older
    assert index_corpus(read_corpus(corpus_file), [COLOUR], vec, store, corpus_name="c") == [older]
    assert store.names() == [older] and store.read_manifest(older).condition == COLOUR


@pytest.mark.parametrize("condition", ["\u200b", "\ufeff\u200b", "\u2060 \u200d"])
def test_an_invisible_condition_is_refused_everywhere(http: httpx.Client, folder: Path, condition: str) -> None:
    before = snapshot(folder)
    assert "only invisible characters" in one_line_error(
        http.post("/query", json={"query": "q", "condition": condition}), 422
    )
    embedded = http.post("/v1/embeddings", json={"input": "q", "condition": condition})
    assert embedded.status_code == 422 and "only invisible" in embedded.json()["error"]["message"]
    with pytest.raises(CondsearchError, match="only invisible characters|empty"):
        condsearch.open(folder).search("q", condition=condition)
    assert snapshot(folder) == before


def test_every_endpoint_has_one_condition_limit(http: httpx.Client) -> None:
    long = "c" * (MAX_CONDITION_CHARS + 1)
    assert f"at most {MAX_CONDITION_CHARS}" in one_line_error(
        http.post("/query", json={"query": "q", "condition": long}), 422
    )
    embedded = http.post("/v1/embeddings", json={"input": "q", "condition": long})
    assert embedded.status_code == 422 and f"at most {MAX_CONDITION_CHARS}" in embedded.json()["error"]["message"]


# ---------------------------------------------------------------- item 2: the server's caps


def test_the_indexes_built_on_demand_are_capped(folder: Path) -> None:
    with serve(folder, max_on_demand_indexes=2) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        for n in range(2):
            assert http.post("/query", json={"query": "q", "condition": f"new condition {n}"}).status_code == 200
        before = snapshot(folder)
        error = one_line_error(http.post("/query", json={"query": "q", "condition": "one more"}), 507)
        assert "2 indexes" in error and "condsearch index" in error
        assert snapshot(folder) == before
        assert http.post("/query", json={"query": "q", "condition": "new condition 1"}).status_code == 200
    with serve(folder, max_on_demand_indexes=2) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.post("/query", json={"query": "q", "condition": "after a restart"}).status_code == 507
    with serve(folder, max_on_demand_bytes="1k") as server, httpx.Client(base_url=server.url, timeout=60) as http:
        assert "MiB" in one_line_error(http.post("/query", json={"query": "q", "condition": "bytes"}), 507)


def test_a_keyless_server_beyond_loopback_builds_only_when_open(folder: Path) -> None:
    assert ServeConfig(host="0.0.0.0").builds_open is False
    assert ServeConfig(host="0.0.0.0", api_key="k").builds_open and ServeConfig().builds_open
    before = snapshot(folder)
    resident = Resident(IndexStore(folder), device="cpu")
    with TestClient(create_app(resident, ServeConfig(index_dir=folder, host="0.0.0.0"))) as http:
        error = one_line_error(http.post("/query", json={"query": "q", "condition": SPORT}), 404)
        assert "--open-builds" in error and "--api-key" in error
    assert snapshot(folder) == before
    with TestClient(create_app(resident, ServeConfig(index_dir=folder, host="0.0.0.0", open_builds=True))) as http:
        assert http.post("/query", json={"query": "q", "condition": SPORT}).status_code == 200


class HeldBuilds:
    """A build function that holds every build until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, store: IndexStore, condition: str, corpus: str, **_: Any) -> OnDemand:
        assert self.release.wait(60)
        return OnDemand("x", corpus, False, 0)


def test_one_client_cannot_take_every_pending_build(folder: Path) -> None:
    held = HeldBuilds()
    builds = Builds(IndexStore(folder), max_pending=4, max_pending_per_client=2, build=held)
    unknown = UnknownCondition("no index", [])
    try:
        for n in range(2):
            builds.start(f"mine {n}", None, unknown, client="10.0.0.1")
        assert builds.start("mine 0", None, unknown, client="10.0.0.1")  # joining one's own build is no new one
        with pytest.raises(TooManyBuilds) as info:
            builds.start("mine 2", None, unknown, client="10.0.0.1")
        assert info.value.status == 429
        builds.start("theirs", None, unknown, client="10.0.0.2")  # another client still gets a slot
    finally:
        held.release.set()
        builds.close()


def test_builds_under_way_count_against_the_cap(folder: Path) -> None:
    held = HeldBuilds()
    builds = Builds(IndexStore(folder), max_indexes=1, build=held)
    unknown = UnknownCondition("no index", [])
    try:
        builds.start("one", None, unknown, client="a")
        with pytest.raises(OnDemandFull):
            builds.start("two", None, unknown, client="b")
    finally:
        held.release.set()
        builds.close()


def test_resident_indexes_are_dropped_least_recently_used_first(tmp_path: Path, corpus_file: Path) -> None:
    store = IndexStore(tmp_path / "idx")
    conditions = ["colour", "sport", "mood"]
    index_corpus(read_corpus(corpus_file), conditions, hash_vectorizer(), store, corpus_name="c")
    vec = hash_vectorizer()
    resident = Resident(store, lambda _m: vec, max_indexes=2)
    for condition in conditions:
        resident.get(condition)
    assert resident.n_indexes == 2
    assert resident.get("colour").manifest.condition == "colour"  # loaded again when asked for
    assert resident.n_indexes == 2


def test_a_refusal_lists_a_few_conditions_of_the_asked_corpus() -> None:
    listing = [(f"a{i}", _manifest(f"aspect {i:03d}", "big")) for i in range(3000)]
    listing += [("s", _manifest("the sport", "small"))]
    with pytest.raises(UnknownCondition) as info:
        find_index(listing, "mood", "small")
    assert "'the sport'" in str(info.value) and "aspect" not in str(info.value)
    with pytest.raises(UnknownCondition) as info:
        find_index(listing, "mood", "big")
    assert len(info.value.conditions) == MAX_LISTED and "and 2,990 more" in str(info.value)
    assert len(str(info.value)) < 600


class CountingStore(IndexStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listed = 0

    def manifests(self):  # noqa: ANN201
        self.listed += 1
        return super().manifests()


def test_an_unknown_condition_does_not_list_the_store_again_until_it_changes(tmp_path: Path, corpus_file: Path) -> None:
    store = CountingStore(tmp_path / "idx")
    index_corpus(read_corpus(corpus_file), ["colour"], hash_vectorizer(), store, corpus_name="c")
    an_hour_ago = time.time_ns() - 3600 * 10**9
    os.utime(store.root, ns=(an_hour_ago, an_hour_ago))  # changed well before it was listed
    resident = Resident(store, lambda _m: hash_vectorizer(), reload_interval_s=3600)
    resident.get("colour")
    listed = store.listed
    for n in range(20):
        with pytest.raises(UnknownCondition):
            resident.find(f"unknown {n}")
    assert store.listed == listed
    index_corpus(read_corpus(corpus_file), ["sport"], hash_vectorizer(), store, corpus_name="c")
    assert resident.find("sport")[1].condition == "sport"  # a new index is found at once


def test_an_index_published_just_after_a_listing_is_found_though_the_folder_kept_its_time(
    tmp_path: Path, corpus_file: Path
) -> None:
    store = IndexStore(tmp_path / "idx")
    index_corpus(read_corpus(corpus_file), ["colour"], hash_vectorizer(), store, corpus_name="c")
    resident = Resident(store, lambda _m: hash_vectorizer(), reload_interval_s=3600)
    resident.get("colour")
    stamp = store.stamp()
    assert stamp is not None
    index_corpus(read_corpus(corpus_file), ["sport"], hash_vectorizer(), store, corpus_name="c")
    os.utime(store.root, ns=(stamp, stamp))  # a coarse clock: the folder's time did not move (a 404 in the flood)
    assert resident.find("sport")[1].condition == "sport"


def test_a_listing_reads_only_the_manifests_that_changed(tmp_path: Path, corpus_file: Path, monkeypatch) -> None:
    store = IndexStore(tmp_path / "idx")
    index_corpus(read_corpus(corpus_file), ["colour", "sport"], hash_vectorizer(), store, corpus_name="c")
    store.manifests()
    read: list[str] = []
    real = IndexStore.read_manifest
    monkeypatch.setattr(IndexStore, "read_manifest", lambda self, name: read.append(name) or real(self, name))
    assert [m.condition for _, m in store.manifests()] == ["colour", "sport"]
    assert read == []
    index_corpus(read_corpus(corpus_file), ["sport"], hash_vectorizer(), store, corpus_name="c", full=True)
    read.clear()
    store.manifests()
    assert read == [n for n in store.names() if n.startswith("sport")]


def test_the_flood_benchmark_runs_in_smoke_mode(tiny_bert_dir: Path, tmp_path: Path) -> None:
    import importlib
    import json

    module = importlib.import_module("benchmarks.systems.flood")
    out = tmp_path / "out.json"
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--router", "none", "--work-dir", str(tmp_path / "w")]
    assert module.main([*argv, "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    flood, soak = result["flood"], result["soak"]
    assert flood["readings"][0]["at"] == "before" and flood["readings"][-1]["requests_done"] == 12
    assert flood["statuses"]["embeddings 200"] == 6 and flood["known_query"]["during_flood"]["n"] > 0
    assert soak["good_failed"] == 0 and soak["requests"]["known 200"] > 0 and soak["rss_mb"]["peak"] > 0


def test_an_embedding_is_answered_though_the_index_chosen_for_its_model_was_deleted(
    tmp_path: Path, corpus_file: Path
) -> None:
    import shutil

    from condsearch.store.folder import VERSIONS

    store, vec = IndexStore(tmp_path / "idx"), hash_vectorizer()
    index_corpus(read_corpus(corpus_file), [COLOUR, SPORT], vec, store, corpus_name="c")
    resident = Resident(store, lambda _m: vec, reload_interval_s=3600)
    with TestClient(create_app(resident, ServeConfig(index_dir=store.root))) as http:
        assert http.post("/query", json={"query": "q", "condition": SPORT}).status_code == 200  # listed, loaded
        chosen = store.find(COLOUR)  # the first of the model's smallest indexes: what the embeddings load
        (store.root / chosen).unlink()
        shutil.rmtree(store.root / VERSIONS / chosen)  # deleted by hand (the soak saw a 404 for a good request)
        embedded = http.post("/v1/embeddings", json={"input": ["a girl"], "condition": "the mood"})
        assert embedded.status_code == 200, embedded.text
