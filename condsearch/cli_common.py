"""What every command of the CLI shares: click's settings, one-line failures, the index store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from condsearch.errors import CondsearchError, first_line

if TYPE_CHECKING:
    from condsearch.store import IndexStore

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def fail(exc: CondsearchError) -> click.ClickException:
    """Return the one-line error for exc: a usage error (exit 2) for flags that cannot go together, else exit 1."""
    from condsearch.artifacts.profiles import ProfileError

    if isinstance(exc, ProfileError):
        return click.UsageError(first_line(exc))
    return click.ClickException(first_line(exc))


def open_store(index_dir: Path | None) -> IndexStore:
    """Return the FAISS index store (imported here, so that --help stays fast)."""
    from condsearch.store import IndexStore

    return IndexStore(index_dir)
