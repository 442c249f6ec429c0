"""Replace a folder by a freshly written one, so that a crash leaves the old copy or the new, never a mix."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _previous(directory: Path) -> Path:
    return directory.with_name(f".{directory.name}.previous")


def recover_dir(directory: Path) -> None:
    """Put the previous copy of directory back if a crash came between the two renames of a replacement."""
    directory = Path(directory)
    previous = _previous(directory)
    if not directory.exists() and previous.is_dir():
        os.replace(previous, directory)


@contextmanager
def replacing_dir(directory: Path) -> Iterator[Path]:
    """Yield an empty folder beside directory to write into; when the block succeeds it becomes directory.

    The previous copy is renamed aside before the new one moves in and deleted only after, so
    at every moment either directory is whole or :func:`recover_dir` can restore it. A block
    that raises leaves directory untouched.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(directory)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    tmp.chmod(0o755)
    try:
        yield tmp
        previous = _previous(directory)
        if directory.exists():
            shutil.rmtree(previous, ignore_errors=True)
            os.replace(directory, previous)
        os.replace(tmp, directory)
        shutil.rmtree(previous, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
