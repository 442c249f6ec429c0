"""A file's sha256, and what may stand for it while the file is unchanged: a stamp of its identity.

Hashing a model's weights whole takes 50-60 ms per 90 MB here (SHA-NI; a few times that without
it). A digest is kept with the file's identity when it was hashed (:func:`file_identity`: device,
inode, size, modification and change times) and reused while that identity stands. Any write to a
file moves its change time, which no one but the clock can set back; a file changed within
:data:`SETTLE_NS` of its check could keep the same timestamp tick, so files that young are hashed
every time, never stamped. The ONNX export cache (:mod:`condsearch.model.encoders.onnx.cache`) stamps
its verified exports so; a local model folder's revision (:mod:`condsearch.base.model_sources`) keeps its
weights' digests under the cache dir's ``digests/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from condsearch.base.atomic import replacing_file

#: a file whose change time is younger than this (ns) may change again within the same timestamp tick: never stamped
SETTLE_NS = 2_000_000_000


def sha256_file(path: Path) -> str:
    """Return the sha256 of a file's bytes, read whole."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def file_identity(path: Path) -> list[int]:
    """Return what changes whenever a file's content can have changed: device, inode, size, mtime and ctime."""
    info = os.stat(path)
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def settled(identity: Sequence[int]) -> bool:
    """Return whether a file of this identity last changed long enough ago for its stamp to stand for its hash."""
    return time.time_ns() - identity[4] >= SETTLE_NS


def cached_sha256(path: Path, cache: Path) -> str:
    """Return the sha256 of a file, from ``cache`` (a folder) when the file is as it was when last hashed.

    The identity is taken before hashing: a file written while it is hashed never matches its stamp.
    An unwritable cache leaves every call to hash. OSError: the file cannot be read.
    """
    path = Path(os.path.abspath(path))
    identity = file_identity(path)
    record = cache / f"{hashlib.sha256(str(path).encode()).hexdigest()[:32]}.json"
    try:
        stamp = json.loads(record.read_text())
    except (OSError, ValueError):
        stamp = None
    if isinstance(stamp, dict) and stamp.get("path") == str(path) and stamp.get("identity") == identity:
        digest = stamp.get("sha256")
        if isinstance(digest, str):
            return digest
    digest = sha256_file(path)
    if settled(identity):
        try:
            cache.mkdir(parents=True, exist_ok=True)
            with replacing_file(record) as tmp:
                tmp.write_text(json.dumps({"path": str(path), "identity": identity, "sha256": digest}))
        except OSError:  # a read-only cache: every call hashes
            pass
    return digest
