"""Ingesting a corpus: encoding it under conditions in chunks, reusing kept vectors, resuming, publishing.

Holds one job, building a condition's index from a corpus (``chunks``); the FAISS primitives and the
approximate-index choice it uses live in :mod:`condsearch.base`. Front door: this package's names.
"""

from condsearch.ingest.chunks import BuildReport, build_condition_index, index_conditions, index_corpus

__all__ = ["BuildReport", "build_condition_index", "index_conditions", "index_corpus"]
