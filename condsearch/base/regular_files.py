"""Refusing a path that is not a regular file before reading it, naming what it is.

A FIFO blocks its reader until a writer comes, ``/dev/zero`` never ends and a folder is no file:
every file condsearch is given to read (a corpus, a query file, training and dev CSVs, a pairs
table, a router's, head's, adapter's or profile's files) is read only when it is a regular file
(or a link to one). :func:`check_regular_file` says so by the path (for readers that take a path,
such as pyarrow's); :func:`open_regular_file` opens without blocking and checks what it opened.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

from condsearch.errors import CondsearchError, os_reason

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """Return what a file of this st_mode is, in words ("a FIFO (named pipe)", "a regular file")."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def check_regular_file(path: Path, error: type[CondsearchError]) -> None:
    """Raise ``error`` in one line unless path is a regular file: missing, unreadable, or what it is instead."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as exc:  # a loop of links, a name too long, a folder on the way not searchable
        raise error(f"{path}: cannot read it ({os_reason(exc)})") from None
    if not stat.S_ISREG(mode):
        raise error(f"{path}: {file_kind(mode)}, not a regular file; refusing to read it")


def open_regular_file(path: Path | str, error: type[CondsearchError]) -> IO[bytes]:
    """Open a regular file (or a link to one) to read in binary; raise ``error`` in one line if it is anything else.

    Opened without blocking (a FIFO's open waits for a writer), then checked by what was opened, so
    that the file cannot change between the check and the read. The OSError of the open itself (a
    missing file, a permission) propagates, for the caller to word. The caller closes what is returned.
    """

    def opener(name: str, flags: int) -> int:
        return os.open(name, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))

    fh = open(path, "rb", opener=opener)  # noqa: SIM115 - returned to the caller, who closes it
    try:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: {file_kind(mode)}, not a regular file; refusing to read it")
        os.set_blocking(fh.fileno(), True)
    except BaseException:
        fh.close()
        raise
    return fh
