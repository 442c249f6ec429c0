"""Corpora held in Python: a list of texts (with ids or not), a pandas DataFrame or a pyarrow Table.

Each becomes a pyarrow table checked as a file is (:func:`condsearch.corpus.reader.table_corpus`): the
same missing-column, empty-corpus and duplicate-id errors, named after what was given. Its
checksum is that of its rows (:func:`condsearch.corpus.reader.rows_checksum`), so indexing equal rows
again re-encodes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from condsearch.corpus.formats import CorpusConfig
from condsearch.corpus.reader import ID_TYPES, Corpus, in_id_range, table_corpus
from condsearch.errors import CorpusError, first_line

#: what an in-memory corpus is recorded as in the manifest, in place of a file's path
IN_MEMORY = "<memory>"


def is_table(data: object) -> bool:
    """Return whether data is a pyarrow Table or RecordBatch, or a pandas DataFrame."""
    pandas = sys.modules.get("pandas")  # a DataFrame exists only where pandas was imported
    return isinstance(data, pa.Table | pa.RecordBatch) or (pandas is not None and isinstance(data, pandas.DataFrame))


def memory_corpus(
    data: Sequence[str] | Any,
    *,
    ids: Sequence[str | int] | None = None,
    text_column: str = CorpusConfig.text_column,
    id_column: str | None = CorpusConfig.id_column,
    keep: Sequence[str] | None = CorpusConfig.keep_columns,
) -> Corpus:
    """Return the corpus of a list of texts (``ids``: one per text [default: row numbers]) or of a table.

    A table (pandas DataFrame, pyarrow Table) is read as a file is: ``text_column``, and ``id_column``
    or else its 'id' column where there is one; ``keep``: its other columns kept beside each row [default:
    all]. Raises CorpusError in one line.
    """
    if is_table(data):
        if ids is not None:
            raise CorpusError("ids= goes with a list of texts; name a table's id column with id_column=")
        kind = type(data).__name__
        return table_corpus(_arrow(data), kind, text_column, id_column, path=IN_MEMORY, keep=keep)
    if keep:
        raise CorpusError("keep_columns= names a table's columns; a list of texts has none")
    if isinstance(data, str | bytes | Path) or not isinstance(data, Sequence):
        kind = type(data).__name__
        raise CorpusError(f"a corpus is a list of texts, a DataFrame, a pyarrow Table or a file, not {kind}")
    if text_column != CorpusConfig.text_column or id_column != CorpusConfig.id_column:
        raise CorpusError("text_column= and id_column= name a table's columns; a list of texts has none")
    columns: dict[str, Any] = {"text": list(data)}
    if ids is not None:
        if len(ids) != len(data):
            raise CorpusError(f"{len(ids)} ids for {len(data)} texts")
        columns["id"] = list(ids)
    try:
        table = pa.table(columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise CorpusError(f"texts and ids must be strings, ids strings or integers ({first_line(exc)})") from exc
    except (UnicodeEncodeError, OverflowError) as exc:  # a lone surrogate; an integer past 64 bits
        check_utf8(columns["text"], "text", "texts: ")
        check_utf8(columns.get("id", []), "id", "texts: ")
        for i in columns.get("id", []):
            if isinstance(i, int) and not in_id_range(i):
                raise CorpusError(f"texts: id {i} is beyond the signed 64-bit range ids are kept in") from None
        raise CorpusError(f"texts: ids must be {ID_TYPES} ({first_line(exc)})") from exc
    return table_corpus(table, "texts", "text", "id" if ids is not None else None, path=IN_MEMORY)


def check_utf8(values: Sequence[object], what: str, where: str = "") -> None:
    """Raise CorpusError in one line naming the first string of values that is not valid UTF-8.

    A Python string can hold lone surrogates (``\\udcff``: what undecodable bytes become), which
    no file, tokenizer or JSON answer takes. Other values are not looked at.
    """
    for n, value in enumerate(values):
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                shown = ascii(value[:40])
                raise CorpusError(
                    f"{where}{what} {n} is not valid UTF-8 (it holds a lone surrogate: {shown})"
                ) from None


def _arrow(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    try:
        return pa.Table.from_pandas(data, preserve_index=False)
    except UnicodeEncodeError as exc:
        shown = ascii(exc.object[:40])
        raise CorpusError(f"DataFrame: a value is not valid UTF-8 (it holds a lone surrogate: {shown})") from None
    except (ValueError, TypeError, OverflowError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise CorpusError(f"DataFrame: cannot convert to a table ({first_line(exc)})") from exc
