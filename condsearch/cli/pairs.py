"""`condsearch pairs`: conditional training pairs from a table's labelled columns (condsearch.train.pairs)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from condsearch.cli.common import CONTEXT
from condsearch.cli.options import FiniteFloatRange, config_option
from condsearch.corpus import FORMATS, LABEL_MAX, LABEL_MIN, CorpusConfig
from condsearch.errors import CondsearchError, first_line
from condsearch.train import LabelSpec, PairsConfig, check_label_specs, parse_label_spec

_DEFAULTS = PairsConfig()


def _label_spec(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[LabelSpec, ...]:
    try:
        return tuple(parse_label_spec(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from exc


@click.command("pairs", context_settings=CONTEXT)
@click.argument("table", type=click.Path(path_type=Path))
@click.option(
    "--label",
    "labels",
    multiple=True,
    required=True,
    metavar="COLUMN=CONDITION[|CONDITION…]",
    callback=_label_spec,
    help="A labelled column and its condition; '|' separates phrasings (one is chosen per row). Repeat for "
    "each column: contrast pairs need two.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="File to write the rows into: CSV (what train reads), or parquet / JSON lines by extension.",
)
@config_option(_DEFAULTS, "n_pairs", "--n-pairs", type=click.IntRange(min=1), help="Sentence pairs to draw.")
@config_option(
    _DEFAULTS,
    "max_per_value",
    "--max-per-value",
    type=click.IntRange(min=1),
    help="Most pairs whose texts share one value of a column [default: twice the value's even share].",
)
@config_option(
    _DEFAULTS,
    "high",
    "--high",
    type=FiniteFloatRange(LABEL_MIN, LABEL_MAX),
    help="Label under the condition the two texts are alike on.",
)
@config_option(
    _DEFAULTS,
    "low",
    "--low",
    type=FiniteFloatRange(LABEL_MIN, LABEL_MAX),
    help="Label under the condition they differ on.",
)
@click.option(
    "--contrast-only/--no-contrast-only",
    default=_DEFAULTS.contrast_only,
    show_default=True,
    help="Only contrast pairs, or fill up to --n-pairs with plain pairs (alike or unlike on one column).",
)
@config_option(_DEFAULTS, "seed", "--seed", type=int, help="Seed of every random choice.")
@click.option("--text-column", default=CorpusConfig.text_column, show_default=True, help="Column holding the texts.")
@click.option(
    "--format",
    "table_format",
    type=click.Choice(FORMATS),
    default=CorpusConfig.format,
    help="Table file format [default: by extension: .parquet, .csv, .jsonl/.ndjson; else parquet].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary (pairs per condition and value) as JSON.")
def pairs_cmd(
    table: Path,
    labels: tuple[LabelSpec, ...],
    out: Path,
    n_pairs: int,
    max_per_value: int | None,
    high: float,
    low: float,
    contrast_only: bool,
    seed: int,
    text_column: str,
    table_format: str | None,
    as_json: bool,
) -> None:
    """Write conditional training pairs (C-STS rows) drawn from a table's labelled columns.

    Two texts that share one column's value and differ on another's give two rows, as C-STS
    gives every pair: under the first column's condition with the --high label, under the
    second's with the --low one. Columns take turns and so do their values (at most
    --max-per-value pairs each). Train on the rows beside C-STS, each file with a weight:

    \b
    condsearch pairs catalogue.parquet --label "category=the kind of product|the product's category" \\
        --label "brand=the maker" --out pairs.csv
    condsearch train router csts-train.csv pairs.csv:0.5 --variant context --out my-router
    """
    from condsearch.train import check_output, make_pairs, read_labelled, write_pairs

    try:
        config = PairsConfig(
            n_pairs=n_pairs, max_per_value=max_per_value, high=high, low=low, contrast_only=contrast_only, seed=seed
        )
        check_label_specs(labels, text_column, contrast_only=config.contrast_only)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        check_output(out, [table])
        data = read_labelled(table, [s.column for s in labels], text_column, format=table_format)
        result = make_pairs(data.texts, data.labels, labels, config)
        fmt = write_pairs(result.rows, out)
    except CondsearchError as exc:
        raise click.ClickException(first_line(exc)) from exc
    summary = {"out": str(out), "format": fmt, "texts": len(data.texts), **result.summary()}
    if result.n_pairs < config.n_pairs:
        click.echo(
            f"condsearch: drew {result.n_pairs} of the {config.n_pairs} pairs asked; no more were found", err=True
        )
    if as_json:
        click.echo(json.dumps(summary, ensure_ascii=False))
    else:
        plain = f", {result.n_plain} plain" if not config.contrast_only else ""
        click.echo(f"wrote {len(result.rows)} rows ({result.n_contrast} contrast pairs{plain}) to {out}")
