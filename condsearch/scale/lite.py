"""Milvus Lite database paths: what ``--store milvus-lite:PATH`` may open or create, checked before Milvus Lite runs.

Milvus Lite makes a database wherever it is pointed, missing parent folders included, and
writes into whatever is there. So, as the FAISS store refuses a folder that is not an index,
a path is refused unless its parent folder exists and what is at the path is a Milvus Lite
database: a folder holding ``LOCK`` and ``collections/`` (milvus-lite 3), or a SQLite file
holding milvus-lite 2's ``collection_meta`` table. Only writers (index, export) may create
one, where nothing is yet or in an empty folder; a query never does. Nothing but a folder or
a regular file is opened: a FIFO or a device at the path would block or never end.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import closing
from pathlib import Path

from condsearch.errors import StoreError, os_reason

LITE3_MARKERS = ("LOCK", "collections")  # milvus_lite/db.py's layout of a data folder
SQLITE_HEADER = b"SQLite format 3\x00"
LITE2_TABLE = "collection_meta"  # milvus-lite 2's metadata table (its storage/collection_meta.cpp)


def check_lite_path(spec: str, path: str, *, create: bool) -> None:
    """Raise StoreError unless path holds a Milvus Lite database or, when create, one may be made there."""
    parent = os.path.dirname(path)
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        if not os.path.isdir(parent):
            raise StoreError(f"--store {spec}: folder {parent} does not exist") from None
        if not create:
            raise StoreError(f"--store {spec}: no Milvus Lite database at {path}") from None
        return
    except OSError as exc:
        raise StoreError(f"--store {spec}: {path} is unreadable ({os_reason(exc)})") from exc
    if stat.S_ISDIR(mode):
        try:
            names = os.listdir(path)
        except OSError as exc:
            raise StoreError(f"--store {spec}: {path} is unreadable ({os_reason(exc)})") from exc
        if not names and not create:
            raise StoreError(f"--store {spec}: no Milvus Lite database at {path} (an empty folder)")
        if not names or _is_lite3_folder(Path(path)):
            return
    elif stat.S_ISREG(mode) and _is_lite2_file(path):
        return
    raise StoreError(f"--store {spec}: {path} is not a Milvus Lite database")


def _is_lite3_folder(folder: Path) -> bool:
    return (folder / LITE3_MARKERS[0]).is_file() and (folder / LITE3_MARKERS[1]).is_dir()


def _is_lite2_file(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            if fh.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                return False
        with closing(sqlite3.connect(f"{Path(path).as_uri()}?mode=ro", uri=True)) as db:
            found = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (LITE2_TABLE,))
            return found.fetchone() is not None
    except (OSError, sqlite3.Error):
        return False
