"""What a reader searches: an index that answers query vectors, where readers find them, and the FAISS adapter.

:class:`Searchable` answers query vectors; :class:`IndexSource` is where a long-running reader finds
them; :class:`FaissIndex` is the folder store's adapter (a Milvus index answers in
:mod:`condsearch.scale.milvus`). :mod:`condsearch.query.search` answers queries through them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from condsearch.base.faiss_indexes import GPU_MAX_K, SearchResult, on_gpu, search, to_search_device
from condsearch.errors import StoreError, first_line
from condsearch.store.manifest import Manifest

if TYPE_CHECKING:
    from pathlib import Path

    import faiss


@dataclass(frozen=True)
class StoredIndex:
    """An index loaded from disk with its row ids and texts."""

    name: str
    manifest: Manifest
    index: faiss.Index
    ids: list[str | int]
    texts: list[str]


T = TypeVar("T", covariant=True)


class RowLookup(Protocol[T]):
    """Something indexed by row number: a list of every row's values, or a dict of the rows found."""

    def __getitem__(self, row: int, /) -> T: ...


@dataclass(frozen=True)
class Found:
    """One search's results: ``result`` (scores, rows: (n_queries, k), best first, -1 pads), the rows' ids and texts."""

    result: SearchResult
    ids: RowLookup[str | int]
    texts: RowLookup[str]


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
        return Found(result, self.stored.ids, self.stored.texts)
