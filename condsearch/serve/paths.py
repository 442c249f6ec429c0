"""No path of the server's machine in what it answers (issue 58): a refusal names a file by its last part only.

The library's errors name the files they are about (`condsearch verify` and the CLI need them); a server
must not hand a stranger the layout of its disks, so every error it answers and every name it lists goes
through :func:`hide_paths`: an absolute path whose top folder exists here (``/home/…``, ``/tmp/…``,
``/work/…``) is cut to its last part, so ``/srv/indexes/colour-5c5e39/manifest.json: corrupt`` reads
``manifest.json: corrupt``. A URL path of the API (``/builds/ID``) has no such top folder and is kept.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

#: an absolute POSIX path: a slash not inside a word or URL, then path characters up to a space, quote or separator
_ABSOLUTE = re.compile(r"(?<![\w.~:/-])/[^\s'\"(),;:<>\[\]{}|]+")


@functools.lru_cache(maxsize=256)
def _on_this_machine(top: str) -> bool:
    return bool(top) and os.path.isdir(os.sep + top)


def _shortened(match: re.Match[str]) -> str:
    path = match.group(0)
    top = path.lstrip("/").split("/", 1)[0]
    if not _on_this_machine(top):
        return path
    return os.path.basename(path.rstrip("/")) or "…"


def hide_paths(value: Any) -> Any:
    """Return value (a string, or lists and dicts of them) with every absolute path of this machine cut to its
    last part."""
    if isinstance(value, str):
        return _ABSOLUTE.sub(_shortened, value) if "/" in value else value
    if isinstance(value, dict):
        return {k: hide_paths(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [hide_paths(v) for v in value]
    return value
