"""The bundled demo corpus (``data/demo_corpus.tsv``): captions that vary colour, sport, place, material, …"""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from condsearch.base.atomic import replacing_file

DEMO_TSV = Path(__file__).parent.parent / "data" / "demo_corpus.tsv"


def read_demo_rows() -> tuple[list[str], list[str]]:
    """Return the demo corpus as (ids, texts)."""
    with open(DEMO_TSV, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return [r["id"] for r in rows], [r["text"] for r in rows]


def write_demo_corpus(path: Path) -> int:
    """Write the demo corpus as parquet with columns id, text; return the row count.

    Written whole under a temporary name; a device or a FIFO at path is refused (OutputFileError).
    """
    ids, texts = read_demo_rows()
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing_file(path) as tmp:
        pq.write_table(pa.table({"id": ids, "text": texts}), tmp)
    return len(ids)
