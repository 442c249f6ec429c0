"""The command line: the root group `main` and its commands, one module per concept.

The commands only parse flags, call one library function and print: ``index`` (index.py);
``query``, ``list`` and ``verify`` (query.py); ``serve`` (serve.py); ``export`` (export.py);
``train head|lora|full|router`` (train/); ``pairs`` (pairs.py). Options shared by several
commands have one home, options.py; what every command shares besides (one-line errors, JSON
lines) is common.py.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from condsearch.cli.adapt import adapt_cmd
from condsearch.cli.common import CONTEXT, check_utf8
from condsearch.cli.export import export_cmd
from condsearch.cli.index import index_cmd
from condsearch.cli.lifecycle import delete_cmd, rm_cmd
from condsearch.cli.pairs import pairs_cmd
from condsearch.cli.query import list_cmd, query_cmd, verify_cmd
from condsearch.cli.serve import serve_cmd
from condsearch.cli.train import train_cmd
from condsearch.errors import CondsearchError, first_line, os_reason
from condsearch.model.encoders import passive_waits
from condsearch.progress import set_quiet
from condsearch.version import __version__

__all__ = ["main"]


class _Commands(click.Group):
    """The command group; an OSError (permission denied, disk full) on any path ends as one line, not a traceback.

    Arguments that are not valid UTF-8 are refused before any command sees them: Python hands their
    bytes over as lone surrogates, which no tokenizer, JSON line or terminal takes.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:
            check_utf8(arg, "argument", usage=True)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise  # click ends quietly when stdout's reader goes away
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename is not None and exc.strerror else ""
            raise click.ClickException(where + os_reason(exc)) from exc


@click.group(cls=_Commands, context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="condsearch")
@click.option("-v", "--verbose", is_flag=True, help="Log more detail to stderr.")
@click.option("-q", "--quiet", is_flag=True, help="Draw no progress bars (they are drawn only on a terminal anyway).")
def main(verbose: bool, quiet: bool) -> None:
    """Conditional semantic search: index texts under a natural-language condition, query them.

    \b
    condsearch index corpus.parquet --condition "color of the dress"
    condsearch query "a girl in an orange dress" --condition "color of the dress"
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="condsearch: %(message)s", stream=sys.stderr
    )
    set_quiet(quiet)
    _quiet_transformers()
    passive_waits()  # before any command imports torch: its threads sleep rather than spin on a busy CPU


def _quiet_transformers() -> None:
    # transformers costs about a second to import: commands that never load a model (list,
    # serve's startup, --help) must not pay for it, so it is told by environment when not yet loaded.
    if "transformers" not in sys.modules:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        return
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


@main.command("demo-corpus", context_settings=CONTEXT)
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
def demo_corpus_cmd(out: Path) -> None:
    """Write the bundled demo corpus (captions varying colour, sport, place, …) to OUT as parquet."""
    from condsearch.corpus import write_demo_corpus

    try:
        n = write_demo_corpus(out)
    except CondsearchError as exc:
        raise click.ClickException(first_line(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"{out}: cannot write ({os_reason(exc)})") from exc
    click.echo(f"wrote {n} rows to {out}")


for command in (index_cmd, query_cmd, list_cmd, verify_cmd, serve_cmd, export_cmd, train_cmd, pairs_cmd, adapt_cmd):
    main.add_command(command)
for command in (rm_cmd, delete_cmd):  # issue 59
    main.add_command(command)
