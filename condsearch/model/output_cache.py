"""An on-disk cache of encoder outputs, keyed by model identity and a hash of the input."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import numpy as np

from condsearch.store.atomic import replacing_file


def default_cache_dir() -> Path:
    """Return ``$CONDSEARCH_CACHE_DIR`` or ``~/.cache/condsearch``."""
    env = os.environ.get("CONDSEARCH_CACHE_DIR")
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
    """Append-only shards of (key, vector) pairs under one directory.

    Each shard is an ``.npz`` with a ``keys`` array of fixed-width bytes, a ``vectors``
    float32 array and the ``checksum`` of both (:func:`shard_checksum`); loads never allow
    pickles. A shard that fails its checksum (damaged, edited, or written before it had one)
    is only a cache miss: its vectors are computed again. Shards are written to a temporary
    name and renamed, so a crash leaves no partial shard behind.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._loaded: dict[str, np.ndarray] | None = None

    def _load(self) -> dict[str, np.ndarray]:
        if self._loaded is None:
            self._loaded = {}
            for shard in sorted(self.directory.glob("shard-*.npz")):
                read = _read_shard(shard)
                if read is None:
                    continue  # a cache miss
                for key, vec in zip(*read, strict=True):
                    self._loaded[key.decode("ascii")] = vec
        return self._loaded

    def _shard(self, keys: list[str]) -> tuple[Path, np.ndarray]:
        """Return the shard a put of keys writes (named after them) and the keys as stored."""
        arr_keys = np.array([k.encode("ascii") for k in keys], dtype="S64")
        return self.directory / f"shard-{hashlib.sha256(arr_keys.tobytes()).hexdigest()[:16]}.npz", arr_keys

    def get(self, key: str) -> np.ndarray | None:
        """Return one key's cached vector, or None.

        The shard a put of that key alone wrote is read first (a condition's code is put so), so a
        hit reads one small file instead of every shard; otherwise every shard is read, as by get_many.
        """
        if self._loaded is None:
            read = _read_shard(self._shard([key])[0])
            if read is not None and len(read[0]) == 1 and read[0][0].decode("ascii") == key:
                return read[1][0]
        return self._load().get(key)

    def get_many(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Return the cached vectors for whichever keys are present."""
        loaded = self._load()
        return {k: loaded[k] for k in keys if k in loaded}

    def put_many(self, keys: list[str], vectors: np.ndarray) -> None:
        """Store vectors under keys in a new shard."""
        if not keys:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        shard, arr_keys = self._shard(keys)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        with replacing_file(shard) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, keys=arr_keys, vectors=vectors, checksum=np.array(shard_checksum(arr_keys, vectors)))
        loaded = self._load()
        for key, vec in zip(keys, vectors, strict=True):
            loaded[key] = vec
