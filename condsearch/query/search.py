"""One query path for every front end (CLI, server, Python, Milvus): answer queries from an index.

:func:`condsearch.store.listing.find_index` picks an index by condition (and corpus) from a store's listing;
:func:`answer` checks the queries and k, caps k at the index's rows, encodes and searches, and
names the hits. :func:`answer_batch` is the same for several requests at once (the server's
micro-batches): one forward pass per (model, condition) and one search per index. Any index
that returns a :class:`Found` for query vectors answers through it (:class:`Searchable`): a FAISS
index (:class:`condsearch.store.searchable.FaissIndex`), a Milvus one in :mod:`condsearch.scale.milvus`; a
server finds them in an :class:`~condsearch.store.searchable.IndexSource`, a folder or a Milvus database.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

import numpy as np
import pyarrow as pa

from condsearch.base.faiss_indexes import SearchResult
from condsearch.errors import CondsearchError, FilterError, first_line
from condsearch.query.calibration import Background
from condsearch.query.config import QueryConfig
from condsearch.query.hits import Hit, Hits
from condsearch.store.manifest import Manifest
from condsearch.store.searchable import FaissIndex, Found, Searchable

if TYPE_CHECKING:
    from condsearch.model.vectorizer import Vectorizer
    from condsearch.store.searchable import StoredIndex

log = logging.getLogger(__name__)


#: keys computed lately, by the manifest object they were computed for (a store's listing keeps its manifests)
_KEYS: dict[int, tuple[Manifest, str]] = {}
_KEPT_KEYS = 1 << 16


def vectorizer_key(manifest: Manifest) -> str:
    """Return what identifies the model an index needs: indexes with equal keys can share one loaded copy.

    Kept per manifest object: a server choosing a model among 3,000 indexes asks for every one's, per request.
    """
    kept = _KEYS.get(id(manifest))
    if kept is not None and kept[0] is manifest:
        return kept[1]
    from condsearch.model.identity import ModelIdentity

    key = ModelIdentity.of_manifest(manifest).key
    if len(_KEYS) >= _KEPT_KEYS:
        _KEYS.clear()
    _KEYS[id(manifest)] = (manifest, key)
    return key


# ------------------------------------------------------------------ answering


def capped_k(k: int, n_rows: int) -> int:
    """Return the k a search can honour: every row when k is larger than the index (as
    sentence-transformers' ``semantic_search`` does), never an error."""
    return max(0, min(k, n_rows))


def k_notice(k: int, n_rows: int) -> str | None:
    """Return the one-line notice for a k larger than the index, or None."""
    if k <= n_rows:
        return None
    return f"k={k} is larger than the index ({n_rows} rows); returning all {n_rows}"


def check_request(queries: Sequence[str], k: int) -> None:
    """Refuse a k below 1 and an empty or blank query, in one line."""
    if k <= 0:
        raise CondsearchError(f"k must be positive, got {k}")
    if any(not q.strip() for q in queries):
        raise CondsearchError("a query is empty")


@dataclass(frozen=True)
class Request:
    """Queries for one index under its condition, k results each, encoded by vectorizer.

    ``allowed``: the row positions a filter keeps (:func:`filter_rows`); only those are ranked. None: every row.
    """

    index: Searchable
    vectorizer: Vectorizer
    queries: tuple[str, ...]
    k: int
    allowed: np.ndarray | None = None


class Filterable(Protocol):
    """An index whose rows a filter can pick (a folder store's, :class:`~condsearch.store.searchable.FaissIndex`)."""

    def filter_table(self) -> pa.Table: ...

    def search_among(
        self, vectors: np.ndarray, k: int, allowed: np.ndarray, exact_rows: int, *, widen_max: float
    ) -> Found: ...


def filterable(index: Searchable) -> Filterable:
    """Return the index a filter applies to (a resident index's own), refusing one that keeps no columns (Milvus)."""
    inner = getattr(index, "index", index)  # a resident index (LoadedIndex) wraps the one it searches
    if not (hasattr(inner, "filter_table") and hasattr(inner, "search_among")):
        raise FilterError("filters apply to the indexes of a folder store, not to a Milvus one")
    return cast("Filterable", inner)


def filter_rows(index: Searchable, where: str | None) -> np.ndarray | None:
    """Return the row positions of index that the filter ``where`` keeps (None for no filter); refuse it in one line.

    A filter that keeps no row is no error: its queries find nothing.
    """
    if where is None:
        return None
    from condsearch.query.filters import allowed_rows, parse_where

    parsed = parse_where(where)  # the syntax first, before the index is looked at
    return allowed_rows(parsed, filterable(index).filter_table())


@dataclass(frozen=True)
class Answer:
    """One request's results: ``found`` holds (n_queries, k) scores and rows, k capped at the index's rows."""

    queries: tuple[str, ...]
    condition: str
    found: Found
    k_requested: int
    n_rows: int
    #: the index's recorded background, where the hits are calibrated (:mod:`condsearch.query.calibration`)
    background: Background | None = None

    @property
    def result(self) -> SearchResult:
        """Return the batched scores and row numbers: (n_queries, k) each, -1 where an index found fewer."""
        return self.found.result

    @property
    def notice(self) -> str | None:
        """Return the one-line notice when k was larger than the index, else None."""
        return k_notice(self.k_requested, self.n_rows)

    @property
    def hits(self) -> list[Hits]:
        """Return each query's hits, best first."""
        found, out = self.found, []
        kept = found.metadata
        columns = tuple(kept.column_names) if kept is not None else ()
        for q, scores, rows in zip(self.queries, found.result.scores.tolist(), found.result.ids.tolist(), strict=True):
            pairs = [(s, r) for s, r in zip(scores, rows, strict=True) if r >= 0]
            at = pa.array([r for _, r in pairs], type=pa.int64())
            metadata = kept.take(at).to_pylist() if kept is not None else [{}] * len(pairs)
            named = tuple(
                Hit(found.ids[r], s, found.texts[r], r, metadata=m, rank=place)
                for place, ((s, r), m) in enumerate(zip(pairs, metadata, strict=True), start=1)
            )
            hits = Hits(q, self.condition, named, metadata_columns=columns)
            out.append(self.background.calibrate(hits) if self.background is not None else hits)
        return out


def answer(
    index: Searchable,
    vectorizer: Vectorizer,
    queries: Sequence[str],
    k: int,
    *,
    one_pass: bool = False,
    calibrated: bool = False,
    where: str | None = None,
) -> Answer:
    """Rank the index's rows for each query under its condition; k larger than the index returns every row.

    Raises CondsearchError for a k below 1 or an empty query. ``one_pass`` encodes every query in one
    forward pass; otherwise in the vectorizer's batches. ``calibrated``: each hit also gets its score's
    standard score against the index's recorded background; an index that records none is refused
    (CondsearchError naming the fix) before anything is encoded. ``where``: a filter on the index's kept
    columns (:mod:`condsearch.query.filters`); only the rows it keeps are ranked, and a bad one is refused
    (:class:`~condsearch.errors.FilterError`) before anything is encoded.
    """
    background = Background.of(index.manifest) if calibrated else None
    allowed = filter_rows(index, where)
    [got] = answer_batch([Request(index, vectorizer, tuple(queries), k, allowed)], one_pass=one_pass)
    if isinstance(got, BaseException):
        raise got
    return replace(got, background=background)


def answer_batch(requests: Sequence[Request], *, one_pass: bool = False) -> list[Answer | BaseException]:
    """Answer several requests: one forward pass per (vectorizer, condition), one search per index.

    Returns one Answer per request, or the exception raised for it: a request that is refused
    (:func:`check_request`) or that breaks the model fails alone, since a group whose encoding or
    search raises is tried again request by request.
    """
    answers: list[Answer | BaseException | None] = [None] * len(requests)
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for j, req in enumerate(requests):
        try:
            check_request(req.queries, req.k)
        except CondsearchError as exc:
            answers[j] = exc
            continue
        if not req.queries:
            nothing = SearchResult(np.zeros((0, 0), np.float32), np.zeros((0, 0), np.int64))
            answers[j] = _answer(req, Found(nothing, [], []))
            continue
        groups[(id(req.vectorizer), req.index.manifest.condition)].append(j)
    vectors: dict[int, np.ndarray] = {}
    for (_, condition), members in groups.items():
        encode = partial(_encode, requests[members[0]].vectorizer, condition, one_pass=one_pass)
        for j, vecs in zip(members, _each_or_alone(encode, [requests[j].queries for j in members]), strict=True):
            if isinstance(vecs, BaseException):
                answers[j] = vecs
            else:
                vectors[j] = vecs
    by_index: dict[tuple[int, int], list[int]] = defaultdict(list)
    for j in vectors:  # one search per index and filter (the parts of one request share its allowed rows)
        by_index[(id(requests[j].index), id(requests[j].allowed))].append(j)
    for members in by_index.values():
        index, allowed = requests[members[0]].index, requests[members[0]].allowed
        parts = [(vectors[j], capped_k(requests[j].k, index.manifest.n_vectors)) for j in members]
        for j, found in zip(members, _each_or_alone(partial(_search, index, allowed), parts), strict=True):
            answers[j] = found if isinstance(found, BaseException) else _answer(requests[j], found)
    return answers  # type: ignore[return-value]


def _answer(request: Request, found: Found) -> Answer:
    m = request.index.manifest
    return Answer(request.queries, m.condition, found, request.k, m.n_vectors)


def _encode(
    vectorizer: Vectorizer, condition: str, queries: list[tuple[str, ...]], *, one_pass: bool
) -> list[np.ndarray]:
    """Return each request's query vectors, encoded together."""
    texts = [q for qs in queries for q in qs]
    if one_pass:
        vecs = vectorizer.encode(texts, condition, batch_size=max(1, len(texts)))
    else:
        vecs = vectorizer.encode(texts, condition)
    return np.split(vecs, np.cumsum([len(qs) for qs in queries])[:-1])


def _search(index: Searchable, allowed: np.ndarray | None, requests: list[tuple[np.ndarray, int]]) -> list[Found]:
    """Return each (query vectors, k) request's results, searched in one call (among the allowed rows only)."""
    vectors, k_most = np.concatenate([v for v, _ in requests]), max(k for _, k in requests)
    if allowed is None:
        found = index.search(vectors, k_most)
    else:
        found = filterable(index).search_among(
            vectors, k_most, allowed, QueryConfig.exact_filter_rows, widen_max=QueryConfig.filter_widen_max
        )
    scores, rows = found.result.scores, found.result.ids
    answers, start = [], 0
    for v, k in requests:
        stop = start + len(v)
        part = SearchResult(scores[start:stop, :k], rows[start:stop, :k])
        answers.append(Found(part, found.ids, found.texts, found.metadata))
        start = stop
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


def query_index(
    stored: StoredIndex, vectorizer: Vectorizer, queries: Sequence[str], k: int, *, on_device: bool = True
) -> SearchResult:
    """Rank the stored rows for each query under the index's condition, as :func:`answer` does.

    Returns the batched arrays: scores, ids (n_queries, min(k, rows)), ids being row numbers. A k
    larger than the index returns every row. ``on_device``: search on the GPU where there is one;
    False searches the index where it is (the CPU), without importing torch to ask.
    """
    return answer(FaissIndex.of(stored, on_device=on_device), vectorizer, queries, k).result
