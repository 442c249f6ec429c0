"""`condsearch rm`, ``Store.drop`` and ``DELETE /indexes/...`` while 8 clients query (issue 59): no failed query.

A real server (uvicorn on a free loopback port) answers 8 client threads, each asking in turn the
three indexes of two corpora. Meanwhile one index is dropped through ``DELETE /indexes/{corpus}
?condition=``, then the rest of that corpus by `condsearch rm` from the CLI side and the other corpus
by ``Store.drop``, on the same folder. Every answer is a 200 (before the drop, or from the copy the
server holds in memory) or a one-line 404 once the server saw it gone: never a 5xx, a malformed body or
a connection error. Each dropped index's files are gone afterwards and the store holds no bytes.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

import condsearch
from condsearch.cli import main
from condsearch.corpus.reader import read_corpus
from condsearch.ingest.chunks import index_corpus
from condsearch.serve.server import BackgroundServer
from condsearch.store.folder import VERSIONS, IndexStore
from tests.query.test_on_demand import COLOUR, SPORT
from tests.serve.test_serve_embeddings import hash_vectorizer
from tests.serve.test_serve_hostile import make_app

CLIENTS = 8
ASKED = [("corpus", COLOUR), ("corpus", SPORT), ("other", COLOUR)]


def size(path: Path) -> int:
    """Bytes of the regular files under path (links not followed)."""
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.fixture
def store(tmp_path: Path, corpus_file: Path) -> IndexStore:
    store = IndexStore(tmp_path / "indexes")
    index_corpus(read_corpus(corpus_file), [COLOUR, SPORT], hash_vectorizer(), store, corpus_name="corpus")
    index_corpus(read_corpus(corpus_file), [COLOUR], hash_vectorizer(), store, corpus_name="other")
    return store


class Clients:
    """CLIENTS threads querying ASKED in turn over HTTP until stopped; every answer and failure recorded."""

    def __init__(self, url: str) -> None:
        self.url, self.stop = url, threading.Event()
        self.answers: list[tuple[str, str, int, float]] = []  # (corpus, condition, status, when sent)
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(CLIENTS)]

    def __enter__(self) -> Clients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(60)

    def count(self) -> int:
        with self._lock:
            return len(self.answers)

    def _run(self, which: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            turn = which
            while not self.stop.is_set():
                corpus, condition = ASKED[turn % len(ASKED)]
                turn += 1
                body = {"queries": ["a girl in a red dress"], "condition": condition, "corpus": corpus, "k": 3}
                sent = time.monotonic()
                try:
                    response = http.post("/query", json=body)
                    status = response.status_code
                    if status == 200:
                        assert response.json()["results"][0]["results"], response.text
                    elif status == 404:
                        error = response.json()["error"]
                        assert isinstance(error, str) and "\n" not in error, response.text
                    else:
                        raise AssertionError(f"{status}: {response.text}")
                except Exception as exc:  # noqa: BLE001 - every failure is the test's
                    with self._lock:
                        self.failures.append(f"{corpus}/{condition}: {type(exc).__name__}: {exc}")
                    continue
                with self._lock:
                    self.answers.append((corpus, condition, status, sent))


def wait_for(clients: Clients, more: int) -> None:
    target = clients.count() + more
    deadline = time.monotonic() + 60
    while clients.count() < target:
        assert time.monotonic() < deadline and not clients.failures, clients.failures[:3]
        time.sleep(0.01)


def test_rm_and_delete_while_8_clients_query(store: IndexStore) -> None:
    root = store.root
    versions = {name: (root / name).resolve() for name in store.names()}
    held = {name: size(path) for name, path in versions.items()}
    assert len(versions) == 3 and all(b > 0 for b in held.values())
    sport, other = store.find(SPORT, "corpus"), store.find(COLOUR, "other")
    with BackgroundServer(make_app(store)) as server, Clients(server.url) as clients:
        wait_for(clients, 80)  # every index loaded and answering
        assert {(c, k) for c, k, s, _ in clients.answers if s == 200} == set(ASKED)
        dropped = httpx.delete(f"{server.url}/indexes/corpus", params={"condition": SPORT}, timeout=30)
        assert dropped.status_code == 200 and dropped.json()["deleted"] == [sport], dropped.text
        after_delete = time.monotonic()
        wait_for(clients, 80)
        rm = CliRunner().invoke(main, ["rm", "corpus", "--yes", "--index-dir", str(root)])
        assert rm.exit_code == 0 and "removed 1 index of corpus 'corpus'" in rm.output, rm.output
        wait_for(clients, 80)
        library = condsearch.open(root, model=condsearch.Model(hash_vectorizer()))
        assert library.drop("other") == [other]
        after_all = time.monotonic()
        time.sleep(0.2)  # past the server's listing interval (0.05 s)
        wait_for(clients, 80)
    assert clients.failures == []
    statuses = Counter(s for *_, s, _ in clients.answers)
    assert set(statuses) <= {200, 404} and statuses[200] > 0 and statuses[404] > 0, statuses
    # a query sent once the DELETE returned is not answered from the index it removed: the server forgot its copy
    assert not [a for a in clients.answers if a[:3] == ("corpus", SPORT, 200) and a[3] > after_delete + 0.05]
    late = [a for a in clients.answers if a[3] > after_all + 0.15]
    assert late and {s for *_, s, _ in late} == {404}  # once the server saw them gone: a 404 for each
    # the space came back: no version folder, no link, no staging; only empty lock files stay
    assert all(not path.exists() for path in versions.values())
    assert IndexStore(root).names() == [] and not [p for p in root.iterdir() if p.name != VERSIONS]
    assert size(root) == 0, [p for p in root.rglob("*") if p.is_file() and p.stat().st_size]
    assert sum(held.values()) > 0


def test_a_job_holding_a_dropped_index_is_answered_though_its_model_was_forgotten(store: IndexStore) -> None:
    from condsearch.query.resident import Resident
    from condsearch.store.lifecycle import drop

    loads: list[str] = []

    def load(manifest: object) -> object:
        loads.append("model")
        return hash_vectorizer()

    resident = Resident(store, load, reload_interval_s=0.0)  # type: ignore[arg-type]
    job = resident.job(COLOUR, "other", ["a girl in a red dress"], 3)  # the request holds its index
    drop(store, "other")
    drop(store, "corpus")
    resident.listing(fresh=True)  # the server forgets the dropped indexes, and their model with them
    assert resident.n_indexes == 0 and resident.n_models == 0
    [answer] = resident.answer_batch([job])  # the job in flight is answered from what it holds
    assert not isinstance(answer, BaseException), answer
    assert answer.found.result.ids.shape == (1, 3) and loads == ["model"]
