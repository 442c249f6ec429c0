"""An index's rows: ids, texts, text hashes and kept columns, and the vectors kept beside them.

Re-indexing compares the text hashes.

The rows file holds ``id``, ``text`` and ``text_hash``, then the columns of the corpus that ``index`` keeps
(``--keep-columns``, issue 59), in their own types; query filters (``--where``) read those.
"""

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


#: the rows file's own columns; a corpus column of one of these names is not kept beside them
ROW_COLUMNS = ("id", "text", "text_hash")


def rows_table(
    ids: list[str | int],
    texts: list[str],
    metadata: pa.Table | None = None,
    hashes: list[bytes] | None = None,
) -> pa.Table:
    """Return an index's rows: id, text, the text's hash (which re-indexing compares), then the kept columns."""
    digests = pa.array(hashes if hashes is not None else [text_hash(t) for t in texts], type=pa.binary(16))
    table = pa.table({"id": ids, "text": texts, "text_hash": digests})
    if metadata is not None:
        for name, column in zip(metadata.column_names, metadata.columns, strict=True):
            table = table.append_column(name, column)
    return table


def kept_columns(rows: pa.Table) -> pa.Table:
    """Return a rows table's kept columns (all but :data:`ROW_COLUMNS`), row i for row i."""
    return rows.drop_columns([c for c in ROW_COLUMNS if c in rows.column_names])


def write_rows(path: Path, ids: list[str | int], texts: list[str], metadata: pa.Table | None = None) -> None:
    """Write an index's rows file (:func:`rows_table`)."""
    pq.write_table(rows_table(ids, texts, metadata), path)
