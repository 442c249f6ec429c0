"""Answering a query: search, hits and their JSON, calibration, builds on demand, the loaded-index cache.

Holds search over an index, hits and their JSON, calibration, indexes built on demand, opening a
store by its location (``sources``) and the loaded-model-and-index cache (``resident``). Front door:
the names below (:func:`answer` first), each loaded on first use, so that importing this package
loads neither torch nor FAISS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base.front_door import lazy_names

if TYPE_CHECKING:
    from condsearch.query.as_json import index_summary, query_answer
    from condsearch.query.calibration import Background
    from condsearch.query.config import QueryConfig
    from condsearch.query.hits import Hit, Hits
    from condsearch.query.on_demand import OnDemand, build_on_demand, plan_on_demand
    from condsearch.query.resident import LoadedIndex, QueryJob, Resident, split_job
    from condsearch.query.search import Answer, answer, filter_rows, vectorizer_key
    from condsearch.query.sources import is_milvus, open_index, open_source
    from condsearch.query.tokens import estimate_tokens

__all__ = [
    "Answer",
    "Background",
    "Hit",
    "Hits",
    "LoadedIndex",
    "OnDemand",
    "QueryConfig",
    "QueryJob",
    "Resident",
    "answer",
    "build_on_demand",
    "estimate_tokens",
    "filter_rows",
    "index_summary",
    "is_milvus",
    "open_index",
    "open_source",
    "plan_on_demand",
    "query_answer",
    "split_job",
    "vectorizer_key",
]

#: public name -> the module of this package it is imported from, when first asked for (so importing stays cheap)
_HOMES = {
    "Answer": "search",
    "Background": "calibration",
    "Hit": "hits",
    "Hits": "hits",
    "LoadedIndex": "resident",
    "OnDemand": "on_demand",
    "QueryConfig": "config",
    "QueryJob": "resident",
    "Resident": "resident",
    "answer": "search",
    "build_on_demand": "on_demand",
    "estimate_tokens": "tokens",
    "filter_rows": "search",
    "index_summary": "as_json",
    "is_milvus": "sources",
    "open_index": "sources",
    "open_source": "sources",
    "plan_on_demand": "on_demand",
    "query_answer": "as_json",
    "split_job": "resident",
    "vectorizer_key": "search",
}


__getattr__ = lazy_names(__name__, _HOMES)
