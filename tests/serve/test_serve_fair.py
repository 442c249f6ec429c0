"""A large request does not hold up a small one (issue 37): it is answered in parts of bounded tokens,
and a request waiting for its first part goes before those already served.

No timings: an encoder that records its forward passes, and holds the first one until the small
request is queued, shows the order in which the batcher ran them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from condsearch.corpus.reader import read_corpus
from condsearch.ingest.chunks import index_corpus
from condsearch.model.encoders.base import Pair
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.resident import QueryJob, Resident
from condsearch.serve.app import create_app
from condsearch.serve.batching import MicroBatcher
from condsearch.serve.config import ServeConfig
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES, HashEncoder

COLOUR = "color of the dress"
SMALL = "a girl in a red dress"
#: 64 queries of about 2,000 characters: each weighs the model's most tokens, 32,768 in all
BIG = [f"{SENTENCES[i % len(SENTENCES)]} {i} " + "and the crowd watches the game " * 64 for i in range(64)]


class GatedEncoder(HashEncoder):
    """The hash encoder, holding its first forward pass of big queries until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release = threading.Event(), threading.Event()

    def encode_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        if any(s in BIG for _, s in pairs) and not self.started.is_set():
            self.started.set()
            assert self.release.wait(30)
        return super().encode_batch(pairs)


@pytest.fixture
def store(tmp_path: Path, corpus_file: Path) -> IndexStore:
    store = IndexStore(tmp_path / "indexes")
    vec = Vectorizer(HashEncoder(), None, "none", "")
    index_corpus(read_corpus(corpus_file), [COLOUR], vec, store, corpus_name="corpus")
    return store


def _when_submitted(batcher: MicroBatcher[Any, Any], text: str, event: threading.Event) -> None:
    """Set event once a job holding text is queued in batcher (wrapping whichever submit the app calls)."""
    for name in ("submit", "submit_parts"):
        real: Callable[[Any], Future[Any]] | None = getattr(batcher, name, None)
        if real is None:
            continue

        def wrapped(item: Any, real: Callable[[Any], Future[Any]] = real) -> Future[Any]:
            future = real(item)
            jobs = item if isinstance(item, list | tuple) else [item]
            if any(text in job.queries for job in jobs if isinstance(job, QueryJob)):
                event.set()
            return future

        setattr(batcher, name, wrapped)


def test_a_small_request_is_not_queued_behind_a_large_one(store: IndexStore) -> None:
    encoder = GatedEncoder()
    vec = Vectorizer(encoder, None, "none", "")
    app = create_app(Resident(store, lambda _: vec), ServeConfig(index_dir=store.root, batch_window_ms=0.0))
    small_queued = threading.Event()
    _when_submitted(app.state.batcher, SMALL, small_queued)
    with TestClient(app) as http, ThreadPoolExecutor(2) as pool:
        big = pool.submit(http.post, "/query", json={"queries": BIG, "condition": COLOUR, "k": 2})
        assert encoder.started.wait(30)  # the big request's first forward pass is running
        small = pool.submit(http.post, "/query", json={"query": SMALL, "condition": COLOUR, "k": 2})
        assert small_queued.wait(30)
        encoder.release.set()
        big_answer, small_answer = big.result(60), small.result(60)
    assert big_answer.status_code == 200 and small_answer.status_code == 200, (big_answer.text, small_answer.text)

    passes = [[s for _, s in b] for b in encoder.batches if all(s is not None for _, s in b)]
    big_passes = [i for i, p in enumerate(passes) if set(p) & set(BIG)]
    small_pass = next(i for i, p in enumerate(passes) if SMALL in p)
    assert small_pass < big_passes[-1], passes  # answered before the large request's last part
    assert set(passes[small_pass]).isdisjoint(BIG)  # and not run beside a whole part of it
    assert max(len(passes[i]) for i in big_passes) <= ServeConfig.max_batch_tokens // 512

    # the parts add up to the answer the request gets alone: every query, in order
    body = big_answer.json()
    assert [a["query"] for a in body["results"]] == BIG and body["k"] == 2
    resident = Resident(store, lambda _: Vectorizer(HashEncoder(), None, "none", ""))
    with TestClient(create_app(resident, ServeConfig(index_dir=store.root))) as alone:
        assert alone.post("/query", json={"queries": BIG, "condition": COLOUR, "k": 2}).json() == body
