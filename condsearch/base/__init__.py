"""The bottom layer: files, digests, atomic writes, model sources, caches, FAISS primitives, CPU kinds.

Holds what every other package stands on and nothing that knows about indexes, models or front ends:
regular-file checks (``regular_files``), atomic writes and replacements (``atomic``), cached file
digests (``file_digest``), trained artifacts' file names and checked reads (``artifact_files``), where a
model's files come from (``model_sources``), the on-disk embedding cache (``output_cache``), the CPU's
kind (``cpu_kind``), and FAISS: the approximate-index choice (``ann``) and index primitives
(``faiss_indexes``); and the packages' front doors' lazy names (``front_door``). It imports only the
standard library, NumPy, FAISS and the top-level leaf modules
(``errors``, ``defaults``, ``progress``, ``version``); docs/architecture.md says what sits above it.
Front door: the names below (what the front ends read: the default model, index options, memory
sizes, checked file opens), each loaded on first use, so that importing this package loads no FAISS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base.front_door import lazy_names

if TYPE_CHECKING:
    from condsearch.base.ann import IndexConfig, check_index_options, parse_memory
    from condsearch.base.atomic import check_artifact_outputs, open_regular
    from condsearch.base.faiss_indexes import DEFAULT_SEARCH_THREADS, WALK_SEARCH_THREADS
    from condsearch.base.model_sources import DEFAULT_MODEL
    from condsearch.base.regular_files import check_regular_file

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_SEARCH_THREADS",
    "WALK_SEARCH_THREADS",
    "IndexConfig",
    "check_artifact_outputs",
    "check_index_options",
    "check_regular_file",
    "lazy_names",
    "open_regular",
    "parse_memory",
]

#: public name -> the module of this package it is imported from, when first asked for (so importing stays cheap;
#: lazy_names, which every front door uses, is imported above)
_HOMES = {
    "DEFAULT_MODEL": "model_sources",
    "DEFAULT_SEARCH_THREADS": "faiss_indexes",
    "WALK_SEARCH_THREADS": "faiss_indexes",
    "IndexConfig": "ann",
    "check_artifact_outputs": "atomic",
    "check_index_options": "ann",
    "check_regular_file": "regular_files",
    "open_regular": "atomic",
    "parse_memory": "ann",
}


__getattr__ = lazy_names(__name__, _HOMES)
