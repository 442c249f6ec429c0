"""The micro-batcher and the batch answerer: requests that arrive together share one forward pass."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from condsearch.base.faiss_indexes import exact_search
from condsearch.corpus.reader import read_corpus
from condsearch.ingest.chunks import index_corpus
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.resident import QueryJob, Resident, UnknownCondition, split_job, vectorizer_key
from condsearch.serve.batching import Lanes, MicroBatcher
from condsearch.serve.priority import BACKGROUND_NICE
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES, HashEncoder

COLOUR = "color of the dress"
SPORT = "the sport being played"


def test_concurrent_submits_share_batches() -> None:
    calls: list[list[int]] = []
    release = threading.Event()

    def run(items: list[int]) -> list[int]:
        calls.append(list(items))
        release.wait(5)  # the first batch blocks, so the others pile up behind it
        return [i * 10 for i in items]

    with MicroBatcher(run, max_batch=64, window_s=0.01) as batcher:
        futures = [batcher.submit(0)]
        time.sleep(0.05)  # the worker is now inside the first batch
        with ThreadPoolExecutor(16) as pool:
            futures += list(pool.map(batcher.submit, range(1, 33)))
        release.set()
        assert [f.result(5) for f in futures] == [i * 10 for i in range(33)]
    assert len(calls) < 33 / 4, calls  # 32 queued requests ran in a few batches, not one by one
    assert calls[0] == [0] and sorted(i for c in calls[1:] for i in c) == list(range(1, 33))
    assert batcher.stats.n_batches == len(calls) and batcher.stats.n_items == 33


def test_max_batch_caps_the_weight_of_a_batch() -> None:
    calls: list[list[int]] = []
    gate = threading.Event()

    def run(items: list[int]) -> list[int]:
        gate.wait(5)
        calls.append(list(items))
        return items

    with MicroBatcher(run, max_batch=5, window_s=0.01, size=lambda n: n) as batcher:
        futures = [batcher.submit(n) for n in (1, 2, 2, 3, 1, 9, 1)]
        gate.set()
        assert [f.result(5) for f in futures] == [1, 2, 2, 3, 1, 9, 1]
    assert all(sum(c) <= 5 or len(c) == 1 for c in calls), calls  # an item heavier than max runs alone
    assert [n for c in calls for n in c] == [1, 2, 2, 3, 1, 9, 1]  # order kept


def test_a_lone_request_waits_only_the_window() -> None:
    with MicroBatcher(lambda items: items, max_batch=8, window_s=0.005) as batcher:
        start = time.perf_counter()
        assert batcher.submit("x").result(5) == "x"
        assert time.perf_counter() - start < 1.0


def test_errors_reach_only_their_callers_and_the_worker_survives() -> None:
    def run(items: list[int]) -> list[object]:
        if -1 in items:
            raise RuntimeError("the whole batch failed")
        return [ValueError(f"bad {i}") if i % 2 else i for i in items]

    with MicroBatcher(run, max_batch=8, window_s=0.0) as batcher:
        assert batcher.submit(2).result(5) == 2
        with pytest.raises(ValueError, match="bad 3"):
            batcher.submit(3).result(5)
        with pytest.raises(RuntimeError, match="whole batch"):
            batcher.submit(-1).result(5)
        assert batcher.submit(4).result(5) == 4


def test_close_answers_what_was_queued() -> None:
    batcher = MicroBatcher(lambda items: [i + 1 for i in items], max_batch=2, window_s=0.0)
    futures = [batcher.submit(i) for i in range(5)]
    batcher.close()
    assert [f.result(5) for f in futures] == [1, 2, 3, 4, 5]
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit(9)


@pytest.mark.parametrize("kwargs", [{"max_batch": 0}, {"window_s": -1.0}])
def test_bad_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        MicroBatcher(lambda items: items, **kwargs)


# ---------------------------------------------------------------- Resident.answer_batch


@pytest.fixture
def resident(tmp_path: Path, corpus_file: Path) -> tuple[Resident, HashEncoder, list[int]]:
    """Two conditions indexed with the hash encoder; loads counts vectorizer loads."""
    encoder = HashEncoder()
    vec = Vectorizer(encoder, None, "none", "")
    store = IndexStore(tmp_path / "idx")
    index_corpus(read_corpus(corpus_file), [COLOUR, SPORT], vec, store, corpus_name="corpus")
    loads: list[int] = []

    def load(_manifest: object) -> Vectorizer:
        loads.append(1)
        return vec

    return Resident(store, load, reload_interval_s=0.0), encoder, loads


def test_one_forward_pass_per_condition_for_a_batch(resident) -> None:
    res, encoder, loads = resident
    colour, sport = res.get(COLOUR), res.get(SPORT)
    assert len(loads) == 1 and res.n_models == 1 and res.n_indexes == 2  # one model shared by both indexes
    assert colour.model_key == sport.model_key == vectorizer_key(colour.manifest)
    jobs = [
        QueryJob(colour, (SENTENCES[0],), 3),
        QueryJob(colour, (SENTENCES[1], SENTENCES[2]), 2),
        QueryJob(sport, (SENTENCES[3],), 8),
        QueryJob(colour, (SENTENCES[4],), 1),
    ]
    encoder.batches.clear()
    answers = res.answer_batch(jobs)
    conditional = [b for b in encoder.batches if all(s is not None for _, s in b)]
    assert len(conditional) == 2  # four requests, two conditions: two forward passes
    assert sorted(len(b) for b in conditional) == [1, 4]
    for job, found in zip(jobs, answers, strict=True):
        assert not isinstance(found, BaseException)
        assert found.result.ids.shape == (len(job.queries), job.k)
        # each request gets what it would get alone: the exact top k under its own condition
        alone = res.answer_batch([job])[0]
        assert not isinstance(alone, BaseException)
        np.testing.assert_array_equal(found.result.ids, alone.result.ids)
        np.testing.assert_allclose(found.result.scores, alone.result.scores, rtol=1e-5, atol=1e-6)
        for qi, q in enumerate(job.queries):
            assert found.result.ids[qi, 0] == SENTENCES.index(q)  # a corpus sentence finds itself
            assert found.hits[qi][0].text == q and found.hits[qi][0].row == SENTENCES.index(q)


def test_batch_matches_exact_search(resident) -> None:
    res, encoder, _ = resident
    entry = res.get(COLOUR)
    queries = tuple(SENTENCES[:5])
    [found] = res.answer_batch([QueryJob(entry, queries, 4)])
    assert not isinstance(found, BaseException)
    corpus = np.stack([entry.index.stored.index.reconstruct(i) for i in range(len(SENTENCES))])
    vec = res.vectorizer(entry.model_key)
    expected = exact_search(corpus, vec.encode(list(queries), COLOUR), 4)
    np.testing.assert_array_equal(found.result.ids, expected.ids)


def test_a_failing_group_fails_only_its_requests(resident, monkeypatch: pytest.MonkeyPatch) -> None:
    res, encoder, _ = resident
    colour, sport = res.get(COLOUR), res.get(SPORT)
    real = encoder.encode_batch

    def flaky(pairs):  # noqa: ANN001, ANN202
        if any(c == SPORT for c, _ in pairs):
            raise RuntimeError("out of memory")
        return real(pairs)

    monkeypatch.setattr(encoder, "encode_batch", flaky)
    ok, failed = res.answer_batch([QueryJob(colour, ("a",), 1), QueryJob(sport, ("a",), 1)])
    assert not isinstance(ok, BaseException) and isinstance(failed, RuntimeError)


def test_unknown_condition_lists_what_is_indexed(resident) -> None:
    res, _, _ = resident
    with pytest.raises(UnknownCondition, match="no index for condition 'the mood'") as info:
        res.get("the mood")
    assert info.value.conditions == sorted([COLOUR, SPORT])


def test_replaced_index_is_reloaded_and_the_model_kept(resident, write_corpus, tmp_path: Path) -> None:
    res, encoder, loads = resident
    before = res.get(COLOUR)
    assert res.get(COLOUR) is before  # unchanged: the resident copy, no reload
    vec = res.vectorizer(before.model_key)
    new = write_corpus({"id": ["n0", "n1"], "text": ["A new sentence.", "Another one."]}, name="corpus.parquet")
    index_corpus(read_corpus(new), [COLOUR], vec, res.store, corpus_name="corpus")
    after = res.get(COLOUR)
    assert after is not before and after.index.stored.ids == ["n0", "n1"]
    assert len(loads) == 1  # the model stayed loaded


# ---------------------------------------------------------------- requests in parts (issue 37)


def test_a_new_request_goes_before_the_rest_of_a_large_one() -> None:
    calls: list[list[str]] = []
    first, release = threading.Event(), threading.Event()

    def run(items: list[str]) -> list[str]:
        calls.append(list(items))
        first.set()
        release.wait(5)
        return [i.upper() for i in items]

    with MicroBatcher(run, max_batch=64, window_s=0.0, cost=len, max_cost=4) as batcher:
        large = batcher.submit_parts(["aaaa", "bbbb", "cccc", "dddd"])  # four parts of the whole budget
        assert first.wait(5)  # its first part is running
        small = batcher.submit("x")
        other = batcher.submit_parts(["yy", "zz"])
        release.set()
        assert large.result(5) == ["AAAA", "BBBB", "CCCC", "DDDD"] and small.result(5) == "X"
        assert other.result(5) == ["YY", "ZZ"]
    # the requests that had no part run go first, one part each within the budget; then in turn
    assert calls == [["aaaa"], ["x", "yy"], ["bbbb"], ["zz"], ["cccc"], ["dddd"]]


# ---------------------------------------------------------------- two lanes (issue 58)


def test_a_light_request_is_answered_while_a_heavy_batch_runs() -> None:
    """A known query (one part, few tokens) goes to the quick lane: it waits for no heavy batch, not even the one
    running; heavy requests (many parts, or many tokens) go to the bulk lane and are all answered."""
    release = threading.Event()
    ran: dict[str, list[list[int]]] = {"quick": [], "bulk": []}

    def run(items: list[int]) -> list[int]:
        lane = threading.current_thread().name.removeprefix("condsearch-")
        ran[lane].append(list(items))
        if any(n >= 100 for n in items):
            assert release.wait(5)  # a heavy batch, held until the light requests are answered
        return items

    with Lanes(run, light_cost=64, max_batch=64, window_s=0.0, cost=lambda n: n, max_cost=2048) as lanes:
        heavy = [lanes.submit_parts([700, 700]), lanes.submit(100), lanes.submit_parts([3, 3])]
        light = [lanes.submit(n) for n in (3, 64)]
        assert [f.result(5) for f in light] == [3, 64]  # answered while the heavy batch is held
        assert not any(f.done() for f in heavy[:2])
        release.set()
        assert [f.result(5) for f in heavy] == [[700, 700], 100, [3, 3]]
    assert sorted(n for batch in ran["quick"] for n in batch) == [3, 64]
    assert sorted(n for batch in ran["bulk"] for n in batch) == [3, 3, 100, 700, 700]
    assert lanes.stats.n_items == 7


def thread_nice() -> int:
    """Return the calling thread's nice value (Linux: per thread)."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="thread priorities are Linux's")
def test_the_bulk_lane_runs_at_a_lower_cpu_priority_than_the_quick_one() -> None:
    """Heavy work takes the CPU that light requests leave: the OS runs the quick lane first while both run."""
    nice: dict[str, int] = {}

    def run(items: list[int]) -> list[int]:
        nice[threading.current_thread().name] = thread_nice()
        return items

    mine = thread_nice()
    with Lanes(run, light_cost=64, max_batch=64, window_s=0.0, cost=lambda n: n, max_cost=2048) as lanes:
        assert lanes.submit(1).result(5) == 1 and lanes.submit(500).result(5) == 500
    assert nice["condsearch-quick"] == mine
    assert nice["condsearch-bulk"] == min(19, mine + BACKGROUND_NICE)


def test_a_failed_part_fails_its_request_and_its_other_parts_do_not_run() -> None:
    calls: list[list[int]] = []

    def run(items: list[int]) -> list[object]:
        calls.append(list(items))
        return [ValueError("bad part") if i == 2 else i for i in items]

    with MicroBatcher(run, max_batch=1, window_s=0.0) as batcher:
        with pytest.raises(ValueError, match="bad part"):
            batcher.submit_parts([1, 2, 3, 4]).result(5)
        assert batcher.submit_parts([5, 6]).result(5) == [5, 6]
    assert [i for c in calls for i in c] == [1, 2, 5, 6]


def test_a_cancelled_request_runs_no_more_parts() -> None:
    calls: list[list[int]] = []
    first, release = threading.Event(), threading.Event()

    def run(items: list[int]) -> list[int]:
        calls.append(list(items))
        first.set()
        release.wait(5)
        return items

    with MicroBatcher(run, max_batch=1, window_s=0.0) as batcher:
        gave_up = batcher.submit_parts([1, 2, 3])
        assert first.wait(5)
        assert gave_up.cancel()  # as asyncio does when a request times out
        release.set()
        assert batcher.submit(9).result(5) == 9
    assert [i for c in calls for i in c] == [1, 9]


def _job(n: int, tokens: int) -> QueryJob:
    return QueryJob(None, tuple(f"q{i}" for i in range(n)), 3, None, (tokens,) * n)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "tokens", "sizes"),
    [
        (1, 10, [1]),
        (64, 10, [64]),
        (65, 10, [32, 33]),  # not 64 and 1: the last part evened out, to be searched as the whole is
        (20, 256, [10, 10]),
        (10, 512, [8, 2]),  # too few to even out to 8 each: left as split
        (256, 256, [16] * 16),
        (3, 5000, [1, 1, 1]),  # a query over the budget is a part alone
        (40, 256, [16, 16, 8]),
    ],
)
def test_split_job_bounds_each_part(n: int, tokens: int, sizes: list[int]) -> None:
    job = _job(n, tokens)
    parts = split_job(job, 64, 4096)
    assert [len(p.queries) for p in parts] == sizes
    assert tuple(q for p in parts for q in p.queries) == job.queries
    assert all(p.k == 3 and p.n_tokens == tokens * len(p.queries) for p in parts)
