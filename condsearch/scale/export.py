"""Copying indexes from the FAISS folder into Milvus (``condsearch export``, ``index --store milvus…``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import faiss
import numpy as np

from condsearch.errors import StoreError
from condsearch.scale.milvus import MilvusIndex, MilvusStore, parse_store
from condsearch.store.folder import IndexStore


def export_indexes(store: IndexStore, names: Sequence[str], spec: str) -> Iterator[MilvusIndex]:
    """Push the named FAISS indexes to the Milvus that spec names, one at a time; yield where each went.

    The connection closes when the last is pushed, or when the caller stops early or raises.
    """
    target = parse_store(spec)
    if target is None:
        raise StoreError("no Milvus store named")
    milvus = MilvusStore(target)
    try:
        for name in names:
            yield export_index(store, name, milvus)
    finally:
        milvus.close()


def export_index(store: IndexStore, name: str, milvus: MilvusStore) -> MilvusIndex:
    """Push one FAISS index (its exact vectors, rows and manifest) to Milvus, replacing that condition's vectors.

    The vectors come from the ``vectors.npy`` kept beside the index (format 3), or from a Flat
    index itself; an older approximate index has no exact vectors to copy and is refused.
    """
    stored = store.load(name)
    kept = store.kept_vectors(name)
    try:
        if kept is not None and kept.ids == stored.ids and kept.manifest == stored.manifest:
            return milvus.write(stored.manifest, stored.ids, stored.texts, kept.vectors)
    finally:
        if kept is not None:
            kept.vectors.close()
    flat = faiss.downcast_index(stored.index)
    if not isinstance(flat, faiss.IndexFlat):
        raise StoreError(
            f"{store.root / name}: a {stored.manifest.factory} index without kept vectors; index it again to export it"
        )
    vectors = flat.reconstruct_n(0, flat.ntotal).astype(np.float32)
    return milvus.write(stored.manifest, stored.ids, stored.texts, vectors)
