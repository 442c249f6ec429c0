"""An on-disk cache of encoder outputs, keyed by model identity and a hash of the input."""

from __future__ import annotations

import hashlib
import os
import threading
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

from condsearch.base.atomic import replacing_file

#: bytes of vectors an :class:`EmbeddingCache` keeps in memory at most (the rest stay on disk, read again when asked)
MEMORY_BYTES = 256 << 20


#: the environment variable naming the cache folder
CACHE_DIR_ENV = "CONDSEARCH_CACHE_DIR"


def default_cache_dir() -> Path:
    """Return ``$CONDSEARCH_CACHE_DIR`` or ``~/.cache/condsearch``."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "condsearch"


def pair_key(ident: str, condition: str, sentence: str | None) -> str:
    """Return a hex digest naming one encoder input under one encoder identity."""
    h = hashlib.sha256()
    for part in (ident, condition, "\x00" if sentence is None else "\x01" + sentence):
        h.update(part.encode("utf-8"))
        h.update(b"\x1f")
    return h.hexdigest()


def shard_checksum(keys: np.ndarray, vectors: np.ndarray) -> str:
    """Return the sha256 of a shard's keys and vectors: their dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for array in (keys, vectors):
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def _read_shard(shard: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """Return a shard's (keys, vectors), or None when it is damaged, of another layout or fails its checksum."""
    try:
        with np.load(shard, allow_pickle=False) as data:
            keys, vectors, checksum = data["keys"], data["vectors"], data["checksum"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # a damaged member fails its CRC
        return None
    if (
        keys.dtype != np.dtype("S64")
        or keys.ndim != 1
        or vectors.dtype != np.float32
        or vectors.ndim != 2
        or len(vectors) != len(keys)
        or checksum.shape != ()
        or str(checksum) != shard_checksum(keys, vectors)
    ):
        return None
    return keys, vectors


class EmbeddingCache:
    """Append-only shards of (key, vector) pairs under one directory, with the vectors read lately kept in memory.

    Each shard is an ``.npz`` with a ``keys`` array of fixed-width bytes, a ``vectors``
    float32 array and the ``checksum`` of both (:func:`shard_checksum`); loads never allow
    pickles. A shard that fails its checksum (damaged, edited, or written before it had one)
    is only a cache miss: its vectors are computed again. Shards are written to a temporary
    name and renamed, so a crash leaves no partial shard behind.

    :meth:`get` reads one shard at most, the one a put of that key alone writes (a condition's code
    is put so); :meth:`get_many` learns which shard holds which key once, by reading every shard. What
    was read or put is kept in memory up to ``max_bytes`` of vectors, the least recently used dropped
    first; :meth:`keep` holds a vector there without writing it (a server's codes of conditions that
    no index has).
    """

    def __init__(self, directory: Path, max_bytes: int = MEMORY_BYTES) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._memory: OrderedDict[str, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._where: dict[str, Path] | None = None  # key -> shard, once get_many has read every shard
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Return the bytes of vectors held in memory (at most ``max_bytes``)."""
        return self._bytes

    def keep(self, key: str, vector: np.ndarray) -> None:
        """Hold key's vector in memory (least recently used first out past ``max_bytes``); nothing is written."""
        vector = np.array(vector, dtype=np.float32)  # a copy: a row of a shard would hold the whole shard
        with self._lock:
            old = self._memory.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            if vector.nbytes > self.max_bytes:
                return
            self._memory[key] = vector
            self._bytes += vector.nbytes
            while self._bytes > self.max_bytes:
                _, dropped = self._memory.popitem(last=False)
                self._bytes -= dropped.nbytes

    def _held(self, key: str) -> np.ndarray | None:
        with self._lock:
            found = self._memory.get(key)
            if found is not None:
                self._memory.move_to_end(key)
            return found

    def _index(self) -> dict[str, Path]:
        """Return which shard holds each key, reading every shard once (its vectors kept as memory allows)."""
        if self._where is None:
            where: dict[str, Path] = {}
            for shard in sorted(self.directory.glob("shard-*.npz")):
                read = _read_shard(shard)
                if read is None:
                    continue  # a cache miss
                for key, vec in zip(*read, strict=True):
                    where[key.decode("ascii")] = shard
                    self.keep(key.decode("ascii"), vec)
            self._where = where
        return self._where

    def _shard(self, keys: list[str]) -> tuple[Path, np.ndarray]:
        """Return the shard a put of keys writes (named after them) and the keys as stored."""
        arr_keys = np.array([k.encode("ascii") for k in keys], dtype="S64")
        return self.directory / f"shard-{hashlib.sha256(arr_keys.tobytes()).hexdigest()[:16]}.npz", arr_keys

    def get(self, key: str) -> np.ndarray | None:
        """Return one key's cached vector, or None, reading one shard at most.

        From memory, else from the shard a put of that key alone wrote (or, once :meth:`get_many` has
        learnt where every key is, the shard that holds it).
        """
        found = self._held(key)
        if found is not None:
            return found
        shard = self._where.get(key) if self._where is not None else None
        read = _read_shard(shard or self._shard([key])[0])
        if read is None:
            return None
        for stored, vec in zip(*read, strict=True):
            if stored.decode("ascii") == key:
                self.keep(key, vec)
                return vec
        return None

    def get_many(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Return the cached vectors for whichever keys are present (each shard that holds one read once)."""
        found = {k: v for k in keys if (v := self._held(k)) is not None}
        where = self._index()
        by_shard: dict[Path, set[str]] = {}
        for key in keys:
            if key not in found and key in where:
                by_shard.setdefault(where[key], set()).add(key)
        for shard, wanted in by_shard.items():
            read = _read_shard(shard)
            if read is None:
                continue
            for stored, vec in zip(*read, strict=True):
                if (key := stored.decode("ascii")) in wanted:
                    found[key] = vec
                    self.keep(key, vec)
        return found

    def put_many(self, keys: list[str], vectors: np.ndarray) -> None:
        """Store vectors under keys in a new shard."""
        if not keys:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        shard, arr_keys = self._shard(keys)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        with replacing_file(shard) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, keys=arr_keys, vectors=vectors, checksum=np.array(shard_checksum(arr_keys, vectors)))
        for key, vec in zip(keys, vectors, strict=True):
            if self._where is not None:
                self._where[key] = shard
            self.keep(key, vec)
