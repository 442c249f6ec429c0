"""`condsearch rm` and `delete`: remove a corpus's indexes, or rows of a corpus by id (issue 59)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from condsearch.cli.common import CONTEXT, fail, open_store
from condsearch.cli.options import index_dir_option
from condsearch.errors import CondsearchError


@click.command("rm", context_settings=CONTEXT)
@click.argument("corpus")
@click.option("-c", "--condition", default=None, help="Remove only this condition's index [default: every one].")
@click.option("--yes", is_flag=True, help="Do not ask; required where stdin is not a terminal.")
@index_dir_option
def rm_cmd(corpus: str, condition: str | None, yes: bool, index_dir: Path) -> None:
    """Remove CORPUS's indexes (or one condition's) and their files.

    Refused while a build or change of the corpus is under way; queries under way finish on the old files.
    """
    from condsearch.store import corpus_indexes, drop

    store = open_store(index_dir)
    try:
        corpus, mine = corpus_indexes(store, corpus)
        if condition is not None:
            name = store.find(condition, corpus)
            mine = [(n, m) for n, m in mine if n == name]
        what = f"{len(mine)} index{'es' if len(mine) != 1 else ''} of corpus {corpus!r}"
        if not yes:
            if not sys.stdin.isatty():
                raise click.ClickException(f"not a terminal: pass --yes to remove {what}")
            click.confirm(f"remove {what} ({', '.join(repr(m.condition) for _, m in mine)})?", abort=True)
        removed = drop(store, corpus, condition)
    except CondsearchError as exc:
        raise fail(exc) from exc
    click.echo(f"removed {len(removed)} index{'es' if len(removed) != 1 else ''} of corpus {corpus!r}")


@click.command("delete", context_settings=CONTEXT)
@click.argument("corpus")
@click.option(
    "--ids",
    "ids_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="File of ids to delete, one a line (blank lines skipped).",
)
@index_dir_option
def delete_cmd(corpus: str, ids_file: Path, index_dir: Path) -> None:
    """Delete rows of CORPUS by id, from every index of it at once (nothing is encoded).

    Ids not in the corpus are refused in one line, with nothing changed.
    """
    from condsearch.base import open_regular
    from condsearch.ingest import change_corpus

    try:
        with open_regular(ids_file) as fh:
            raw = fh.read()
        ids: list[str | int] = [line.strip() for line in raw.decode("utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"{ids_file}: cannot read ids ({type(exc).__name__})") from exc
    except CondsearchError as exc:
        raise fail(exc) from exc
    if not ids:
        raise click.ClickException(f"{ids_file}: no ids in it")
    try:
        report = change_corpus(open_store(index_dir), corpus, delete=ids)
    except CondsearchError as exc:
        raise fail(exc) from exc
    click.echo(f"deleted {report.n_deleted} rows from {len(report.indexes)} indexes of corpus {report.corpus!r}")
