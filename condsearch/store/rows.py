"""An index's rows: ids, texts and text hashes (which re-indexing compares), and the vectors kept beside them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from condsearch.store.manifest import Manifest
from condsearch.store.vectors import VectorFile, text_hash


@dataclass(frozen=True)
class KeptVectors:
    """The vectors kept beside an index, with the ids and text hashes of their rows (row i ↔ vector i)."""

    manifest: Manifest
    ids: list[str | int]
    hashes: list[bytes]
    vectors: VectorFile


def rows_table(ids: list[str | int], texts: list[str]) -> pa.Table:
    """Return an index's rows: id, text and the text's hash (which re-indexing compares)."""
    hashes = pa.array([text_hash(t) for t in texts], type=pa.binary(16))
    return pa.table({"id": ids, "text": texts, "text_hash": hashes})


def write_rows(path: Path, ids: list[str | int], texts: list[str]) -> None:
    """Write an index's rows file (:func:`rows_table`)."""
    pq.write_table(rows_table(ids, texts), path)
