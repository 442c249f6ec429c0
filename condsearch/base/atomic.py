"""Atomic file and folder swaps (a crash leaves the old copy or the new, never a mix) and regular-file reads.

A folder is replaced by a freshly written one, a file by a freshly written file.

Only a condsearch artifact (or an empty folder) is ever replaced: ``--out ~/projects`` must not
delete someone's projects after a long training run. Nor is a file replaced unless it is a regular
file or a link: a rename over ``/dev/null`` (as root) replaces the device for everyone, a write to
``/dev/full`` only fails, and a FIFO is someone's pipe (:func:`check_replaceable_file`). Files that
condsearch reads back from its own folders are opened by :func:`open_regular`, which refuses a FIFO
or a device instead of blocking on it or reading it without end.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from condsearch.base.artifact_files import ARTIFACT_MARKERS, artifact_kind, check_own_artifact
from condsearch.base.regular_files import file_kind
from condsearch.errors import CondsearchError, StoreError, os_reason


class OutputDirError(CondsearchError):
    """A folder that condsearch was asked to write into is not its to replace, or cannot be written."""


class OutputFileError(CondsearchError):
    """A file that condsearch was asked to write is something a rename must not replace (a device, a FIFO)."""


def _previous(directory: Path) -> Path:
    return directory.with_name(f".{directory.name}.previous")


def _absolute(directory: Path | str) -> Path:
    # abspath, not resolve(): "." and "a/.." get their real names, but a symlink stays the link
    path = Path(os.path.abspath(directory))
    if not path.name:
        raise OutputDirError(f"{path}: refusing to replace a filesystem root")
    return path


def check_replaceable(directory: Path | str, kind: str | None = None) -> None:
    """Raise OutputDirError unless directory is absent, empty, or a condsearch artifact (of kind, when given)."""
    directory = _absolute(directory)
    if kind is not None and kind not in ARTIFACT_MARKERS:
        raise ValueError(f"unknown artifact kind {kind!r}")
    if not directory.exists():
        return
    if not directory.is_dir():
        raise OutputDirError(f"{directory}: exists and is not a folder; refusing to replace it")
    found = artifact_kind(directory)
    if found is None:
        if any(directory.iterdir()):
            raise OutputDirError(
                f"{directory}: not empty and not a condsearch artifact; refusing to replace it (name a new folder)"
            )
    elif kind is not None and found != kind:
        article = "an" if kind[0] in "aeiou" else "a"
        raise OutputDirError(f"{directory}: holds a condsearch {found}, not {article} {kind}; refusing to replace it")


def check_writable(directory: Path | str) -> None:
    """Raise OutputDirError unless a folder can be created beside directory (where replacing_dir writes)."""
    directory = _absolute(directory)
    existing = directory.parent
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent  # the folders in between are created as the last ones are
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{directory.name}-probe-", dir=existing))
    except OSError as exc:
        raise OutputDirError(f"{directory}: cannot write there ({os_reason(exc)})") from exc


def check_output_dir(directory: Path | str, kind: str) -> None:
    """Check, before any long work, that directory may be replaced by a kind artifact and can be written."""
    recover_dir(_absolute(directory))
    check_replaceable(directory, kind)
    check_writable(directory)


def check_artifact_outputs(out: Path | str, kind: str, checkpoint_dir: Path | str | None = None) -> None:
    """Refuse, before any training, an out (or checkpoint) folder that is not ours to replace or cannot be written."""
    for folder, what in ((out, kind), (checkpoint_dir, "checkpoint")):
        if folder is not None:
            recover_dir(_absolute(folder))  # a replacement cut off by a crash: judge the folder it left
            check_own_artifact(folder, what)
            check_output_dir(folder, what)


def recover_dir(directory: Path) -> None:
    """Put the previous copy of directory back if a crash came between the two renames of a replacement."""
    directory = Path(directory)
    previous = _previous(directory)
    if not directory.exists() and previous.is_dir():
        os.replace(previous, directory)


@contextmanager
def replacing_dir(directory: Path, kind: str | None = None) -> Iterator[Path]:
    """Yield an empty folder beside directory to write into; when the block succeeds it becomes directory.

    The previous copy is renamed aside before the new one moves in and deleted only after, so
    at every moment either directory is whole or :func:`recover_dir` can restore it. A block
    that raises leaves directory untouched. A directory that is neither empty nor a condsearch
    artifact (of ``kind``, when given) is refused with OutputDirError before anything is written.
    """
    directory = _absolute(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(directory)
    check_replaceable(directory, kind)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    tmp.chmod(0o755)
    try:
        yield tmp
        check_replaceable(directory, kind)  # again: the block may have run for hours
        swap_dir(tmp, directory, _previous(directory))
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


# The steps every writer shares: a file or a folder is written under a temporary name beside its
# final one and moved in with one rename, so that a reader or a crash sees the old or the new.


def temporary_name(path: Path, tag: str = "tmp") -> Path:
    """Return an unused hidden name beside path (``.<tag>-<name>-<pid>-<random>``), not created."""
    return path.with_name(f".{tag}-{path.name}-{os.getpid()}-{os.urandom(4).hex()}")


def check_replaceable_file(path: Path | str) -> None:
    """Raise OutputFileError unless path is absent, a regular file or a symlink (the link is replaced, not its target).

    A device, a FIFO, a socket or a folder is refused in one line, naming what it is.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:  # a folder on the way is a file, or is not searchable
        raise OutputFileError(f"{path}: cannot write it ({os_reason(exc)})") from None
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise OutputFileError(f"{path}: {file_kind(mode)}, not a regular file; refusing to replace it")


@contextmanager
def replacing_file(path: Path) -> Iterator[Path]:
    """Yield a temporary name beside path to write (a file or a symlink); when the block succeeds it becomes path.

    The rename replaces the regular file or link at path in one step. Anything else there (a device, a
    FIFO, a folder) is refused with OutputFileError before the block runs, and again before the rename.
    A block that raises leaves path untouched and the temporary removed.
    """
    check_replaceable_file(path)
    tmp = temporary_name(path)
    try:
        yield tmp
        check_replaceable_file(path)  # again: the block may have run for long
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def swap_dir(tmp: Path, directory: Path, aside: Path | None = None) -> None:
    """Make the finished folder tmp directory: a folder already there is renamed to aside first, deleted after.

    ``aside`` defaults to a fresh hidden name, so that two processes filling the same cache folder do
    not collide; :func:`replacing_dir` passes a fixed one so that :func:`recover_dir` can restore it
    after a crash between the two renames. Raises OSError if another process moved its own folder
    in between: that one is as good.
    """
    aside = aside if aside is not None else temporary_name(directory, "old")
    if directory.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(directory, aside)
    os.replace(tmp, directory)
    shutil.rmtree(aside, ignore_errors=True)


def fsync_dir(folder: Path) -> None:
    """Flush folder's entries (renames, new files) to disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_or_copy(src: Path, dst: Path) -> None:
    """Make dst a second name of src (a hard link: no data written), or a copy where links are refused.

    src stays where it is, so that work kept under it survives a failure of whatever dst is for.
    """
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise
        shutil.copyfile(src, dst, follow_symlinks=False)


# Reading back: a FIFO opened for reading blocks until a writer comes, and /dev/zero never ends.
# O_NONBLOCK makes the open return at once whatever the file is; fstat then refuses all but a
# regular file, on which O_NONBLOCK has no effect.


def open_regular(path: Path | str, *, dir_fd: int | None = None, where: Path | str | None = None) -> IO[bytes]:
    """Open a regular file to read, without blocking; raise StoreError for a FIFO, a device or a folder.

    ``dir_fd`` opens ``path`` relative to an open folder; ``where`` names the file in messages
    (default: ``path``). FileNotFoundError and other OSErrors of the open itself propagate.
    """

    def opener(name: str, flags: int) -> int:
        return os.open(name, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)

    fh = open(path, "rb", opener=opener)  # noqa: SIM115 - returned to the caller, who closes it
    try:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise StoreError(f"{where if where is not None else path}: not a regular file; refusing to read it")
    except BaseException:
        fh.close()
        raise
    return fh


def read_capped(fh: IO[bytes], max_bytes: int, where: Path | str) -> bytes:
    """Return the whole of an open file, refusing one of more than max_bytes (counted as read, not as stat says)."""
    data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise StoreError(f"{where}: too large (over {max_bytes} bytes); refusing to read it")
    return data
