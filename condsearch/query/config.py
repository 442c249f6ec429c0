"""How a query is answered when the asker says no more: the one home of its defaults.

`condsearch query`, the Python API (:meth:`condsearch.api.Store.search`) and the server
(:class:`condsearch.serve.config.ServeConfig`, for a request that names no k) read them here.
Free of imports beyond the standard library, so that the CLI reads it for --help cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueryConfig:
    """A query's settings that every front end shares."""

    #: results per query (every row when the index holds fewer)
    k: int = 10
