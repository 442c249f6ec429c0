"""What every command shares besides its options: click's settings, one-line failures, JSON lines, the store."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from condsearch.errors import CondsearchError, first_line

if TYPE_CHECKING:
    from condsearch.errors import CaseVariant
    from condsearch.store import IndexStore

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def fail(exc: CondsearchError) -> click.ClickException:
    """Return the one-line error for exc: a usage error (exit 2) for flags that cannot go together, else exit 1."""
    from condsearch.model.artifacts import ProfileError

    if isinstance(exc, ProfileError):
        return click.UsageError(first_line(exc))
    return click.ClickException(first_line(exc))


def check_utf8(text: str, what: str, *, usage: bool = False) -> str:
    """Return text if it encodes as UTF-8; else raise a one-line error naming it (a usage error with ``usage``).

    Undecodable bytes reach Python as lone surrogates (``\\udcff``), which no tokenizer or JSON output takes.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        message = f"{what} {ascii(text[:60])} is not valid UTF-8"
        raise (click.UsageError(message) if usage else click.ClickException(message)) from None
    return text


#: characters that JSON lets stand raw but that str.splitlines() and some JSON-lines readers take as line ends
_LINE_ENDS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def json_line(obj: object) -> str:
    """Return obj as one line of JSON, non-ASCII text as is but for the characters some readers end lines at."""
    text = json.dumps(obj, ensure_ascii=False)
    for raw, escaped in _LINE_ENDS.items():
        text = text.replace(raw, escaped)
    return text


def open_store(index_dir: Path | None) -> IndexStore:
    """Return the FAISS index store (imported here, so that --help stays fast)."""
    from condsearch.store import IndexStore

    return IndexStore(index_dir)


#: a build under a case-only variant of an indexed condition: the flag that builds it without asking (issue 59)
yes_option = click.option(
    "--yes",
    is_flag=True,
    help=(
        "Build under a condition that differs from one the corpus is indexed under only in case without asking "
        "(a cased model's second index); required where stdin is not a terminal."
    ),
)


def stdin_is_terminal() -> bool:
    """Return whether a user can answer a question on stdin (a test puts a terminal in its place)."""
    return sys.stdin.isatty()


def confirm_case_variant(exc: CaseVariant, condition: str) -> None:
    """Ask whether to build a second index under condition beside exc's existing one; refuse where none can answer.

    Returns when the user says yes. Without a terminal on stdin, one line and exit 1; a no aborts (exit 1). Either
    way nothing has been built.
    """
    if not stdin_is_terminal():
        raise click.ClickException(f"{first_line(exc)}; query under that one, or pass --yes to build {condition!r}")
    click.confirm(f"{first_line(exc)}. Build a second index under {condition!r}?", abort=True, err=True)
