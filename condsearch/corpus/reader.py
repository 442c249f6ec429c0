"""Reading corpora: a file (parquet, CSV, JSON lines) or a table with a text column and an optional id column.

:func:`read_corpus` loads a file whole; :func:`scan_corpus` checks one in a streaming pass and
returns a :class:`CorpusFile` that is read again in record batches, so that a corpus of
millions of rows is never held in memory. :func:`table_corpus` checks a pyarrow table the same way,
and :mod:`condsearch.corpus.memory` turns Python lists and DataFrames into one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from condsearch.base.regular_files import check_regular_file
from condsearch.corpus.formats import (
    CorpusConfig,
    CorpusFormat,
    format_of,
    read_schema,
    read_table,
    record_batches,
)
from condsearch.errors import CorpusError


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

    def batches(self, rows: int) -> Iterator[tuple[list[str | int], list[str]]]:
        """Yield (ids, texts) of consecutive rows, ``rows`` at a time (the last batch may be shorter)."""
        for start in range(0, len(self.texts), rows):
            yield self.ids[start : start + rows], self.texts[start : start + rows]


#: what an id column may hold: ids come back in ``query --json`` and the server's answers, so only
#: types that JSON carries exactly (floats are not: NaN is no JSON, and NaN != NaN passes a duplicate check)
ID_TYPES = "strings or integers"
#: integer ids beyond the signed 64-bit range cannot be stored in the index's rows file
_ID_MAX = (1 << 63) - 1
_ID_MIN = -(1 << 63)
#: an integer as Python writes one: only such a CSV id reads back as an integer and prints as written
_PLAIN_INTEGER = re.compile(r"0|-?[1-9][0-9]{0,18}")  # not "-0", "007", "+7" or " 7"


def in_id_range(i: int) -> bool:
    """Return whether an integer id fits the signed 64-bit range that ids are kept in."""
    return _ID_MIN <= i <= _ID_MAX


def is_plain_integer(text: str) -> bool:
    """Return whether a CSV id is an integer written plainly within the signed 64-bit range ('7', '-12'; not '007')."""
    return _PLAIN_INTEGER.fullmatch(text) is not None and in_id_range(int(text))


def _plain(kind: pa.DataType) -> pa.DataType:
    """Return a dictionary type's value type (pandas' `category`), any other type itself."""
    return kind.value_type if pa.types.is_dictionary(kind) else kind


def _is_text(kind: pa.DataType) -> bool:
    kind = _plain(kind)
    is_view = getattr(pa.types, "is_string_view", None)  # pyarrow 16 and later
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or (is_view is not None and is_view(kind))
        or pa.types.is_null(kind)
    )


def _check_columns(path: Path | str, schema: pa.Schema, text_column: str, id_column: str | None) -> None:
    """Refuse a text column of other than strings and an id column of other than strings or integers, by type."""
    if not _is_text(schema.field(text_column).type):
        raise CorpusError(f"{path}: column {text_column!r} does not hold strings")
    if id_column is None:
        return
    kind = schema.field(id_column).type
    plain = _plain(kind)
    if not (pa.types.is_integer(plain) or (_is_text(plain) and not pa.types.is_null(plain))):
        raise CorpusError(f"{path}: column {id_column!r} holds {kind}; ids must be {ID_TYPES}")


def _check_id(path: Path | str, id_column: str | None, i: object) -> None:
    """Refuse a null id, and an integer id outside the signed 64-bit range (a uint64 column's)."""
    if i is None:
        raise CorpusError(f"{path}: column {id_column!r} has null ids")
    if isinstance(i, int) and i > _ID_MAX:
        raise CorpusError(f"{path}: id {i} in column {id_column!r} is beyond the signed 64-bit range ids are kept in")


@dataclass(frozen=True)
class CorpusFile:
    """A corpus file checked by :func:`scan_corpus` and read again batch by batch."""

    path: str
    checksum: str
    text_column: str
    id_column: str | None
    n_rows: int  # rows kept (non-blank texts)
    n_skipped: int = 0
    format: CorpusFormat = "parquet"
    #: a CSV id column whose every kept id is a plain integer: read as integers
    integer_ids: bool = False

    def __len__(self) -> int:
        return self.n_rows

    def batches(self, rows: int) -> Iterator[tuple[list[str | int], list[str]]]:
        """Yield (ids, texts) of the kept rows in file order, exactly ``rows`` per batch but the last."""
        ids: list[str | int] = []
        texts: list[str] = []
        offset = 0
        for raw_ids, raw_texts in _record_batches(Path(self.path), self.format, self.text_column, self.id_column):
            numbers = raw_ids if raw_ids is not None else range(offset, offset + len(raw_texts))
            for i, t in zip(numbers, raw_texts, strict=True):
                if t is not None and t.strip():
                    ids.append(int(i) if self.integer_ids else i)  # type: ignore[arg-type]  # str ids, checked
                    texts.append(t)
            offset += len(raw_texts)
            while len(texts) >= rows:
                yield ids[:rows], texts[:rows]
                del ids[:rows], texts[:rows]
        if texts:
            yield ids, texts


def _record_batches(
    path: Path, fmt: CorpusFormat, text_column: str, id_column: str | None, *, prescan: bool = True
) -> Iterator[tuple[list[str | int] | None, list[str | None]]]:
    """Yield (ids or None, texts) per record batch."""
    columns = [text_column] if id_column is None else [text_column, id_column]
    for batch in record_batches(path, fmt, columns, prescan=prescan):
        texts = _values(path, batch, text_column)
        yield (_values(path, batch, id_column) if id_column else None), texts


def _values(where: Path | str, data: pa.Table | pa.RecordBatch, column: str) -> list:
    """Return a column's values, refusing strings that are not valid UTF-8 (pyarrow does not check all it reads)."""
    try:
        return data.column(column).to_pylist()
    except UnicodeDecodeError:
        raise CorpusError(f"{where}: column {column!r} holds text that is not valid UTF-8") from None


def _id_column(where: Path | str, columns: list[str], text_column: str, id_column: str | None) -> str | None:
    """Return the id column to read: the one named, else 'id' where there is one; refuse missing or repeated columns."""
    if text_column not in columns:
        raise CorpusError(f"{where}: no column {text_column!r}; columns are {', '.join(columns)}")
    if id_column is not None and id_column not in columns:
        raise CorpusError(f"{where}: no column {id_column!r}; columns are {', '.join(columns)}")
    if id_column is None and "id" in columns and text_column != "id":
        id_column = "id"
    for name in (text_column, id_column):
        if name is not None and columns.count(name) > 1:  # which of them is meant? readers differ
            raise CorpusError(f"{where}: column {name!r} appears {columns.count(name)} times; name each column once")
    return id_column


def scan_corpus(
    path: Path | str,
    text_column: str = CorpusConfig.text_column,
    id_column: str | None = CorpusConfig.id_column,
    *,
    format: str | None = CorpusConfig.format,
) -> CorpusFile:
    """Check a corpus file in one streaming pass, as :func:`read_corpus` would, keeping only the ids seen.

    ``format``: parquet, csv or jsonl [default: by extension, see :mod:`condsearch.corpus.formats`].
    Skips null or blank texts; refuses a text column of other than strings (dictionary-encoded ones
    are decoded), an id column of other than strings or integers (:data:`ID_TYPES`), null, duplicate
    or beyond-64-bit ids, and a corpus with no text at all.
    """
    path = Path(path)
    fmt = format_of(path, format)
    check_regular_file(path, CorpusError)
    schema = read_schema(path, fmt, text_column, id_column)
    id_column = _id_column(path, schema.names, text_column, id_column)
    _check_columns(path, schema, text_column, id_column)
    seen: set[str | int] = set()
    n_total = 0
    csv_ids = fmt == "csv" and id_column is not None
    integer_ids = csv_ids
    # read_schema has just checked the file's bytes (corpus_prescan); the batches read again from the start
    for raw_ids, texts in _record_batches(path, fmt, text_column, id_column, prescan=False):
        ids = raw_ids if raw_ids is not None else range(n_total, n_total + len(texts))
        n_total += len(texts)
        for i, t in zip(ids, texts, strict=True):
            if t is None or not t.strip():
                continue
            _check_id(path, id_column, None if csv_ids and i == "" else i)
            if i in seen:
                raise CorpusError(f"{path}: duplicate id {i!r} in column {id_column!r}")
            seen.add(i)
            integer_ids = integer_ids and is_plain_integer(i)  # type: ignore[arg-type]  # a CSV's ids are str
    if not seen:
        raise CorpusError(f"{path}: no non-empty texts in column {text_column!r}")
    resolved = str(path.resolve())
    n_skipped = n_total - len(seen)
    return CorpusFile(resolved, file_checksum(path), text_column, id_column, len(seen), n_skipped, fmt, integer_ids)


def file_checksum(path: Path) -> str:
    """Return the sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_corpus(
    path: Path | str,
    text_column: str = CorpusConfig.text_column,
    id_column: str | None = CorpusConfig.id_column,
    *,
    format: str | None = CorpusConfig.format,
) -> Corpus:
    """Read a corpus file whole; skip null or blank texts; refuse ids as :func:`scan_corpus` does.

    Without ``id_column``, an ``id`` column is used when present, else the row number. A CSV file's ids
    are strings as written, or integers where every kept id is an integer written plainly
    (:func:`is_plain_integer`), so that each prints as the file writes it.
    """
    path = Path(path)
    fmt = format_of(path, format)
    check_regular_file(path, CorpusError)
    table = read_table(path, fmt, text_column, id_column)
    resolved, checksum = str(path.resolve()), file_checksum(path)
    return table_corpus(table, path, text_column, id_column, path=resolved, checksum=checksum, csv_ids=fmt == "csv")


def table_corpus(
    table: pa.Table,
    where: Path | str,
    text_column: str = CorpusConfig.text_column,
    id_column: str | None = CorpusConfig.id_column,
    *,
    path: str,
    checksum: str | None = None,
    csv_ids: bool = False,
) -> Corpus:
    """Return a table's corpus, checked as :func:`read_corpus` checks a file's (``where`` names it in errors).

    ``path`` is what the manifest records; ``checksum`` that of the file, else :func:`rows_checksum` of the rows kept.
    ``csv_ids``: the id column is a CSV file's strings: an empty one is no id, and where every kept id is an
    integer written plainly (:func:`is_plain_integer`), they are those integers.
    """
    id_column = _id_column(where, table.column_names, text_column, id_column)
    _check_columns(where, table.schema, text_column, id_column)
    texts = _values(where, table, text_column)
    raw_ids = _values(where, table, id_column) if id_column else list(range(table.num_rows))
    csv_ids = csv_ids and id_column is not None
    ids: list[str | int] = []
    kept: list[str] = []
    for i, t in zip(raw_ids, texts, strict=True):
        if t is None or not t.strip():
            continue
        _check_id(where, id_column, None if csv_ids and i == "" else i)
        ids.append(i)
        kept.append(t)
    if not kept:
        raise CorpusError(f"{where}: no non-empty texts in column {text_column!r}")
    if len(set(ids)) != len(ids):
        dup = _first_duplicate(ids)
        raise CorpusError(f"{where}: duplicate id {dup!r} in column {id_column!r}")
    if csv_ids and all(is_plain_integer(i) for i in ids):  # type: ignore[arg-type]  # a CSV's ids are str
        ids = [int(i) for i in ids]
    return Corpus(ids, kept, path, checksum or rows_checksum(ids, kept), len(texts) - len(kept))


def rows_checksum(ids: Sequence[str | int], texts: Sequence[str]) -> str:
    """Return the sha256 of (id, text) rows, as an in-memory corpus's checksum: equal rows, equal checksums."""
    h = hashlib.sha256()
    for i, t in zip(ids, texts, strict=True):
        h.update(json.dumps([i, t], ensure_ascii=False).encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()


def _first_duplicate(ids: list[str | int]) -> str | int:
    seen: set[str | int] = set()
    for i in ids:
        if i in seen:
            return i
        seen.add(i)
    raise AssertionError("no duplicate")
