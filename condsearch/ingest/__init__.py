"""Ingesting a corpus: encoding it under conditions in chunks, reusing kept vectors, resuming, publishing.

Holds two jobs, building a condition's index from a corpus (``chunks``) and changing a corpus's rows by id
in every index of it (``changes``); the FAISS primitives and the
approximate-index choice it uses live in :mod:`condsearch.base`. Front door: this package's names,
each loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base.front_door import lazy_names

if TYPE_CHECKING:
    from condsearch.ingest.changes import ChangeReport, change_corpus
    from condsearch.ingest.chunks import BuildReport, build_condition_index, index_conditions, index_corpus

#: each name and the module that holds it
_HOMES = {
    "BuildReport": "chunks",
    "build_condition_index": "chunks",
    "index_conditions": "chunks",
    "index_corpus": "chunks",
    "ChangeReport": "changes",
    "change_corpus": "changes",
}
__all__ = ["BuildReport", "ChangeReport", "build_condition_index", "change_corpus", "index_conditions", "index_corpus"]


__getattr__ = lazy_names(__name__, _HOMES)
