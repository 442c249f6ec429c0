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
from condsearch.errors import CorpusError, first_line

#: what a batch of a corpus is: its rows' ids, texts and kept columns (None where it keeps none)
Chunk = tuple[list[str | int], list[str], pa.Table | None]


@dataclass(frozen=True)
class Corpus:
    """Texts to index with their ids and kept columns (issue 59), and what was skipped on the way in."""

    ids: list[str | int]
    texts: list[str]
    path: str
    checksum: str
    n_skipped: int = 0
    #: the other columns kept beside each row (:func:`keep_columns`), row i for row i; None: none kept
    metadata: pa.Table | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def batches(self, rows: int) -> Iterator[tuple[list[str | int], list[str]]]:
        """Yield (ids, texts) of consecutive rows, ``rows`` at a time (the last batch may be shorter)."""
        for ids, texts, _ in self.chunks(rows):
            yield ids, texts

    @property
    def metadata_schema(self) -> pa.Schema | None:
        """Return the kept columns and their types, None where none are kept."""
        return self.metadata.schema if self.metadata is not None and self.metadata.num_columns else None

    def chunks(self, rows: int) -> Iterator[Chunk]:
        """Yield (ids, texts, kept columns) of consecutive rows, ``rows`` at a time (the last batch may be shorter)."""
        for start in range(0, len(self.texts), rows):
            kept = self.metadata.slice(start, rows) if self.metadata is not None else None
            yield self.ids[start : start + rows], self.texts[start : start + rows], kept


#: the rows file's own columns (:data:`condsearch.store.rows.ROW_COLUMNS`): a corpus column so named is not kept
RESERVED_COLUMNS = ("id", "text", "text_hash")


def keep_columns(
    where: Path | str, schema: pa.Schema, text_column: str, id_column: str | None, keep: Sequence[str] | None
) -> list[str]:
    """Return the columns kept beside each row: those named (``keep``), or every one but the text and id columns.

    Refuses, in one line, a column named that is missing, named twice, the text or id column, or one of the names
    the rows file holds for itself (:data:`RESERVED_COLUMNS`); with none named, such a column is left out.
    """
    names = schema.names
    if keep is None:
        return [
            c for c in names if c not in (text_column, id_column) and c not in RESERVED_COLUMNS and names.count(c) == 1
        ]
    if isinstance(keep, str):
        raise CorpusError("keep_columns is a list of column names")
    for name in keep:
        if not isinstance(name, str):
            raise CorpusError(f"keep_columns names columns by their names (strings), not {type(name).__name__}")
        if name not in names:
            raise CorpusError(f"{where}: no column {name!r} to keep; columns are {', '.join(names)}")
        if name in (text_column, id_column):
            raise CorpusError(
                f"{where}: column {name!r} is the {'text' if name == text_column else 'id'} column; it is kept already"
            )
        if name in RESERVED_COLUMNS:
            raise CorpusError(
                f"{where}: a column named {name!r} cannot be kept beside the rows (the index names one "
                "of its own so); rename it"
            )
        if names.count(name) > 1 or list(keep).count(name) > 1:
            raise CorpusError(f"{where}: column {name!r} to keep appears more than once")
    return list(keep)


def kept_schema(schema: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    """Return the kept columns' schema: each column's type, a dictionary's (pandas' category) as its values'."""
    return pa.schema([pa.field(c, _plain(schema.field(c).type)) for c in columns])


def _kept(
    where: Path | str, data: pa.Table | pa.RecordBatch, schema: pa.Schema | None, mask: list[bool]
) -> pa.Table | None:
    """Return the kept columns of the rows that mask keeps, in the kept schema (None where none are kept)."""
    if schema is None or not len(schema):
        return None
    table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    try:
        return table.select(schema.names).filter(pa.array(mask, type=pa.bool_())).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise CorpusError(f"{where}: a kept column changes type part way ({first_line(exc)})") from None


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
    #: the columns kept beside each row and their types (:func:`kept_schema`); None: none kept
    metadata_schema: pa.Schema | None = None

    def __len__(self) -> int:
        return self.n_rows

    def batches(self, rows: int) -> Iterator[tuple[list[str | int], list[str]]]:
        """Yield (ids, texts) of the kept rows in file order, exactly ``rows`` per batch but the last."""
        for ids, texts, _ in self.chunks(rows):
            yield ids, texts

    def chunks(self, rows: int) -> Iterator[Chunk]:
        """Yield (ids, texts, kept columns) of the kept rows in file order, exactly ``rows`` per batch but the last."""
        ids: list[str | int] = []
        texts: list[str] = []
        kept: list[pa.Table] = []
        offset = 0
        path, schema = Path(self.path), self.metadata_schema
        kept_names = schema.names if schema is not None else []
        for batch in record_batches(path, self.format, self._columns(kept_names), strings=self._columns([])):
            raw_texts = _values(path, batch, self.text_column)
            raw_ids = _values(path, batch, self.id_column) if self.id_column else None
            numbers = raw_ids if raw_ids is not None else range(offset, offset + len(raw_texts))
            mask = [t is not None and bool(t.strip()) for t in raw_texts]
            for i, t, keep in zip(numbers, raw_texts, mask, strict=True):
                if keep:
                    ids.append(int(i) if self.integer_ids else i)  # type: ignore[arg-type]  # str ids, checked
                    texts.append(t)
            if (part := _kept(path, batch, schema, mask)) is not None:
                kept.append(part)
            offset += len(raw_texts)
            while len(texts) >= rows:
                yield ids[:rows], texts[:rows], _take(kept, rows)
                del ids[:rows], texts[:rows]
        if texts:
            yield ids, texts, _take(kept, len(texts))

    def _columns(self, kept: Sequence[str]) -> list[str]:
        return [self.text_column, *([self.id_column] if self.id_column else []), *kept]


def _take(parts: list[pa.Table], rows: int) -> pa.Table | None:
    """Return the first rows of the tables in parts, removing them there (None where parts holds none)."""
    if not parts:
        return None
    whole = pa.concat_tables(parts)
    parts[:] = [whole.slice(rows)] if whole.num_rows > rows else []
    return whole.slice(0, rows)


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
    keep: Sequence[str] | None = CorpusConfig.keep_columns,
) -> CorpusFile:
    """Check a corpus file in one streaming pass, as :func:`read_corpus` would, keeping only the ids seen.

    ``format``: parquet, csv or jsonl [default: by extension, see :mod:`condsearch.corpus.formats`].
    ``keep``: the other columns kept beside each row (:func:`keep_columns`) [default: all].
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
    kept = keep_columns(path, schema, text_column, id_column, keep)
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
    metadata = kept_schema(schema, kept) if kept else None
    checksum = file_checksum(path)
    return CorpusFile(resolved, checksum, text_column, id_column, len(seen), n_skipped, fmt, integer_ids, metadata)


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
    keep: Sequence[str] | None = CorpusConfig.keep_columns,
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
    return table_corpus(
        table, path, text_column, id_column, path=resolved, checksum=checksum, csv_ids=fmt == "csv", keep=keep
    )


def table_corpus(
    table: pa.Table,
    where: Path | str,
    text_column: str = CorpusConfig.text_column,
    id_column: str | None = CorpusConfig.id_column,
    *,
    path: str,
    checksum: str | None = None,
    csv_ids: bool = False,
    keep: Sequence[str] | None = CorpusConfig.keep_columns,
) -> Corpus:
    """Return a table's corpus, checked as :func:`read_corpus` checks a file's (``where`` names it in errors).

    ``path`` is what the manifest records; ``checksum`` that of the file, else :func:`rows_checksum` of the rows kept.
    ``csv_ids``: the id column is a CSV file's strings: an empty one is no id, and where every kept id is an
    integer written plainly (:func:`is_plain_integer`), they are those integers. ``keep``: the other columns kept
    beside each row (:func:`keep_columns`) [default: all].
    """
    id_column = _id_column(where, table.column_names, text_column, id_column)
    _check_columns(where, table.schema, text_column, id_column)
    kept = keep_columns(where, table.schema, text_column, id_column, keep)
    texts = _values(where, table, text_column)
    raw_ids = _values(where, table, id_column) if id_column else list(range(table.num_rows))
    csv_ids = csv_ids and id_column is not None
    ids: list[str | int] = []
    rows: list[str] = []
    for i, t in zip(raw_ids, texts, strict=True):
        if t is None or not t.strip():
            continue
        _check_id(where, id_column, None if csv_ids and i == "" else i)
        ids.append(i)
        rows.append(t)
    if not rows:
        raise CorpusError(f"{where}: no non-empty texts in column {text_column!r}")
    if len(set(ids)) != len(ids):
        dup = _first_duplicate(ids)
        raise CorpusError(f"{where}: duplicate id {dup!r} in column {id_column!r}")
    if csv_ids and all(is_plain_integer(i) for i in ids):  # type: ignore[arg-type]  # a CSV's ids are str
        ids = [int(i) for i in ids]
    mask = [t is not None and bool(t.strip()) for t in texts]
    metadata = _kept(where, table, kept_schema(table.schema, kept), mask) if kept else None
    return Corpus(ids, rows, path, checksum or rows_checksum(ids, rows), len(texts) - len(rows), metadata)


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
