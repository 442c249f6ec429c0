"""What a reader searches: an index that answers query vectors, where readers find them, and the FAISS adapter.

:class:`Searchable` answers query vectors; :class:`IndexSource` is where a long-running reader finds
them; :class:`FaissIndex` is the folder store's adapter (a Milvus index answers in
:mod:`condsearch.scale.milvus`). :mod:`condsearch.query.search` answers queries through them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from condsearch.base.faiss_indexes import GPU_MAX_K, SearchResult, on_gpu, search, to_search_device
from condsearch.errors import StoreError, first_line
from condsearch.store.manifest import Manifest

if TYPE_CHECKING:
    from pathlib import Path

    import faiss
    import pyarrow as pa


@dataclass(frozen=True)
class StoredIndex:
    """An index loaded from disk with its row ids and texts, and the corpus's columns it keeps (issue 59)."""

    name: str
    manifest: Manifest
    index: faiss.Index
    ids: list[str | int]
    texts: list[str]
    #: the kept columns, row i for row i (none: an index that keeps none, or one written before issue 59)
    metadata: pa.Table | None = None

    @functools.cached_property
    def filter_table(self) -> pa.Table:
        """Return what a filter may name: the kept columns, then ``id`` (made once per loaded index)."""
        import pyarrow as pa

        kept = self.metadata if self.metadata is not None else pa.table({})
        columns = dict(zip(kept.column_names, kept.columns, strict=True))
        return pa.table({**columns, "id": pa.array(self.ids)})


T = TypeVar("T", covariant=True)


class RowLookup(Protocol[T]):
    """Something indexed by row number: a list of every row's values, or a dict of the rows found."""

    def __getitem__(self, row: int, /) -> T: ...


@dataclass(frozen=True)
class Found:
    """One search's results: ``result`` (scores, rows: (n_queries, k), best first, -1 pads), the rows' ids, texts and
    kept columns."""

    result: SearchResult
    ids: RowLookup[str | int]
    texts: RowLookup[str]
    #: the kept columns of every row (row i for row i), None where the index keeps none
    metadata: pa.Table | None = None


class Searchable(Protocol):
    """An index that answers query vectors: its manifest, and the k best rows for (n, dim) unit vectors."""

    @property
    def manifest(self) -> Manifest: ...

    def search(self, vectors: np.ndarray, k: int) -> Found: ...


class IndexSource(Protocol):
    """Where a long-running reader (the server, the Python API) finds indexes: a FAISS folder
    (:class:`~condsearch.store.folder.IndexStore`) or a Milvus database
    (:class:`~condsearch.scale.milvus.MilvusStore`)."""

    @property
    def root(self) -> Path | str:
        """Return where the indexes are (a folder, or a --store value), stripped from the listing's errors."""
        ...

    def manifests(self) -> list[tuple[str, Manifest | StoreError]]:
        """Return each index's (name, manifest), or the error that stops it from loading."""
        ...

    def load_searchable(self, name: str) -> Searchable:
        """Return the named index checked against its manifest, ready to search (StoreError if it cannot be)."""
        ...

    def close(self) -> None:
        """Release what the source holds open (a connection); a folder holds nothing."""
        ...


@dataclass(frozen=True)
class FaissIndex:
    """A FAISS index from the store, searched through ``searcher`` (the index itself, or its copy on a GPU)."""

    stored: StoredIndex
    searcher: Any  # faiss.Index or index.TorchFlatIndex

    @classmethod
    def of(cls, stored: StoredIndex, *, on_device: bool = True) -> FaissIndex:
        """Return stored searched on the GPU where there is one; ``on_device=False`` keeps it on the CPU (no torch)."""
        return cls(stored, to_search_device(stored.index) if on_device else stored.index)

    @property
    def manifest(self) -> Manifest:
        return self.stored.manifest

    def search(self, vectors: np.ndarray, k: int) -> Found:
        # FAISS's GPU indexes select at most GPU_MAX_K rows; a larger k searches the CPU copy, as exact
        searcher = self.stored.index if k > GPU_MAX_K and on_gpu(self.searcher) else self.searcher
        try:
            result = search(searcher, vectors, k)
        except RuntimeError as exc:  # FAISS's own errors are C++ assertions several lines long
            raise StoreError(f"cannot search the index for {self.manifest.condition!r}: {first_line(exc)}") from exc
        return Found(result, self.stored.ids, self.stored.texts, self._metadata)

    @property
    def _metadata(self) -> pa.Table | None:
        kept = self.stored.metadata
        return kept if kept is not None and kept.num_columns else None

    def filter_table(self) -> pa.Table:
        """Return the columns a filter may name (:attr:`StoredIndex.filter_table`)."""
        return self.stored.filter_table

    def search_among(
        self, vectors: np.ndarray, k: int, allowed: np.ndarray, exact_rows: int, *, widen_max: float
    ) -> Found:
        """Return the k best of the allowed rows (sorted positions) for each query: filtered before ranking.

        Searched on the CPU copy (:func:`condsearch.base.filtered_search.search_allowed`, which says how per index
        type); ``exact_rows``: up to this many allowed rows are ranked exhaustively by an approximate index, whose
        search of more is widened at most ``widen_max`` times.
        """
        from condsearch.base.filtered_search import search_allowed

        try:
            result, _ = search_allowed(self.stored.index, vectors, k, allowed, exact_rows, widen_max=widen_max)
        except RuntimeError as exc:
            raise StoreError(f"cannot search the index for {self.manifest.condition!r}: {first_line(exc)}") from exc
        return Found(result, self.stored.ids, self.stored.texts, self._metadata)
