"""What the optional engines share: how a store location names Milvus, and the error for a missing extra."""

from __future__ import annotations

from condsearch.errors import CondsearchError

#: how a store location names a Milvus Lite file and a Milvus server (:mod:`condsearch.query.sources`)
MILVUS_LITE = "milvus-lite:"
MILVUS_SERVER = "milvus://"


def missing_extra(package: str, extra: str) -> CondsearchError:
    """Return the one-line error for an optional engine that is not installed."""
    return CondsearchError(f"{package} is not installed: pip install 'condsearch[{extra}]'")
