"""Ingesting a corpus: encoding it under conditions in chunks, reusing kept vectors, resuming, publishing.

Holds one job, building a condition's index from a corpus (``chunks``); the FAISS primitives and the
approximate-index choice it uses live in :mod:`condsearch.base`. Front door: this package's names,
each loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from condsearch.ingest.chunks import BuildReport, build_condition_index, index_conditions, index_corpus

__all__ = ["BuildReport", "build_condition_index", "index_conditions", "index_corpus"]


def __getattr__(name: str) -> Any:
    # looked up on each use, not bound once: importing stays cheap, and what a test replaces in chunks is what runs
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.chunks"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
