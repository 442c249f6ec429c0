"""Indexes and their models loaded once and kept, for a long-running reader: the server and the Python API.

``Resident`` finds the index a request names (:func:`condsearch.store.listing.find_index`) in its
source, a FAISS folder or a Milvus database (:class:`condsearch.store.searchable.IndexSource`), loads it
on first use and again when `condsearch index` has replaced it (it watches the manifests,
re-read at most every ``reload_interval_s``), and shares one loaded model (encoder + adapter +
head) between every index built with the same one. ``answer_batch`` answers a batch through
:func:`condsearch.query.search.answer_batch`: one forward pass per (model, condition), one search per index.

Every model is loaded for the ``resident`` purpose (:func:`condsearch.model.loader.load_model_for`): on the
CPU it runs on onnxruntime wherever the index allows it, as a one-shot `condsearch query` does, so
that the server's and the Python API's answers are the query's.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from condsearch.base.ann import walks_lists_or_graph
from condsearch.base.faiss_indexes import DEFAULT_SEARCH_THREADS, FLAT_BLAS_MIN_QUERIES, WALK_SEARCH_THREADS
from condsearch.base.faiss_indexes import search_threads as set_search_threads
from condsearch.errors import AmbiguousCondition, CondsearchError, StoreError, UnknownCondition, first_line
from condsearch.model.artifacts.profiles import MODE_CSR
from condsearch.model.encoders.cpu import Backend, CpuConfig
from condsearch.model.encoders.spec import Runtime
from condsearch.model.loader import load_model_for
from condsearch.model.policy import backend_of
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.config import QueryConfig
from condsearch.query.search import Answer, Request, answer_batch, filter_rows, vectorizer_key
from condsearch.query.tokens import TextCutter, UnknownCounter, estimate_tokens, text_cutter, unknown_counter
from condsearch.store.listing import Listing, find_index
from condsearch.store.manifest import Manifest
from condsearch.store.searchable import Found, IndexSource, Searchable

#: re-exported for the server: the errors, the model key and the policy live in errors, search and model.policy
__all__ = [
    "AmbiguousCondition",
    "LoadedIndex",
    "QueryJob",
    "Resident",
    "split_job",
    "UnknownCondition",
    "backend_of",
    "vectorizer_key",
]

log = logging.getLogger(__name__)

#: how the server's requests name the corpus, in its errors
CORPUS_FIELD = '"corpus"'
#: a store folder changed this close to a listing (or after it) is listed again for an unknown condition: a file
#: system's times are coarser than their nanoseconds (a clock tick; seconds on some), so a change just after a
#: listing may keep the folder's time
STAMP_GRACE_NS = 2_000_000_000


@dataclass(frozen=True)
class LoadedIndex:
    """A resident index: its name in the source, the index itself (searched through it), and its model's key.

    ``model`` keeps its model loaded for as long as a job holds the index, though the index leaves memory
    (dropped from the store, or evicted) and the resident forgets the model meanwhile.
    """

    name: str
    index: Searchable
    model_key: str
    model: Vectorizer | None = field(default=None, repr=False, compare=False)

    @property
    def manifest(self) -> Manifest:
        return self.index.manifest

    def search(self, vectors: np.ndarray, k: int) -> Found:
        return self.index.search(vectors, k)

    @functools.cached_property
    def walks(self) -> bool:
        """Whether a query probes IVF lists or walks an HNSW graph (one search thread's work), read once."""
        return walks_lists_or_graph(self.manifest.factory)


@dataclass(frozen=True)
class QueryJob:
    """One request (or a part of one): its queries under its index's condition, k results each.

    ``texts``: what the model encodes of each query, the query or its start where the model reads no
    further (:mod:`condsearch.query.tokens`); ``tokens``: what the model reads of each, for scheduling.
    """

    index: LoadedIndex
    queries: tuple[str, ...]
    k: int
    texts: tuple[str, ...] | None = None
    tokens: tuple[int, ...] | None = None
    #: each query's share of unknown tokens ([UNK]; TextCutter.unknown_shares), None where not counted
    unknown: tuple[float, ...] | None = None
    #: the rows a filter keeps (:func:`condsearch.query.search.filter_rows`), only which are ranked; None: every row
    allowed: np.ndarray | None = None

    @property
    def encoded(self) -> tuple[str, ...]:
        """Return the texts the model encodes, one per query."""
        return self.queries if self.texts is None else self.texts

    @property
    def n_tokens(self) -> int:
        """Return the tokens the model reads for this job (0 where they were not counted)."""
        return sum(self.tokens or ())

    def part(self, start: int, stop: int) -> QueryJob:
        """Return the job of queries[start:stop]."""
        texts = None if self.texts is None else self.texts[start:stop]
        tokens = None if self.tokens is None else self.tokens[start:stop]
        return QueryJob(self.index, self.queries[start:stop], self.k, texts, tokens, allowed=self.allowed)


def split_job(job: QueryJob, max_queries: int, max_tokens: int) -> list[QueryJob]:
    """Split job into parts of at most max_queries queries and max_tokens tokens, in order.

    A query over max_tokens is a part alone. Where the job holds twice
    :data:`~condsearch.base.faiss_indexes.FLAT_BLAS_MIN_QUERIES` queries or more, the last part is evened out with
    the one before it to hold that many too, so every part is searched as the whole job would be
    (by one matrix product; fewer queries scan the rows, which may differ in the last bits).
    """
    n = len(job.queries)
    tokens = job.tokens or (0,) * n
    bounds, start, cost = [], 0, 0
    for i in range(n):
        if i > start and (i - start + 1 > max_queries or cost + tokens[i] > max_tokens):
            bounds.append((start, i))
            start, cost = i, 0
        cost += tokens[i]
    bounds.append((start, n))
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < FLAT_BLAS_MIN_QUERIES:
        first, stop = bounds[-2][0], bounds[-1][1]
        if stop - first >= 2 * FLAT_BLAS_MIN_QUERIES:
            middle = first + (stop - first) // 2
            bounds[-2:] = [(first, middle), (middle, stop)]
    return [job.part(a, b) for a, b in bounds] if len(bounds) > 1 else [job]


class Resident:
    """Indexes and models loaded once and kept; replaced indexes are noticed and reloaded."""

    def __init__(
        self,
        store: IndexSource,
        load_vectorizer: Callable[[Manifest], Vectorizer] | None = None,
        *,
        reload_interval_s: float = QueryConfig.reload_interval_s,
        device: str | None = None,
        trust_remote_code: bool = False,
        quantize: str | None = None,
        threads: int | None = None,
        backend: Backend = CpuConfig.backend,
        search_threads: int | None = None,
        corpus_option: str = CORPUS_FIELD,
        max_indexes: int = QueryConfig.max_resident_indexes,
    ) -> None:
        self.store = store
        self.max_indexes = max_indexes
        self.search_threads = search_threads
        self.corpus_option = corpus_option  # how errors tell the caller to name a corpus
        runtime = Runtime(device=device, threads=threads, trust_remote_code=trust_remote_code)
        self._load_vectorizer = load_vectorizer or (
            lambda m: load_model_for("resident", m, runtime=runtime, backend=backend, quantize=quantize)
        )
        self.reload_interval_s = reload_interval_s
        self._indexes: OrderedDict[str, LoadedIndex] = OrderedDict()  # least recently used first
        self._models: dict[str, Vectorizer] = {}
        #: models forgotten while a job may still hold an index of theirs (LoadedIndex.model keeps them alive)
        self._forgotten: weakref.WeakValueDictionary[str, Vectorizer] = weakref.WeakValueDictionary()
        self._cutters: dict[str, TextCutter | None] = {}
        self._counters: dict[str, UnknownCounter | None] = {}  # [UNK] of a model whose texts are not cut
        self._listing: Listing = []
        self._listed_at = float("-inf")
        self._listed_stamp: object = None
        self._listed_ns = 0  # when the listing was read (wall clock, ns)
        self._list_lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._cutter_lock = threading.Lock()

    # ------------------------------------------------------------ what is indexed

    def listing(self, *, fresh: bool = False) -> Listing:
        """Return the store's (name, manifest or error) pairs, re-read when older than the interval.

        Not re-read where the store says it has not changed since (its folder's time, :meth:`_unchanged`): a store
        of 3,000 indexes took 0.28 s to list, every half second. ``fresh`` reads it now, whatever it says.
        """
        with self._list_lock:
            now = time.monotonic()
            if fresh or (now - self._listed_at >= self.reload_interval_s and not self._unchanged()):
                self._listed_stamp, self._listed_ns = self._stamp(), time.time_ns()
                self._listing = self.store.manifests()
                self._forget_removed({name for name, _ in self._listing})
            if fresh or now - self._listed_at >= self.reload_interval_s:
                self._listed_at = now
            return self._listing

    def _unchanged(self) -> bool:
        """Return whether the store says no index was added, replaced or removed since it was last listed."""
        stamp = self._stamp()
        return isinstance(stamp, int) and stamp == self._listed_stamp and stamp < self._listed_ns - STAMP_GRACE_NS

    def _forget_removed(self, names: set[str]) -> None:
        # Indexes deleted from the store leave memory too; skipped while a load holds the lock.
        if not self._load_lock.acquire(blocking=False):
            return
        try:
            for name in [n for n in list(self._indexes) if n not in names]:  # list(): one step, under the GIL
                self._indexes.pop(name, None)
            self._drop_unused_models()
        finally:
            self._load_lock.release()

    def find(self, condition: str, corpus: str | None = None) -> tuple[str, Manifest]:
        """Return the (name, manifest) of the one index for condition (and corpus)."""
        options = {"root": str(self.store.root), "corpus_option": self.corpus_option}  # the server names no paths
        try:
            return find_index(self.listing(), condition, corpus, **options)
        except UnknownCondition:
            # an index added since the last listing is found without waiting; a store that says it has not
            # changed is not listed again for every unknown condition (issue 58: 0.28 s at 3,000 indexes)
            if self._unchanged():
                raise
            return find_index(self.listing(fresh=True), condition, corpus, **options)

    def _stamp(self) -> object:
        """Return what changes when an index is added, replaced or removed: the store folder's modification time in
        ns (None where the store tells nothing)."""
        stamp = getattr(self.store, "stamp", None)
        return stamp() if callable(stamp) else None

    # ------------------------------------------------------------ loading

    def get(self, condition: str, corpus: str | None = None) -> LoadedIndex:
        """Return the resident index for condition, loading or reloading it when its manifest changed."""
        name, manifest = self.find(condition, corpus)
        current = self._indexes.get(name)
        if current is not None and current.manifest == manifest:
            self._touch(name)
            return current
        with self._load_lock:
            current = self._indexes.get(name)
            if current is not None and current.manifest == manifest:
                return current
            try:
                opened = self.store.load_searchable(name)  # checked against the manifest: never half an index
            except StoreError as exc:
                if current is not None:  # caught mid-replacement: keep answering from the previous one
                    log.warning("%s: keeping the loaded copy (%s)", name, first_line(exc))
                    return current
                raise
            key = vectorizer_key(opened.manifest)
            if key not in self._models:
                log.info("loading the model for %s", name)
                self._models[key] = self._forgotten.get(key) or self._load_vectorizer(opened.manifest)
                log.info("%s: the model runs on %s", name, backend_of(self._models[key]))
            loaded = LoadedIndex(name, opened, key, self._models[key])
            self._indexes[name] = loaded
            self._touch(name)
            self._evict()
            self._drop_unused_models()
            log.info("%s: %s (%d rows)", name, "reloaded" if current else "loaded", opened.manifest.n_vectors)
            return loaded

    def _touch(self, name: str) -> None:
        try:
            self._indexes.move_to_end(name)
        except KeyError:  # dropped meanwhile by another thread
            pass

    def _evict(self) -> None:
        """Drop the least recently used indexes past ``max_indexes`` (load lock held); a job holding one keeps it."""
        while len(self._indexes) > self.max_indexes:
            name, _ = self._indexes.popitem(last=False)
            log.info("%s: unloaded (the least recently used of %d)", name, self.max_indexes + 1)

    def job(
        self, condition: str, corpus: str | None, queries: Sequence[str], k: int, where: str | None = None
    ) -> QueryJob:
        """Return the job of queries under the index for condition: each cut to what its model reads, and counted.

        Runs on the caller's thread (the tokenizer is the model's, copied), not the batching one. ``where``: a
        filter on the index's kept columns, applied here (a bad one raises FilterError in one line).
        """
        entry = self.get(condition, corpus)
        allowed = filter_rows(entry, where)
        cutter = self.cutter(entry.model_key)
        unknown = None
        if cutter is not None:
            texts, tokens = cutter.cut(queries, entry.manifest.condition)
            unknown = cutter.unknown_shares(texts)
        else:
            max_tokens = getattr(self.vectorizer(entry.model_key).encoder, "max_length", None)
            texts, tokens = list(queries), [estimate_tokens(q, max_tokens) for q in queries]
            counter = self.counter(entry.model_key)  # a router's queries too (issue 59)
            unknown = counter.unknown_shares(texts) if counter is not None else None
        shares = None if unknown is None else tuple(unknown)
        return QueryJob(entry, tuple(queries), k, tuple(texts), tuple(tokens), shares, allowed)

    def cutter(self, key: str) -> TextCutter | None:
        """Return the server's one copy of a model's tokenizer for cutting texts (None where texts are not cut)."""
        if key not in self._cutters:
            with self._cutter_lock:  # one copy of a model's tokenizer, made once
                if key not in self._cutters:
                    self._cutters[key] = text_cutter(self.vectorizer(key).encoder)
        return self._cutters[key]

    def counter(self, key: str) -> UnknownCounter | None:
        """Return the server's one copy of a model's tokenizer for counting [UNK] in texts it does not cut."""
        if key not in self._counters:
            with self._cutter_lock:
                if key not in self._counters:
                    self._counters[key] = unknown_counter(self.vectorizer(key).encoder)
        return self._counters[key]

    def preload(self) -> None:
        """Load every readable index and its model now; one that fails is logged and left for later."""
        for _, m in self.listing(fresh=True):
            if isinstance(m, Manifest):
                try:
                    self.get(m.condition, m.corpus_name)
                except CondsearchError as exc:
                    log.warning("cannot preload %r: %s", m.condition, first_line(exc))

    def close(self) -> None:
        """Release the source (a Milvus connection); the indexes and models go with this object."""
        self.store.close()

    def vectorizer(self, key: str) -> Vectorizer:
        """Return the loaded model an index refers to (one a job's index still holds, though forgotten meanwhile)."""
        try:
            return self._models[key]
        except KeyError:
            return self._forgotten[key]

    def _drop_unused_models(self) -> None:
        used = {entry.model_key for entry in list(self._indexes.values())}
        for key in [k for k in self._models if k not in used]:
            self._forgotten[key] = self._models[key]  # first: a reader finds it in one or the other
            del self._models[key]
            self._cutters.pop(key, None)
            self._counters.pop(key, None)

    @property
    def n_indexes(self) -> int:
        return len(self._indexes)

    @property
    def n_models(self) -> int:
        return len(self._models)

    def models(self) -> list[dict[str, str]]:
        """Return each loaded model's id, what makes its vectors (a router's ``router``, else the ``profile``) and
        what runs it (``backend``: onnxruntime or torch)."""
        described = []
        for vec in list(self._models.values()):
            router = getattr(vec.encoder, "router_name", None) if vec.mode == MODE_CSR else None
            made_by = {"router": str(router)} if router is not None else {"profile": vec.profile_name}
            described.append({"model": vec.encoder.model_id, **made_by, "backend": backend_of(vec)})
        return described

    # ------------------------------------------------------------ answering

    def answer_batch(self, jobs: Sequence[QueryJob]) -> list[Answer | BaseException]:
        """Answer a batch: one forward pass per (model, condition), one search per index.

        Returns one Answer per job (k capped at the index's rows), or the exception raised for it;
        a job that breaks the model fails alone (see :func:`condsearch.query.search.answer_batch`).
        """
        # OpenMP keeps the thread count per calling thread: set it on the one that searches. Unless
        # asked, an IVF or HNSW index gets WALK_SEARCH_THREADS, an exact one FAISS's default
        threads = self.search_threads
        if threads is None:
            threads = WALK_SEARCH_THREADS if all(job.index.walks for job in jobs) else DEFAULT_SEARCH_THREADS
        set_search_threads(threads)
        requests = [
            Request(job.index, self.vectorizer(job.index.model_key), job.encoded, job.k, job.allowed) for job in jobs
        ]
        answers = answer_batch(requests, one_pass=True)
        # each answer names the queries as sent, not as cut for the model
        return [
            a if isinstance(a, BaseException) else replace(a, queries=j.queries)
            for a, j in zip(answers, jobs, strict=True)
        ]
