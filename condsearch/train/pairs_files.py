"""The files of ``condsearch pairs``: a labelled table read as ``index`` reads a corpus, the rows written whole.

:func:`read_labelled` reads parquet, CSV or JSON lines (:mod:`condsearch.corpus.formats`) and
keeps the rows with a text, as ``index`` does; each label becomes a string or None.
:func:`write_pairs` writes C-STS rows as CSV (what ``condsearch train`` reads), or parquet or
JSON lines by the extension, under a temporary name renamed into place: an error leaves no file.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from condsearch.base.atomic import check_replaceable_file, replacing_file
from condsearch.base.regular_files import check_regular_file
from condsearch.corpus.csts import COLUMNS, CstsData
from condsearch.corpus.formats import EXTENSIONS, CorpusConfig, CorpusFormat, format_of, read_table
from condsearch.errors import CorpusError


@dataclass(frozen=True)
class LabelledTexts:
    """Texts and their labels: ``labels[column][i]`` is text i's value in column, None where it has none."""

    texts: list[str]
    labels: dict[str, list[str | None]]
    n_skipped: int = 0  # rows without a text


def label_value(value: object) -> str | None:
    """Return a cell as a label: its text stripped, None for a null, NaN or blank cell."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = str(value).strip()
    return text or None


def read_labelled(
    path: Path | str,
    columns: Sequence[str],
    text_column: str = CorpusConfig.text_column,
    *,
    format: str | None = CorpusConfig.format,
) -> LabelledTexts:
    """Read a table's texts and the label columns named; skip rows whose text is null or blank.

    Refuses a missing column, a text column of other than strings and a label column of lists or
    records, each as a CorpusError.
    """
    import pyarrow as pa

    path = Path(path)
    fmt = format_of(path, format)
    check_regular_file(path, CorpusError)  # a FIFO would block the read, /dev/zero never end
    table = read_table(path, fmt, text_column)
    for column in (text_column, *columns):
        if column not in table.column_names:
            raise CorpusError(f"{path}: no column {column!r}; columns are {', '.join(table.column_names)}")
    kind = table.schema.field(text_column).type
    plain = kind.value_type if pa.types.is_dictionary(kind) else kind
    if not (pa.types.is_string(plain) or pa.types.is_large_string(plain) or pa.types.is_null(plain)):
        raise CorpusError(f"{path}: column {text_column!r} does not hold strings")
    for column in columns:
        kind = table.schema.field(column).type
        if pa.types.is_nested(kind):
            raise CorpusError(f"{path}: column {column!r} holds {kind}; labels are single values")
    raw = table.column(text_column).to_pylist()
    keep = [i for i, t in enumerate(raw) if t is not None and t.strip()]
    if not keep:
        raise CorpusError(f"{path}: no non-empty texts in column {text_column!r}")
    labels: dict[str, list[str | None]] = {}
    for column in columns:
        values = table.column(column).to_pylist()
        labels[column] = [label_value(values[i]) for i in keep]
    return LabelledTexts([raw[i] for i in keep], labels, len(raw) - len(keep))


def output_format(out: Path) -> CorpusFormat:
    """Return the format the output's extension names (.parquet/.pq, .jsonl/.ndjson), else csv."""
    return EXTENSIONS.get(out.suffix.lower(), "csv")


def check_output(out: Path, inputs: Sequence[Path] = ()) -> None:
    """Refuse, before any work, an output that is a folder, a device or a FIFO, lies in no folder, or is an input."""
    if out.is_dir():
        raise CorpusError(f"{out}: is a folder; name a file to write the pairs into")
    check_replaceable_file(out)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise CorpusError(f"{out}: no folder {parent} to write it into")
    for source in inputs:
        if out.exists() and source.exists() and os.path.samefile(out, source):
            raise CorpusError(f"{out}: is the input table; name another file")


def write_pairs(rows: CstsData, out: Path) -> CorpusFormat:
    """Write C-STS rows (sentence1, sentence2, condition, label) to out whole, in the format its extension names."""
    fmt = output_format(out)
    records = zip(rows.sentence1, rows.sentence2, rows.condition, rows.labels.tolist(), strict=True)
    with replacing_file(out) as tmp:
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.table(
                {
                    "sentence1": pa.array(rows.sentence1, pa.string()),
                    "sentence2": pa.array(rows.sentence2, pa.string()),
                    "condition": pa.array(rows.condition, pa.string()),
                    "label": pa.array(rows.labels.tolist(), pa.float64()),
                }
            )
            pq.write_table(table, tmp)
        elif fmt == "jsonl":
            with open(tmp, "w", encoding="utf-8") as fh:
                for record in records:
                    fh.write(json.dumps(dict(zip(COLUMNS, record, strict=True)), ensure_ascii=False) + "\n")
        else:
            with open(tmp, "w", encoding="utf-8", newline="") as fh:
                writer = csv.writer(fh)
                writer.writerow(COLUMNS)
                writer.writerows(records)
    return fmt
