"""`condsearch adapt`: fine-tune the shipped router on a table's labels; report its gain on rows kept aside."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from condsearch.cli.common import CONTEXT
from condsearch.cli.options import FiniteFloatRange, config_from, config_option, device_option
from condsearch.cli.pairs import _label_spec
from condsearch.corpus import FORMATS, CorpusConfig
from condsearch.errors import CondsearchError, first_line
from condsearch.train import ANCHORS, ID_COLUMN, AdaptConfig

_DEFAULTS = AdaptConfig()


@click.command("adapt", context_settings=CONTEXT)
@click.argument("table", type=click.Path(path_type=Path))
@click.option(
    "--label",
    "labels",
    multiple=True,
    required=True,
    metavar="COLUMN=CONDITION[|CONDITION…]",
    callback=_label_spec,
    help="A labelled column and its condition; '|' separates phrasings (the first is the one scored). "
    "One column gives pairs alike and unlike under it; two or more give contrast pairs.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Router folder to write (use it with --router OUT); it also holds report.json.",
)
@config_option(
    _DEFAULTS,
    "holdout",
    "--holdout",
    type=FiniteFloatRange(0, 1, min_open=True, max_open=True),
    help="Share of rows kept aside by id (seeded), never trained on, scored in the report.",
)
@config_option(
    _DEFAULTS,
    "validation",
    "--validation",
    type=FiniteFloatRange(0, 1, max_open=True),
    help="Share of the other rows kept to choose the interpolation with the start router (--anchor wise).",
)
@config_option(_DEFAULTS, "n_pairs", "--n-pairs", type=click.IntRange(min=1), help="Sentence pairs to draw.")
@config_option(
    _DEFAULTS,
    "fill_plain",
    "--fill-plain/--contrast-only",
    help="With two or more --label columns: fill what the contrast pairs leave of --n-pairs with pairs "
    "alike or unlike under one column (--contrast-only: contrast pairs alone).",
)
@config_option(_DEFAULTS, "epochs", "--epochs", type=click.IntRange(min=1), help="Passes over the pairs.")
@config_option(_DEFAULTS, "lr", "--lr", type=FiniteFloatRange(min=0, min_open=True), help="Learning rate.")
@config_option(
    _DEFAULTS, "batch_size", "--train-batch-size", type=click.IntRange(min=2), help="Rows per optimiser step."
)
@config_option(
    _DEFAULTS,
    "contrast_weight",
    "--contrast-weight",
    type=FiniteFloatRange(min=0),
    help="Weight of the in-condition contrastive term beside MSE (texts sharing the value left out of its negatives).",
)
@config_option(
    _DEFAULTS,
    "distill_weight",
    "--distill-weight",
    type=FiniteFloatRange(min=0),
    help="Weight of a term keeping each text's plain vector (no condition) where the start router put it "
    "(0: off); the anchor that keeps what the shipped router knows of other text.",
)
@config_option(
    _DEFAULTS,
    "replay_weight",
    "--replay-weight",
    type=FiniteFloatRange(min=0),
    help="Weight of the replay anchor: keeps the start router's vectors of the bundled captions under "
    "their conditions (0: off).",
)
@config_option(
    _DEFAULTS,
    "anchor",
    "--anchor",
    type=click.Choice(ANCHORS),
    help="wise: interpolate the trained weights with the start's, α chosen on the validation rows; none: keep them.",
)
@config_option(
    _DEFAULTS,
    "wise_keep",
    "--wise-keep",
    type=FiniteFloatRange(min=0, max=1),
    help="wise: the share of the best validation gain over the start router that the chosen α keeps "
    "(below 1: a smaller α, nearer the start router).",
)
@config_option(
    _DEFAULTS,
    "train_backbone",
    "--train-backbone",
    type=click.Choice(("top", "all")),
    help="Train the top layers that see the condition (over cached states), or the whole backbone.",
)
@config_option(
    _DEFAULTS, "report_rows", "--report-rows", type=click.IntRange(min=2), help="Most held rows scored per column."
)
@config_option(_DEFAULTS, "queries", "--queries", type=click.IntRange(min=1), help="Queries scored per column.")
@config_option(_DEFAULTS, "seed", "--seed", type=int, help="Seed of the split, the pairs and the training.")
@click.option("--router", default=None, help="Router folder to start from [default: the shipped router].")
@click.option("--model", default=None, help="Model id or local folder [default: the default model].")
@click.option(
    "--csts-dev",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A C-STS dev CSV: add the adapted router's Spearman on it to the report.",
)
@click.option("--text-column", default=CorpusConfig.text_column, show_default=True, help="Column holding the texts.")
@click.option(
    "--id-column",
    default=ID_COLUMN,
    show_default=True,
    help="Column the split hashes (the text when the table has none).",
)
@click.option(
    "--format",
    "table_format",
    type=click.Choice(FORMATS),
    default=CorpusConfig.format,
    help="Table file format [default: by extension].",
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Checkpoints, which a second run continues from [default: a folder under the cache named after --out].",
)
@click.option("--restart", is_flag=True, help="Drop a checkpoint left by an earlier run and start over.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@device_option
def adapt_cmd(
    table: Path,
    labels: tuple[Any, ...],
    out: Path,
    router: str | None,
    model: str | None,
    csts_dev: Path | None,
    text_column: str,
    id_column: str,
    table_format: str | None,
    checkpoint_dir: Path | None,
    restart: bool,
    as_json: bool,
    device: str | None,
    **params: Any,
) -> None:
    """Adapt the router to a table's labelled columns; report precision@10 on rows it kept aside.

    Draws pairs from the table's labels (as `condsearch pairs` does) on the rows not kept aside,
    fine-tunes the shipped router on them (minutes on a CPU; no C-STS files needed), and scores
    plain MiniLM, the shipped router and the adapted one on the held rows under each condition.
    Ctrl-C keeps a checkpoint; the same command continues from it. Then index with the result:

    \b
    condsearch adapt tickets.parquet --label "product=the product concerned" \\
        --label "severity=how urgent the ticket is" --out my-router
    condsearch index tickets.parquet -c "the product concerned" --router my-router
    """
    from condsearch.cli.train import check_out
    from condsearch.train import (
        adapt_router,
        check_adapt_paths,
        check_label_specs,
        default_checkpoint_dir,
        dumps_record,
    )

    try:
        config = config_from(AdaptConfig, params)
        check_label_specs(labels, text_column, contrast_only=False)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        check_adapt_paths(table, out)
    except CondsearchError as exc:
        raise click.ClickException(first_line(exc)) from exc
    check_out(out, "router", checkpoint_dir)
    checkpoints = checkpoint_dir or default_checkpoint_dir(out)
    try:
        report = adapt_router(
            table,
            labels,
            out,
            config,
            model=model,
            router=router,
            device=device,
            text_column=text_column,
            id_column=id_column,
            table_format=table_format,
            csts_dev=csts_dev,
            checkpoint_dir=checkpoints,
            restart=restart,
            say=lambda line: click.echo(line, err=True),
        )
    except (CondsearchError, KeyboardInterrupt) as exc:
        _say_kept(checkpoints)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise click.ClickException(first_line(exc)) from exc
    if as_json:
        click.echo(dumps_record(report))
        return
    click.echo(format_report(report))
    click.echo(f"wrote {out} (report: {out / 'report.json'}); use it with --router {out}")


def _say_kept(folder: Path) -> None:
    """Say on stderr where a run that stopped left its checkpoint, if it left one."""
    from condsearch.train import has_checkpoint

    try:
        if has_checkpoint(folder):
            click.echo(
                f"condsearch: checkpoint kept in {folder.resolve()}; the same command continues from it", err=True
            )
    except OSError:
        pass


def _pct(value: float, base: float) -> str:
    return f"{value / base - 1:+.1%}" if base and math.isfinite(value) and math.isfinite(base) else "—"


def format_report(report: Mapping[str, Any]) -> str:
    """Return the report's table: precision@10 on the held rows per condition, plain, start and adapted."""
    lines = [
        "precision@10 on the held rows (neighbours sharing the label the condition names):",
        f"{'condition':<44} {'plain':>7} {'router':>7} {'adapted':>8} {'vs plain':>9}",
    ]
    for column, row in report["held_p10"].items():
        name = f"{column}: {row['condition']}"
        name = name if len(name) <= 44 else name[:43] + "…"
        lines.append(
            f"{name:<44} {row['plain']:>7.3f} {row['start_router']:>7.3f} {row['adapted']:>8.3f} "
            f"{_pct(row['adapted'], row['plain']):>9}"
        )
    m = report["mean"]
    lines.append(
        f"{'mean':<44} {m['plain']:>7.3f} {m['start_router']:>7.3f} {m['adapted']:>8.3f} "
        f"{_pct(m['adapted'], m['plain']):>9}"
    )
    extra = f"interpolation α {report['alpha']:g}; {report['pairs']['pairs']} pairs; {report['train_seconds']:.0f} s"
    if report.get("csts_dev_spearman") is not None:
        extra += f"; C-STS dev {report['csts_dev_spearman']:.2f}"
    lines.append(extra)
    hint = more_pairs_hint(report)
    if hint:
        lines.append(hint)
    return "\n".join(lines)


def more_pairs_hint(report: Mapping[str, Any]) -> str:
    """Return a line saying what to try when the pairs used little of the table, else "".

    A pair names two texts, so n pairs name at most 2n of the training rows. On edict (10,113
    training rows) 6,000 pairs gained +8.9% over plain MiniLM where 2,000 gained +5.6%. Where two or
    more columns gave fewer contrast pairs than asked, filling with alike/unlike pairs (the default)
    paid most: news (1,497 contrast pairs) +22.2% filled (validation 0.463), +15.8% with contrast pairs
    alone and a second pass (``--epochs 4``; validation 0.441), +10.8% with neither
    (benchmarks/studies/adapt.md). The report names ``--fill-plain`` after ``--contrast-only`` left pairs out.
    """
    pairs = report["pairs"]
    drawn, asked = int(pairs["pairs"]), int(report["config"]["n_pairs"])
    fit, epochs = int(report["rows"]["fit"]), int(report["config"]["epochs"])
    if drawn >= asked and 2 * drawn < fit:
        return (
            f"the {drawn} pairs name at most {2 * drawn} of the {fit} training rows: a larger --n-pairs may pay "
            "(longer; the validation rows say whether it did)"
        )
    if drawn < asked and int(pairs.get("contrast", 0)) > 0 and not report["config"].get("fill_plain", False):
        return (
            f"the columns gave {drawn} contrast pairs of the {asked} asked for: --fill-plain (alike/unlike pairs "
            "for the rest) may pay (the validation rows say whether it did)"
        )
    if drawn < asked:
        return (
            f"the table gave {drawn} of the {asked} pairs asked for: --epochs {2 * epochs} may pay "
            "(longer; the validation rows say whether it did)"
        )
    return ""
