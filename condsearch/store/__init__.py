"""Where indexes live: the folder store, manifests, kept vectors, condition names and score backgrounds.

Holds the folder store and its FAISS adapter, manifests (with their field checks), kept vectors,
conditions in their normal form (``conditions``), the score background recorded with an index
(``background``), listings and a corpus's indexes (``listing``, ``lifecycle``). Atomic writes and file
digests are :mod:`condsearch.base`'s. Front door: the names below (:class:`IndexStore` first; a folder
or Milvus: :func:`condsearch.query.open_source`), each loaded on first use, so that importing this
package loads neither FAISS nor pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base.front_door import lazy_names

if TYPE_CHECKING:
    from condsearch.store.built_on_demand import mark_built_on_demand, on_demand_sizes
    from condsearch.store.conditions import check_condition, check_new_condition
    from condsearch.store.folder import IndexStore, index_name
    from condsearch.store.lifecycle import (
        CorpusBusy,
        CorpusInfo,
        UnknownCorpus,
        corpora,
        corpus_indexes,
        drop,
        match_ids,
        read_kept_columns,
        read_rows,
    )
    from condsearch.store.listing import Listing, condition_key, kept_index, kept_mode, refuse_case_variants
    from condsearch.store.manifest import Manifest
    from condsearch.store.searchable import FaissIndex

__all__ = [
    "CorpusBusy",
    "CorpusInfo",
    "FaissIndex",
    "IndexStore",
    "Listing",
    "Manifest",
    "UnknownCorpus",
    "check_condition",
    "check_new_condition",
    "condition_key",
    "corpora",
    "corpus_indexes",
    "drop",
    "index_name",
    "kept_index",
    "kept_mode",
    "mark_built_on_demand",
    "match_ids",
    "on_demand_sizes",
    "read_kept_columns",
    "read_rows",
    "refuse_case_variants",
]

#: public name -> the module of this package it is imported from, when first asked for (so importing stays
#: cheap). No name here is also a module's name: once that module is imported, the package attribute would be it.
_HOMES = {
    "CorpusBusy": "lifecycle",
    "CorpusInfo": "lifecycle",
    "FaissIndex": "searchable",
    "IndexStore": "folder",
    "Listing": "listing",
    "Manifest": "manifest",
    "UnknownCorpus": "lifecycle",
    "check_condition": "conditions",
    "check_new_condition": "conditions",
    "condition_key": "listing",
    "corpora": "lifecycle",
    "corpus_indexes": "lifecycle",
    "drop": "lifecycle",
    "index_name": "folder",
    "kept_index": "listing",
    "kept_mode": "listing",
    "mark_built_on_demand": "built_on_demand",
    "match_ids": "lifecycle",
    "on_demand_sizes": "built_on_demand",
    "read_kept_columns": "lifecycle",
    "read_rows": "lifecycle",
    "refuse_case_variants": "listing",
}


__getattr__ = lazy_names(__name__, _HOMES)
