"""Vectors kept beside an index: a float32 ``.npy`` written and read by rows, and what keys them.

The file is a plain NumPy ``.npy`` (``np.load(path, allow_pickle=False)`` reads it). It is
written with positioned writes into a file whose size is known from the start, and read by
rows with positioned reads rather than a memory map, so that neither grows the process's
resident memory with the corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import numpy as np

from condsearch.base.atomic import open_regular
from condsearch.base.cpu_kind import AUTO_DTYPE_KEY

VECTORS_FILE = "vectors.npy"
HASH_BYTES = 16


def text_hash(text: str) -> bytes:
    """Return the 16-byte BLAKE2b digest of a text: a row is unchanged when its id and this are."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=HASH_BYTES).digest()


#: What vectors of one fingerprint were made by. 2: weights checked against their recorded sha256 (an ONNX
#: export's files, a router's weights) as they load; vectors kept from before (fingerprints without it) may be
#: a damaged export's, and are encoded again by the next re-index (issue 37).
FINGERPRINT_VERSION = 2


def vector_fingerprint(described: dict[str, object], *, mode: str, head_checksum: str, dim: int) -> str:
    """Return the sha256 naming everything besides the text and condition that a row's vector depends on.

    ``described`` is the encoder's ``describe()``: model, revision, pooling, prompts, max length,
    dtype, the LoRA adapter's and the router's checksums. The float32 ONNX export of a model is
    not named: it is written from the weights those name, checked against them, and loaded only
    while its files match the sha256 recorded then, so that vectors built on either backend are
    kept by the other (docs/indexing.md); an int8 export is named by ``quantize``. Nor is a dtype that
    ``--dtype auto`` chose for the CPU (``auto_dtype``: bfloat16 on AMX and AVX-512 BF16): within the bound measured of
    float32's, so the model is the same on every CPU kind. Whether a re-index keeps vectors is decided
    with their precision too (:mod:`condsearch.ingest.chunks`): an index's vectors are all
    in the precision its manifest records.
    """
    payload = {
        "encoder": {k: v for k, v in described.items() if k != AUTO_DTYPE_KEY},
        "mode": mode,
        "head_checksum": head_checksum,
        "dim": dim,
        "fingerprint_version": FINGERPRINT_VERSION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _header(shape: tuple[int, int]) -> bytes:
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    text = repr(header).encode("latin1")
    # magic (6) + version (2) + length (2) + text + newline, padded to 64 bytes as NumPy does
    pad = -(10 + len(text) + 1) % 64
    return b"\x93NUMPY\x01\x00" + (len(text) + pad + 1).to_bytes(2, "little") + text + b" " * pad + b"\n"


class VectorWriter:
    """Write an (n, d) float32 ``.npy`` by row ranges, in any order; ranges not written read as zeros.

    With ``resume``, a file of the same shape already at path is written into (``resumed`` says so);
    otherwise a new file takes its place.
    """

    def __init__(self, path: Path, shape: tuple[int, int], *, resume: bool = False) -> None:
        self.path, self.shape = Path(path), (int(shape[0]), int(shape[1]))
        self._header = _header(self.shape)
        size = len(self._header) + 4 * self.shape[0] * self.shape[1]
        self.resumed = False  # whether resume found the file and kept what it holds
        if resume and self.path.is_file() and not self.path.is_symlink() and self.path.stat().st_size == size:
            with open(self.path, "rb") as fh:
                if fh.read(len(self._header)) == self._header:
                    self._fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
                    self.resumed = True
                    return
        # a new file, never the old one truncated: that may be a published version's file too (a hard link)
        self.path.unlink(missing_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(self._fd, self._header)
        os.ftruncate(self._fd, size)

    def write(self, start: int, rows: np.ndarray) -> None:
        """Write rows (m, d) at row start."""
        rows = np.ascontiguousarray(rows, dtype="<f4")
        if rows.ndim != 2 or rows.shape[1] != self.shape[1] or start + rows.shape[0] > self.shape[0]:
            raise ValueError(f"rows of shape {rows.shape} do not fit at row {start} of {self.shape}")
        offset = len(self._header) + 4 * start * self.shape[1]
        view = rows.data.cast("B")
        while view:
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written

    def sync(self) -> None:
        """Flush written rows to disk (before a chunk is recorded as finished)."""
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


class VectorFile:
    """Read rows of a float32 ``.npy`` without loading or mapping it whole: ``shape``, slicing and ``take``.

    ``fh``, when given, is the file already open (it stays the caller's to close); else ``path`` is
    opened, and refused unless it is a regular file. A header that is not a C-ordered (n, d) float32
    array, or a file whose size is not the header's plus n·d·4 bytes, raises ValueError.
    """

    def __init__(self, path: Path, fh: IO[bytes] | None = None) -> None:
        self.path = Path(path)
        source = open_regular(self.path) if fh is None else fh
        self._fd = os.dup(source.fileno())
        if fh is None:
            source.close()
        try:
            with os.fdopen(os.dup(self._fd), "rb") as header:
                header.seek(0)
                version = np.lib.format.read_magic(header)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(header)
                self._offset = header.tell()
            if dtype != np.dtype("<f4") or fortran or len(shape) != 2:
                raise ValueError(f"{path}: not a C-ordered (n, d) float32 array")
            self.shape: tuple[int, int] = (int(shape[0]), int(shape[1]))
            expected = self._offset + 4 * self.shape[0] * self.shape[1]
            if os.fstat(self._fd).st_size != expected:
                raise ValueError(
                    f"{path}: {os.fstat(self._fd).st_size} bytes where a {self.shape} array takes {expected}"
                )
        except BaseException:
            os.close(self._fd)
            raise

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("only contiguous row ranges")
        return self._read(start, max(0, stop - start))

    def _read(self, start: int, count: int) -> np.ndarray:
        d = self.shape[1]
        out = np.empty((count, d), dtype=np.float32)
        view, offset = out.data.cast("B"), self._offset + 4 * start * d
        while view:
            got = os.preadv(self._fd, [view], offset)
            if got <= 0:
                raise ValueError(f"{self.path}: truncated")
            view, offset = view[got:], offset + got
        return out

    def close(self) -> None:
        os.close(self._fd)

    def take(self, rows: Sequence[int] | np.ndarray, axis: int = 0) -> np.ndarray:
        """Return the given rows (any order) as an (m, d) array; runs of consecutive rows are read at once."""
        if axis != 0:
            raise ValueError("rows only")
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.shape[1]), dtype=np.float32)
        if not len(rows):
            return out
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        breaks = np.flatnonzero(np.diff(sorted_rows) != 1) + 1
        for run in np.split(np.arange(len(rows)), breaks):
            first = int(sorted_rows[run[0]])
            out[order[run]] = self._read(first, len(run))
        return out
