"""`condsearch train head|lora|full|router`: the group, its light help, the old one-command spelling, shared options.

Each subcommand lives in its own module, imported only when it runs (or shows its help), so
that `condsearch --help` and `condsearch train --help` load no model library.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from condsearch.base import DEFAULT_MODEL
from condsearch.cli.options import FiniteFloatRange, config_option, device_option, trust_option
from condsearch.errors import CondsearchError, first_line
from condsearch.model.artifacts import MODE_CASE, MODE_CSR, MODES

F = TypeVar("F", bound=Callable[..., Any])

#: subcommand -> (module:attribute, the first line of its help); tests/cli/test_cli_train.py checks they agree
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "head": ("condsearch.cli.train.head:head_cmd", "Train the CASE projection head on the frozen encoder."),
    "lora": ("condsearch.cli.train.finetune:lora_cmd", "Fine-tune the encoder with LoRA adapters."),
    "full": ("condsearch.cli.train.finetune:full_cmd", "Fine-tune every weight of the encoder."),
    "router": ("condsearch.cli.train.router:router_cmd", "Train a CSR router: the paper, extended or context variant."),
}
_LEGACY_FLAGS = ("--finetune", "--mode")


def legacy_subcommand(args: list[str]) -> tuple[str, list[str]]:
    """Map the old ``train TRAIN_CSV [--finetune KIND] [--mode MODE] …`` to a subcommand and its arguments."""
    chosen = {"--finetune": "none", "--mode": MODE_CASE}
    rest: list[str] = []
    it = iter(args)
    for arg in it:
        flag, eq, value = arg.partition("=")
        if flag in _LEGACY_FLAGS:
            if not eq:
                value = next(it, "")
            chosen[flag] = value
        else:
            rest.append(arg)
    finetune, mode = chosen["--finetune"], chosen["--mode"]
    if finetune not in ("none", "lora", "full"):
        raise click.UsageError(f"--finetune: {finetune!r} is not one of none, lora, full")
    if mode not in MODES:
        raise click.UsageError(f"--mode: {mode!r} is not one of {', '.join(MODES)}")
    if finetune != "none" and mode == MODE_CSR:
        raise click.UsageError("--finetune applies to --mode case")
    return (finetune if finetune != "none" else "router" if mode == MODE_CSR else "head"), rest


class TrainGroup(click.Group):
    """Subcommands loaded on first use; a first argument that names none is the old one-command spelling."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        module, _, attr = SUBCOMMANDS[cmd_name][0].partition(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, short) in SUBCOMMANDS.items()])

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in SUBCOMMANDS and not set(args) & set(ctx.help_option_names):
            name, rest = legacy_subcommand(args)
            click.echo(
                f"condsearch: 'train TRAIN_CSV …' is deprecated; this runs 'condsearch train {name} TRAIN_CSV …'",
                err=True,
            )
            args = [name, *rest]
        return super().parse_args(ctx, args)


@click.group("train", cls=TrainGroup)
def train_cmd() -> None:
    """Train a head, a LoRA adapter, a whole model or a CSR router on C-STS style CSVs.

    A CSV holds sentence1, sentence2, condition and label (1-5); several may be given, each as
    PATH:WEIGHT to weight it (2: its pairs twice an epoch, 0.5: half of them, drawn by --seed;
    `condsearch pairs` writes such a CSV from a labelled table). Each subcommand writes one
    artifact into --out: `head` a projection head (use it with --profile OUT), `lora` an adapter
    (--profile OUT), `full` a model folder (--model OUT), `router` a CSR router (--mode csr --router
    OUT). `condsearch train SUBCOMMAND --help` lists its options.
    """


def _sources(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[Any, ...]:
    """Return TRAIN_CSV[:WEIGHT]... as condsearch.train.mixture.TrainSource, or raise BadParameter."""
    from condsearch.train import parse_train_source

    try:
        return tuple(parse_train_source(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from exc


def common_options(defaults: object, out_help: str) -> Callable[[F], F]:
    """Add what every subcommand takes: the TRAIN_CSVs, --out, --dev, the model, the config's epochs, lr, batch, seed.

    defaults: the subcommand's config at its defaults (HeadTrainConfig(), FinetuneConfig(kind=...), ...).
    """
    decorators = [
        click.argument("train_csv", nargs=-1, required=True, metavar="TRAIN_CSV[:WEIGHT]...", callback=_sources),
        click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help=out_help),
        click.option(
            "--dev",
            "dev_csv",
            type=click.Path(path_type=Path),
            default=None,
            help="Dev CSV: keep the epoch with the best dev Spearman.",
        ),
        config_option(
            defaults, "epochs", "--epochs", type=click.IntRange(min=1), help="Passes over the training rows."
        ),
        config_option(defaults, "lr", "--lr", type=FiniteFloatRange(min=0, min_open=True), help="Learning rate."),
        config_option(
            defaults,
            "batch_size",
            "--train-batch-size",
            type=click.IntRange(min=1),
            help="Rows per optimiser step.",
        ),
        config_option(defaults, "seed", "--seed", type=int, help="Seed for initialisation and shuffling."),
        click.option("--model", default=None, help=f"Model id or local folder [default: {DEFAULT_MODEL}]."),
        click.option(
            "--max-length",
            default=None,
            type=click.IntRange(min=8),
            help="Token limit per input [default: the model's].",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the training summary as JSON."),
        device_option,
        trust_option,
    ]

    def decorate(command: F) -> F:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return decorate


def encode_batch_option(default: int, help: str) -> Callable[[F], F]:
    """Return --batch-size: pairs per encoder forward pass, passed as encode_batch_size."""
    return click.option(
        "--batch-size", "encode_batch_size", default=default, show_default=True, type=click.IntRange(min=1), help=help
    )


def check_out(out: Path, kind: str, checkpoint_dir: Path | None = None) -> None:
    """Refuse, before any training, an --out or --checkpoint-dir not ours to replace or not writable, or the two nested.

    Nested: one folder, or either inside the other (each save replaces its folder whole).
    """
    from condsearch.base import check_artifact_outputs
    from condsearch.train import check_checkpoint_dir

    try:
        check_checkpoint_dir(out, checkpoint_dir)
        check_artifact_outputs(out, kind, checkpoint_dir)
    except CondsearchError as exc:
        raise click.ClickException(first_line(exc)) from exc


def report_epoch(epoch: int, loss: float, dev: Mapping[str, float] | None) -> None:
    """Print one epoch's loss (and dev Spearman) on stderr."""
    extra = f"  dev spearman {dev['spearman']:.2f}" if dev else ""
    click.echo(f"epoch {epoch:>3}  loss {loss:.5f}{extra}", err=True)


def run_training(
    train: Callable[[], dict[str, Any]],
    as_json: bool,
    describe: Callable[[dict[str, Any]], str],
    checkpoints: Path | None = None,
) -> None:
    """Run train() and print its summary: as JSON, or as describe(summary); a library error as one line.

    checkpoints: the folder the run checkpoints into; a run that fails or is interrupted names it
    when it holds a checkpoint (--resume continues from it), as a successful run names the folder
    its summary says was kept.
    """
    from condsearch.train import dumps_record

    try:
        summary = train()
    except (CondsearchError, KeyboardInterrupt) as exc:
        _name_kept_checkpoints(checkpoints)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise click.ClickException(first_line(exc)) from exc
    if as_json:
        click.echo(dumps_record(summary))
        return
    click.echo(describe(summary))
    if summary.get("checkpoint_dir"):
        click.echo(f"checkpoints kept in {summary['checkpoint_dir']}")


def _name_kept_checkpoints(folder: Path | None) -> None:
    """Say on stderr where a run that stopped left its checkpoints, if it left any."""
    from condsearch.train import has_checkpoint

    if folder is None:
        return
    try:
        if not has_checkpoint(folder):
            return
    except OSError:
        return
    click.echo(f"condsearch: checkpoints kept in {folder.resolve()}; --resume continues from them", err=True)


def dev_note(summary: Mapping[str, Any], sep: str = "; ") -> str:
    """Return the summary's best dev Spearman as text ('' without a dev set)."""
    best = summary.get("dev_spearman")
    return f"{sep}dev spearman {best:.2f}" if isinstance(best, float) else ""
