"""Past one machine: encoding on Ray Data (:mod:`.ray_encode`) and indexes in Milvus (:mod:`.milvus`).

Both are optional extras (``condsearch[ray]``, ``condsearch[milvus]``); nothing in the core imports
them, and each module imports its engine only when called, failing with one line when it is missing.
"""

from __future__ import annotations

from condsearch.errors import CondsearchError

#: how a store location names a Milvus Lite file and a Milvus server (:mod:`condsearch.query.sources`)
MILVUS_LITE = "milvus-lite:"
MILVUS_SERVER = "milvus://"


def missing_extra(package: str, extra: str) -> CondsearchError:
    """Return the one-line error for an optional engine that is not installed."""
    return CondsearchError(f"{package} is not installed: pip install 'condsearch[{extra}]'")
