"""Which builds hold a corpus (issue 59): a drop is refused while any build or change of the corpus runs.

An index's writer lock and build lock are named after the index, not its corpus, and the build of a
condition nobody indexed yet has no index that a drop could find. So every builder also holds a claim
on the corpus: a lock file of its own, ``.versions/<index name>.<corpus digest>.<random>.claim.lock``,
taken after a short pass through the corpus's gate (``.versions/.corpus-<digest>.gate.lock``) and held
for as long as it builds, then removed. :func:`claims_free` holds the gate while it tries every claim
of the corpus without waiting: one still held is a build under way. A builder that reaches the gate
during a drop waits the drop out (milliseconds), then finds the corpus gone, or builds it anew. A claim
left by a killed builder is free, and the next drop of the corpus removes it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

#: where the claims and the gates lie, under the store's root (:data:`condsearch.store.folder.VERSIONS`)
VERSIONS = ".versions"
CLAIM = ".claim.lock"
GATE = ".gate.lock"


def _digest(corpus: str) -> str:
    return hashlib.sha256(corpus.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _gate(root: Path, corpus: str) -> FileLock:
    return FileLock(root / VERSIONS / f".corpus-{_digest(corpus)}{GATE}")


@contextmanager
def claim(root: Path, corpus: str, name: str) -> Iterator[None]:
    """Hold a claim on corpus for the build of the index named name, for the ``with`` block."""
    folder = root / VERSIONS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.{_digest(corpus)}.{uuid.uuid4().hex[:12]}{CLAIM}"
    held = FileLock(path)
    with _gate(root, corpus):  # never held long: by a drop while it looks, or a builder while it claims
        held.acquire()
    try:
        yield
    finally:
        held.release()
        path.unlink(missing_ok=True)


@contextmanager
def claims_free(root: Path, corpus: str) -> Iterator[str | None]:
    """Hold the corpus's gate (no new build of it starts) and yield the index named by a claim still held, or None.

    Claims found free (left by a builder that died) are removed.
    """
    folder = root / VERSIONS
    folder.mkdir(parents=True, exist_ok=True)
    with _gate(root, corpus):
        busy: str | None = None
        for path in sorted(folder.glob(f"*.{_digest(corpus)}.*{CLAIM}")):
            try:
                with FileLock(path, timeout=0):
                    pass
            except Timeout:
                busy = path.name.split(".", 1)[0]
                break
            path.unlink(missing_ok=True)
        yield busy
