"""Reading corpora: a parquet file with a text column and an optional id column."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from condsearch.errors import CorpusError, first_line


@dataclass(frozen=True)
class Corpus:
    """Texts to index with their ids, and what was skipped on the way in."""

    ids: list[str | int]
    texts: list[str]
    path: str
    checksum: str
    n_skipped: int = 0

    def __len__(self) -> int:
        return len(self.texts)


def file_checksum(path: Path) -> str:
    """Return the sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_corpus(path: Path | str, text_column: str = "text", id_column: str | None = None) -> Corpus:
    """Read a parquet corpus; skip null or blank texts; refuse duplicate ids.

    Without ``id_column``, an ``id`` column is used when present, else the row number.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorpusError(f"{path}: not a readable parquet file ({first_line(exc)})") from exc
    columns = table.column_names
    if text_column not in columns:
        raise CorpusError(f"{path}: no column {text_column!r}; columns are {', '.join(columns)}")
    if id_column is not None and id_column not in columns:
        raise CorpusError(f"{path}: no column {id_column!r}; columns are {', '.join(columns)}")
    if id_column is None and "id" in columns and text_column != "id":
        id_column = "id"
    texts = table.column(text_column).to_pylist()
    if table.num_rows and not all(t is None or isinstance(t, str) for t in texts):
        raise CorpusError(f"{path}: column {text_column!r} does not hold strings")
    raw_ids = table.column(id_column).to_pylist() if id_column else list(range(table.num_rows))
    ids: list[str | int] = []
    kept: list[str] = []
    for i, t in zip(raw_ids, texts, strict=True):
        if t is None or not t.strip():
            continue
        if i is None:
            raise CorpusError(f"{path}: column {id_column!r} has null ids")
        ids.append(i)
        kept.append(t)
    if not kept:
        raise CorpusError(f"{path}: no non-empty texts in column {text_column!r}")
    if len(set(ids)) != len(ids):
        dup = _first_duplicate(ids)
        raise CorpusError(f"{path}: duplicate id {dup!r} in column {id_column!r}")
    return Corpus(ids, kept, str(path.resolve()), file_checksum(path), len(texts) - len(kept))


def _first_duplicate(ids: list[str | int]) -> str | int:
    seen: set[str | int] = set()
    for i in ids:
        if i in seen:
            return i
        seen.add(i)
    raise AssertionError("no duplicate")
