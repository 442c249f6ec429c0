"""Corpus file formats: parquet, CSV and JSON lines, read with pyarrow's own readers, in record batches.

The format is named (``--format``) or told by the extension (``.parquet``/``.pq``, ``.csv``,
``.jsonl``/``.ndjson``); any other file is read as parquet, as every corpus was before the others.
A CSV file's text and id columns are read as strings, exactly as written (:mod:`condsearch.corpus.reader`
takes an empty id for none, and an id column of plainly written integers as integers), its other
columns as pyarrow infers; a JSON line's values keep their JSON types. Parquet and CSV stream; JSON
lines stream where pyarrow has ``pyarrow.json.open_json`` (19 and later), else the file is read
whole. A CSV or JSON lines file is checked by :mod:`condsearch.corpus.prescan` before each parse.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from condsearch.corpus.prescan import check_text_file
from condsearch.errors import CorpusError, first_line

if TYPE_CHECKING:  # pyarrow is imported when a file is read: the CLI's --help reads this module's choices
    import pyarrow as pa

CorpusFormat = Literal["parquet", "csv", "jsonl"]
#: --format choices, in the order the help lists them
FORMATS: tuple[CorpusFormat, ...] = ("parquet", "csv", "jsonl")
EXTENSIONS: dict[str, CorpusFormat] = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}
#: rows per record batch when a parquet corpus is streamed
READ_BATCH_ROWS = 8192


@dataclass(frozen=True)
class CorpusConfig:
    """How a corpus is read; the CLI's and the Python API's defaults are read from here."""

    text_column: str = "text"
    #: None: the 'id' column where there is one, else the row number
    id_column: str | None = None
    #: None: told by the file's extension (see :func:`format_of`)
    format: CorpusFormat | None = None
    #: the other columns kept beside each row in the index (issue 59); None: every one, () none
    keep_columns: tuple[str, ...] | None = None


def format_of(path: Path, fmt: str | None = None) -> CorpusFormat:
    """Return the format named, else the one the extension tells, else parquet; refuse an unknown name."""
    if fmt is None:
        return EXTENSIONS.get(path.suffix.lower(), "parquet")
    if fmt not in FORMATS:
        raise CorpusError(f"unknown corpus format {fmt!r} (choose from {', '.join(FORMATS)})")
    return fmt  # type: ignore[return-value]


def _unreadable(path: Path, fmt: CorpusFormat, exc: BaseException) -> CorpusError:
    return CorpusError(f"{path}: not a readable {fmt} file ({first_line(exc)})")


def read_schema(path: Path, fmt: CorpusFormat, text_column: str, id_column: str | None = None) -> pa.Schema:
    """Return a corpus file's columns and types (a CSV's and JSON file's as inferred from their first block).

    ``id_column`` [default: 'id'] is, with ``text_column``, a CSV column read as strings.
    """
    import pyarrow.parquet as pq

    try:
        if fmt == "parquet":
            return pq.read_schema(path)
        reader = _open_stream(path, fmt, [text_column, id_column or "id"], None)
        try:
            return reader.schema
        finally:
            reader.close()
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise _unreadable(path, fmt, exc) from exc


def record_batches(
    path: Path,
    fmt: CorpusFormat,
    columns: Sequence[str],
    *,
    prescan: bool = True,
    strings: Sequence[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the corpus's record batches holding only ``columns``; parquet's of :data:`READ_BATCH_ROWS` rows.

    ``strings``: the columns a CSV file's are read as strings, as written: the text and id columns [default:
    every one of ``columns``]; its others are typed as pyarrow infers. ``prescan=False`` skips
    :func:`~condsearch.corpus.prescan.check_text_file`, for a caller that has just made it.
    """
    import pyarrow.parquet as pq

    try:
        if fmt == "parquet":
            yield from pq.ParquetFile(path).iter_batches(batch_size=READ_BATCH_ROWS, columns=list(columns))
            return
        for batch in _open_stream(path, fmt, columns if strings is None else strings, columns, prescan=prescan):
            yield batch.select(list(columns))
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise _unreadable(path, fmt, exc) from exc


def read_table(path: Path, fmt: CorpusFormat, text_column: str, id_column: str | None = None) -> pa.Table:
    """Return a whole corpus file as a table (a CSV's ``text_column`` and ``id_column`` [default: 'id'] as strings)."""
    import pyarrow.parquet as pq

    try:
        if fmt == "parquet":
            return pq.read_table(path)
        check_text_file(path, fmt)
        if fmt == "csv":
            import pyarrow.csv as pacsv

            return pacsv.read_csv(path, convert_options=_csv_options([text_column, id_column or "id"], None))
        import pyarrow.json as pajson

        return pajson.read_json(path)
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise _unreadable(path, fmt, exc) from exc


def _csv_options(strings: Sequence[str], columns: Sequence[str] | None) -> object:
    """Return ConvertOptions that read a CSV's ``strings`` as written, ``columns`` only [default: all]."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    # Typed by inference, id 00001 became the integer 1 and 2020-01-01 a date, and a text of digits a number.
    # A string column holds no nulls: an empty value is "" ('NA' is 'NA'); other columns are typed as before.
    return pacsv.ConvertOptions(
        column_types={name: pa.string() for name in strings}, include_columns=list(columns or ())
    )


def _open_stream(
    path: Path, fmt: CorpusFormat, strings: Sequence[str], columns: Sequence[str] | None, *, prescan: bool = True
) -> pa.RecordBatchReader:
    """Open a CSV (``strings`` and ``columns`` as :func:`_csv_options` takes them) or JSON lines file to stream."""
    if prescan:  # each time the file is parsed anew: it may have changed since the last check
        check_text_file(path, fmt)
    if fmt == "csv":
        import pyarrow.csv as pacsv

        return pacsv.open_csv(path, convert_options=_csv_options(strings, columns))
    import pyarrow.json as pajson

    open_json = getattr(pajson, "open_json", None)
    if open_json is not None:
        return open_json(path)
    import pyarrow as pa

    table = pajson.read_json(path)
    return pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
