"""Checking an index's files against its manifest: sizes, the cheap head-and-tail probe, sha256, vector shape.

The folder store (:mod:`condsearch.store.folder`) records these when it writes a version and checks
them when it loads one; here they are, apart from where the files live.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import IO

import pyarrow.parquet as pq

from condsearch.errors import StoreError, first_line
from condsearch.store.manifest import Manifest
from condsearch.store.vectors import VECTORS_FILE, VectorFile

#: bytes read from each end of the index file by the cheap check
PROBE_BYTES = 64 << 10


def sha256_of(fh: IO[bytes]) -> str:
    h = hashlib.sha256()
    fh.seek(0)
    for chunk in iter(lambda: fh.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def probe_of(fh: IO[bytes], size: int) -> str:
    """Return the sha256 of the first and last 64 KiB: catches a damaged header or tail without reading all."""
    h = hashlib.sha256()
    fh.seek(0)
    h.update(fh.read(PROBE_BYTES))
    fh.seek(max(0, size - PROBE_BYTES))
    h.update(fh.read(PROBE_BYTES))
    return h.hexdigest()


def check_index_file(path: Path, fh: IO[bytes], manifest: Manifest, *, verify: bool) -> None:
    damaged = StoreError(f"{path}: checksum mismatch; the index file is damaged")
    stat = os.fstat(fh.fileno())
    if manifest.index_size:  # format 2: the cheap checks first
        if stat.st_size != manifest.index_size:
            raise StoreError(
                f"{path}: {stat.st_size} bytes where the manifest says {manifest.index_size}; the index file is damaged"
            )
        if probe_of(fh, stat.st_size) != manifest.index_probe:
            raise damaged
        if stat.st_mtime_ns == manifest.index_mtime_ns and not verify:
            return
    if sha256_of(fh) != manifest.index_checksum:
        raise damaged


def check_file(path: Path, fh: IO[bytes], manifest: Manifest, *, full: bool) -> None:
    """Check a file against the size (and with full, the sha256) the manifest records for it, if any."""
    record = manifest.files.get(path.name)
    if record is None:
        return
    size = os.fstat(fh.fileno()).st_size
    if size != record["size"]:
        raise StoreError(f"{path}: {size} bytes where the manifest says {record['size']}; the file is damaged")
    if full and sha256_of(fh) != record["sha256"]:
        raise StoreError(f"{path}: checksum mismatch; the file is damaged")


def check_vectors(path: Path, fh: IO[bytes] | None, manifest: Manifest) -> None:
    """Check the kept vectors in full: checksum where recorded, and an (n_vectors, dim) float32 array."""
    if fh is None:
        if VECTORS_FILE in manifest.files:
            raise StoreError(f"{path}: missing, though the manifest records it; the index is damaged")
        return
    check_file(path, fh, manifest, full=True)
    try:
        vectors = VectorFile(path, fh)
    except ValueError as exc:
        raise StoreError(f"{first_line(exc)}; the file is damaged") from exc
    vectors.close()
    if vectors.shape != (manifest.n_vectors, manifest.dim):
        raise StoreError(
            f"{path}: {vectors.shape} vectors where the manifest says {(manifest.n_vectors, manifest.dim)}; "
            "the file is damaged"
        )


def is_regular(path: Path) -> bool:
    """Return whether path is a regular file itself (not a link to one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def parquet_columns(fh: IO[bytes]) -> list[str]:
    fh.seek(0)
    names = pq.read_schema(fh).names
    fh.seek(0)
    return names
