"""Refusing a path that is not a regular file before reading it, naming what it is.

A FIFO blocks its reader until a writer comes, ``/dev/zero`` never ends and a folder is no file:
a corpus or a query file is read only when it is a regular file (or a link to one).
"""

from __future__ import annotations

import stat
from pathlib import Path

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
