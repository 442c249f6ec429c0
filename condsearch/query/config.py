"""How a query is answered when the asker says no more: the one home of its defaults.

`condsearch query`, the Python API (:meth:`condsearch.api.Store.search`), the server
(:class:`condsearch.serve.config.ServeConfig`, for a request that names no k) and the loaded indexes
(:class:`condsearch.query.resident.Resident`, how long they stay) read them here.
Free of imports beyond the standard library, so that the CLI reads it for --help cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueryConfig:
    """A query's settings that every front end shares."""

    #: results per query (every row when the index holds fewer)
    k: int = 10
    #: how often resident indexes' store listing is re-read to notice replaced, added or removed ones (seconds)
    reload_interval_s: float = 0.5
    #: indexes kept loaded at most; past it the least recently used is dropped (loaded again when asked for)
    max_resident_indexes: int = 256
    #: a filtered search (--where) ranks up to this many allowed rows exhaustively on an HNSW or IVF index (exact,
    #: about as fast as a graph search at this size); more are searched through the index with FAISS's selector
    #: (approximate). Flat, SQ and PQ are always exact (past it, Flat and SQ scan every row with the selector)
    exact_filter_rows: int = 8192
    #: past exact_filter_rows, that search goes wider by 1/(share of rows allowed), at most this many times:
    #: HNSW's efSearch and IVF's nprobe, so filtered recall stays about the unfiltered search's (measured in
    #: benchmarks/systems/filtered.py; 1 searches as unfiltered)
    filter_widen_max: float = 32.0
