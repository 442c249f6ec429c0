"""What the server keeps resident and how a batch of queries is answered.

``Resident`` finds the index a request names, loads it on first use and again when
`condsearch index` has replaced it (it watches the manifests, re-read at most every
``reload_interval_s``), and shares one loaded model (encoder + adapter + head) between every
index built with the same one. ``answer_batch`` encodes each (model, condition) group of a batch
in one forward pass and searches each index once for all of its queries.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np

from condsearch.artifacts.profiles import recorded_profile
from condsearch.errors import CondsearchError, StoreError, first_line
from condsearch.index import SearchResult, search, to_search_device
from condsearch.pipeline import Vectorizer, vectorizer_for
from condsearch.store import IndexStore, Manifest, StoredIndex

log = logging.getLogger(__name__)

Listing = list[tuple[str, "Manifest | StoreError"]]


class UnknownCondition(CondsearchError):
    """No index holds the condition (and corpus) asked for."""

    def __init__(self, message: str, conditions: list[str]) -> None:
        super().__init__(message)
        self.conditions = conditions


class AmbiguousCondition(CondsearchError):
    """Several corpora are indexed under the condition and the request named none."""

    def __init__(self, message: str, corpora: list[str]) -> None:
        super().__init__(message)
        self.corpora = corpora


def vectorizer_key(manifest: Manifest) -> str:
    """Return what identifies the model an index needs: indexes with equal keys share one loaded copy."""
    fields = {
        "model_id": manifest.model_id,
        "model_revision": manifest.model_revision,
        "mode": manifest.mode,
        "head": recorded_profile(manifest.head),  # an older index's 'default' is 'lora'
        "head_checksum": manifest.head_checksum,
        "encoder": manifest.encoder,  # pooling, prompts, max_length, dtype, adapter and router fingerprints
    }
    return json.dumps(fields, sort_keys=True, default=str)


@dataclass(frozen=True)
class LoadedIndex:
    """A resident index: its rows, a searcher on the search device, and the key of its model."""

    stored: StoredIndex
    searcher: Any  # faiss.Index or index.TorchFlatIndex
    model_key: str

    @property
    def manifest(self) -> Manifest:
        return self.stored.manifest


@dataclass(frozen=True)
class QueryJob:
    """One request: its queries under its index's condition, k results each (k ≤ the index's rows)."""

    index: LoadedIndex
    queries: tuple[str, ...]
    k: int


class Resident:
    """Indexes and models loaded once and kept; replaced indexes are noticed and reloaded."""

    def __init__(
        self,
        store: IndexStore,
        load_vectorizer: Callable[[Manifest], Vectorizer] | None = None,
        *,
        reload_interval_s: float = 0.5,
        device: str | None = None,
        trust_remote_code: bool = False,
        quantize: str | None = None,
        threads: int | None = None,
    ) -> None:
        self.store = store
        self._load_vectorizer = load_vectorizer or (
            lambda m: vectorizer_for(
                m, device=device, trust_remote_code=trust_remote_code, quantize=quantize, threads=threads
            )
        )
        self.reload_interval_s = reload_interval_s
        self._indexes: dict[str, LoadedIndex] = {}
        self._models: dict[str, Vectorizer] = {}
        self._listing: Listing = []
        self._listed_at = float("-inf")
        self._list_lock = threading.Lock()
        self._load_lock = threading.Lock()

    # ------------------------------------------------------------ what is indexed

    def listing(self, *, fresh: bool = False) -> Listing:
        """Return the store's (name, manifest or error) pairs, re-read when older than the interval."""
        with self._list_lock:
            now = time.monotonic()
            if fresh or now - self._listed_at >= self.reload_interval_s:
                self._listing = self.store.manifests()
                self._listed_at = now
                self._forget_removed({name for name, _ in self._listing})
            return self._listing

    def _forget_removed(self, names: set[str]) -> None:
        # Indexes deleted from the store leave memory too; skipped while a load holds the lock.
        if not self._load_lock.acquire(blocking=False):
            return
        try:
            for name in [n for n in self._indexes if n not in names]:
                del self._indexes[name]
            self._drop_unused_models()
        finally:
            self._load_lock.release()

    def find(self, condition: str, corpus: str | None = None) -> tuple[str, Manifest]:
        """Return the (name, manifest) of the one index for condition (and corpus)."""
        listing = self.listing()
        matches = _matches(listing, condition, corpus)
        if not matches:  # an index added since the last listing is found without waiting
            listing = self.listing(fresh=True)
            matches = _matches(listing, condition, corpus)
        if len(matches) == 1:
            return matches[0]
        manifests = [m for _, m in listing if isinstance(m, Manifest)]
        if matches:
            corpora = sorted(m.corpus_name for _, m in matches)
            raise AmbiguousCondition(
                f"condition {condition!r} is indexed for several corpora ({', '.join(corpora)}); "
                'name one with "corpus"',
                corpora,
            )
        known = sorted({m.condition for m in manifests})
        where = f" for corpus {corpus!r}" if corpus is not None else ""
        listed = "; ".join(repr(c) for c in known) if known else "none"
        damaged = self.store.damaged_note(listing)  # a corrupt manifest is named, not taken for a missing index
        raise UnknownCondition(f"no index for condition {condition!r}{where}; indexed: {listed}{damaged}", known)

    # ------------------------------------------------------------ loading

    def get(self, condition: str, corpus: str | None = None) -> LoadedIndex:
        """Return the resident index for condition, loading or reloading it when its manifest changed."""
        name, manifest = self.find(condition, corpus)
        current = self._indexes.get(name)
        if current is not None and current.manifest == manifest:
            return current
        with self._load_lock:
            current = self._indexes.get(name)
            if current is not None and current.manifest == manifest:
                return current
            try:
                stored = self.store.load(name)  # checks the files against the manifest: never half an index
            except StoreError as exc:
                if current is not None:  # caught mid-replacement: keep answering from the previous one
                    log.warning("%s: keeping the loaded copy (%s)", name, first_line(exc))
                    return current
                raise
            key = vectorizer_key(stored.manifest)
            if key not in self._models:
                log.info("loading the model for %s", name)
                self._models[key] = self._load_vectorizer(stored.manifest)
            loaded = LoadedIndex(stored, to_search_device(stored.index), key)
            self._indexes[name] = loaded
            self._drop_unused_models()
            log.info("%s: %s (%d rows)", name, "reloaded" if current else "loaded", stored.manifest.n_vectors)
            return loaded

    def preload(self) -> None:
        """Load every readable index and its model now; one that fails is logged and left for later."""
        for _, m in self.listing(fresh=True):
            if isinstance(m, Manifest):
                try:
                    self.get(m.condition, m.corpus_name)
                except CondsearchError as exc:
                    log.warning("cannot preload %r: %s", m.condition, first_line(exc))

    def vectorizer(self, key: str) -> Vectorizer:
        """Return the loaded model an index refers to."""
        return self._models[key]

    def _drop_unused_models(self) -> None:
        used = {entry.model_key for entry in self._indexes.values()}
        for key in [k for k in self._models if k not in used]:
            del self._models[key]

    @property
    def n_indexes(self) -> int:
        return len(self._indexes)

    @property
    def n_models(self) -> int:
        return len(self._models)

    # ------------------------------------------------------------ answering

    def answer_batch(self, jobs: Sequence[QueryJob]) -> list[SearchResult | BaseException]:
        """Answer a batch: one forward pass per (model, condition), one search per index.

        Returns one SearchResult per job (scores, ids: (n_queries, job.k)), or the exception
        raised for it. A forward pass or search that fails for a group is tried again job by
        job, so a job that breaks the model fails alone.
        """
        answers: list[SearchResult | BaseException | None] = [None] * len(jobs)
        vectors: dict[int, np.ndarray] = {}
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        for j, job in enumerate(jobs):
            groups[(job.index.model_key, job.index.manifest.condition)].append(j)
        for (key, condition), members in groups.items():
            encode = partial(_encode, self.vectorizer(key), condition)
            for j, vecs in zip(members, _each_or_alone(encode, [jobs[j].queries for j in members]), strict=True):
                if isinstance(vecs, BaseException):
                    answers[j] = vecs
                else:
                    vectors[j] = vecs
        by_index: dict[int, list[int]] = defaultdict(list)
        for j in vectors:
            by_index[id(jobs[j].index)].append(j)
        for members in by_index.values():
            find = partial(_search, jobs[members[0]].index.searcher)
            for j, found in zip(members, _each_or_alone(find, [(vectors[j], jobs[j].k) for j in members]), strict=True):
                answers[j] = found
        return answers  # type: ignore[return-value]


def _encode(vectorizer: Vectorizer, condition: str, queries: list[tuple[str, ...]]) -> list[np.ndarray]:
    """Return each request's query vectors, encoded in one forward pass."""
    texts = [q for qs in queries for q in qs]
    vecs = vectorizer.vectors(texts, condition, batch_size=max(1, len(texts)))
    return np.split(vecs, np.cumsum([len(qs) for qs in queries])[:-1])


def _search(searcher: Any, requests: list[tuple[np.ndarray, int]]) -> list[SearchResult]:
    """Return each (query vectors, k) request's results, searched in one call."""
    found = search(searcher, np.concatenate([v for v, _ in requests]), max(k for _, k in requests))
    answers, start = [], 0
    for v, k in requests:
        answers.append(SearchResult(found.scores[start : start + len(v), :k], found.ids[start : start + len(v), :k]))
        start += len(v)
    return answers


P = TypeVar("P")
A = TypeVar("A")


def _each_or_alone(run: Callable[[list[P]], Sequence[A]], parts: list[P]) -> list[A | BaseException]:
    """Return run(parts), or where that raises, run([part]) for each part (its exception if it raises)."""
    try:
        return list(run(parts))
    except Exception as exc:  # noqa: BLE001 - reported to the callers whose part raises
        if len(parts) == 1:
            return [exc]
        log.warning("a batch of %d failed (%s); answering its requests one by one", len(parts), first_line(exc))
    answers: list[A | BaseException] = []
    for part in parts:
        try:
            answers.append(run([part])[0])
        except Exception as exc:  # noqa: BLE001
            answers.append(exc)
    return answers


def _matches(listing: Listing, condition: str, corpus: str | None) -> list[tuple[str, Manifest]]:
    return [
        (name, m)
        for name, m in listing
        if isinstance(m, Manifest) and m.condition == condition and (corpus is None or m.corpus_name == corpus)
    ]
