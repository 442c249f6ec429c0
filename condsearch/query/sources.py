"""Opening a store by its location, one way for every front end: a folder of FAISS indexes, or a Milvus database.

A location is a folder (:class:`condsearch.store.folder.IndexStore`), ``milvus-lite:PATH.db`` or
``milvus://HOST:PORT`` (:class:`condsearch.scale.milvus.MilvusStore`, searched only). Both list their
indexes and load one to search (:class:`condsearch.store.searchable.IndexSource`), so the server and
the Python API read either through :class:`condsearch.query.resident.Resident`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from condsearch.scale.extras import MILVUS_LITE, MILVUS_SERVER

if TYPE_CHECKING:
    from condsearch.store.searchable import IndexSource, Searchable


def is_milvus(location: str | Path | None) -> bool:
    """Return whether a location names a Milvus store rather than a folder."""
    return isinstance(location, str) and location.startswith((MILVUS_LITE, MILVUS_SERVER))


def open_source(location: str | Path | None) -> IndexSource:
    """Return the store a location names, to read: a Milvus store connected now, else the index folder.

    None is the default index folder (:func:`condsearch.defaults.default_index_dir`). A Milvus store
    that cannot be reached raises StoreError here, so that a long-running reader fails at its start.
    """
    if is_milvus(location):
        from condsearch.scale.milvus import open_store

        return open_store(str(location))
    from condsearch.store.folder import IndexStore

    return IndexStore(location)


@contextmanager
def open_index(
    location: str | Path | None, condition: str, corpus: str | None = None, *, corpus_option: str = "--corpus"
) -> Iterator[Searchable]:
    """Yield the index of condition (and corpus) in the store a location names, checked and ready to search.

    Found as every reader finds one (:func:`condsearch.store.listing.find_index`: UnknownCondition
    lists what is indexed, AmbiguousCondition names the corpora; ``corpus_option`` is how the caller
    names the corpus), loaded checked against its manifest; the store is closed after.
    """
    from condsearch.store.listing import find_index

    source = open_source(location)
    try:
        root = str(source.root)
        name, _ = find_index(source.manifests(), condition, corpus, where=root, root=root, corpus_option=corpus_option)
        yield source.load_searchable(name)
    finally:
        source.close()
