"""`condsearch train --finetune lora|full`: its options and the thin shell over condsearch.finetune."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from condsearch.errors import CondsearchError, first_line

FINETUNE_CHOICES = ("none", "lora", "full")
_TARGETS = "query,key,value,attn_out,ffn_in,ffn_out"
CSR_LOSSES = ("mse", "wacl", "mse+wacl")


def finetune_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the fine-tuning options to the train command."""
    options = [
        click.option(
            "--finetune",
            type=click.Choice(FINETUNE_CHOICES),
            default="none",
            show_default=True,
            help=(
                "--mode case: none trains the head on the frozen encoder; lora trains low-rank adapters "
                "(written to --out, used with --head OUT); full trains every weight (a model folder in --out, "
                "used with --model OUT)."
            ),
        ),
        click.option("--lora-rank", default=16, show_default=True, type=click.IntRange(min=1), help="Adapter rank."),
        click.option(
            "--lora-alpha",
            default=32.0,
            show_default=True,
            type=click.FloatRange(min=0, min_open=True),
            help="Adapter scale numerator (update scaled by alpha/rank).",
        ),
        click.option(
            "--lora-dropout",
            default=0.1,
            show_default=True,
            type=click.FloatRange(0, 1, max_open=True),
            help="Dropout on the adapters' input.",
        ),
        click.option(
            "--lora-targets",
            default=_TARGETS,
            show_default=True,
            help="Comma-separated projections to adapt.",
        ),
        click.option(
            "--head-on-top",
            is_flag=True,
            help="Also train a --dim projection head jointly (saved beside the adapter or model).",
        ),
        click.option(
            "--init-head",
            default=None,
            help="Under --head-on-top: start the head from this trained head (a folder, 'default' or 'frozen').",
        ),
        click.option(
            "--head-lr",
            default=1e-3,
            show_default=True,
            type=click.FloatRange(min=0, min_open=True),
            help="Learning rate of the head under --head-on-top.",
        ),
        click.option(
            "--layer-decay",
            default=None,
            type=click.FloatRange(0, 1, min_open=True),
            help="Layer-wise learning-rate decay: each encoder layer below the top learns at this times the rate "
            "of the one above, the embeddings one step lower still [default: 1.0, off].",
        ),
        click.option("--quad-margin", default=1.0, show_default=True, type=float, help="Margin of the quad loss."),
        click.option(
            "--bcl-temperature",
            default=5.0,
            show_default=True,
            type=click.FloatRange(min=0, min_open=True),
            help="Temperature of the bcl loss (cos/τ; CCL's tuned values are 3-10).",
        ),
        click.option(
            "--bcl-sigma",
            default=0.5,
            show_default=True,
            type=click.FloatRange(0, 1),
            help="bcl: a pair's own second sentence is no negative once its scaled label reaches this.",
        ),
        click.option(
            "--checkpoint-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="Per-epoch checkpoints [default: under the cache folder, named after --out].",
        ),
        click.option(
            "--checkpoint-every",
            default=0,
            show_default=True,
            type=click.IntRange(min=0),
            help="Also checkpoint every N optimiser steps within an epoch (0: at epoch ends only).",
        ),
        click.option(
            "--keep-epochs",
            is_flag=True,
            help="Keep each epoch's weights in the checkpoint folder (epoch-N.safetensors), e.g. to average them.",
        ),
        click.option("--resume", is_flag=True, help="Continue from the last checkpoint (an epoch end or within one)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def parse_losses(spec: str) -> tuple[tuple[str, float], ...]:
    """Return --loss as (name, weight) pairs, or raise UsageError."""
    from condsearch.losses import parse_loss_spec

    try:
        return tuple(parse_loss_spec(spec).items())
    except ValueError as exc:
        raise click.UsageError(f"--loss: {exc}") from exc


def check_head_only(mode: str, loss: str, options: dict[str, Any]) -> None:
    """Refuse fine-tuning flags and objectives on the head-only (--finetune none) and csr paths."""
    if options["head_on_top"] or options["resume"] or options["checkpoint_dir"] is not None or options["init_head"]:
        raise click.UsageError("--head-on-top, --init-head, --resume and --checkpoint-dir need --finetune lora or full")
    if options["checkpoint_every"] or options["keep_epochs"] or options["layer_decay"] is not None:
        raise click.UsageError("--checkpoint-every, --keep-epochs and --layer-decay need --finetune lora or full")
    if mode == "csr" and loss not in CSR_LOSSES:
        raise click.UsageError(f"--mode csr takes --loss {', '.join(CSR_LOSSES)}")
    if mode == "case" and loss != "mse":
        raise click.UsageError("--loss other than mse needs --finetune lora or full (the head alone trains on mse)")


def _family(model: str | None) -> str | None:
    """Return the family of --model from its config (None when it cannot be read here; loading reports why)."""
    from condsearch.encoders import model_config
    from condsearch.encoders.family import detect_family
    from condsearch.models import resolve_model

    try:
        return detect_family(model_config(resolve_model(model)))
    except CondsearchError:
        return None


def _init_head(spec: str | None, model: str | None) -> str | None:
    """Resolve --init-head (a folder or a shipped head's name) to a folder path."""
    if spec is None:
        return None
    from condsearch.models import resolve_model
    from condsearch.pipeline import head_folder

    try:
        folder = head_folder(spec, resolve_model(model).model_id)
    except CondsearchError as exc:
        raise click.UsageError(f"--init-head: {exc}") from exc
    if folder is None:
        raise click.UsageError("--init-head none: leave the option out for a fresh head")
    from condsearch.finetune.adapter import has_adapter

    if has_adapter(folder):
        raise click.UsageError(f"--init-head {spec}: that head goes with a LoRA adapter; name a frozen-encoder head")
    return str(folder)


def run_finetune(
    *,
    train_csv: Path,
    out: Path,
    dev_csv: Path | None,
    loss: str,
    epochs: int | None,
    lr: float | None,
    train_batch_size: int | None,
    dim: int,
    dropout: float,
    seed: int,
    model: str | None,
    batch_size: int,
    max_length: int | None,
    device: str | None,
    trust_remote_code: bool,
    as_json: bool,
    encoder_flags: dict[str, Any],
    options: dict[str, Any],
) -> None:
    """Build the config from the flags, fine-tune, save, report."""
    from condsearch.finetune.lora import LoraConfig
    from condsearch.finetune.run import finetune_and_save
    from condsearch.finetune.trainer import DEFAULT_LR, FinetuneConfig

    if encoder_flags["dtype"] != "auto":
        raise click.UsageError("--finetune trains in float32; leave --dtype at auto")
    if _family(model) != "decoder":
        if encoder_flags["pooling"] not in ("auto", "condition-mean"):
            raise click.UsageError("--finetune trains BERT-style encoders with condition-mean pooling")
        if any(encoder_flags.get(k) for k in ("prompt_template", "unconditional_template", "preset")):
            raise click.UsageError("--finetune encodes text pairs; prompt templates and presets apply to decoders")
    settings = {k: encoder_flags.get(k) for k in ("pooling", "prompt_template", "unconditional_template")}
    settings |= {k: encoder_flags.get(k) for k in ("bidirectional_layers", "preset")}
    kind = options["finetune"]
    try:
        lora = LoraConfig(
            rank=options["lora_rank"],
            alpha=options["lora_alpha"],
            dropout=options["lora_dropout"],
            targets=tuple(t.strip() for t in options["lora_targets"].split(",") if t.strip()),
        )
        config = FinetuneConfig(
            kind=kind,
            epochs=epochs or 3,
            batch_size=train_batch_size or 32,
            lr=lr or DEFAULT_LR[kind],
            head_lr=options["head_lr"],
            losses=parse_losses(loss),
            margin=options["quad_margin"],
            bcl_temperature=options["bcl_temperature"],
            bcl_sigma=options["bcl_sigma"],
            head_on_top=options["head_on_top"],
            head_dim=dim,
            head_dropout=dropout,
            init_head=_init_head(options["init_head"], model),
            lora=lora,
            seed=seed,
            # left out when not given: the default lives in FinetuneConfig alone
            **({"layer_decay": options["layer_decay"]} if options["layer_decay"] is not None else {}),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc

    def report(epoch: int, row: dict[str, float]) -> None:
        dev = f"  dev spearman {row['dev_spearman']:.2f}" if "dev_spearman" in row else ""
        click.echo(f"epoch {epoch:>3}  loss {row['loss']:.5f}  {row['train_seconds']:.0f}s{dev}", err=True)

    try:
        summary = finetune_and_save(
            train_csv,
            out,
            config,
            dev_csv=dev_csv,
            model=model,
            device=device,
            max_length=max_length,
            trust_remote_code=trust_remote_code,
            checkpoint_dir=options["checkpoint_dir"],
            resume=options["resume"],
            checkpoint_every=options["checkpoint_every"],
            keep_epochs=options["keep_epochs"],
            eval_batch_size=batch_size,
            on_epoch=report,
            encoder_settings=settings,
        )
    except CondsearchError as exc:
        raise click.ClickException(first_line(exc)) from exc
    if as_json:
        click.echo(json.dumps(summary))
        return
    best = summary.get("dev_spearman")
    use = (
        f"--head {out}" if kind == "lora" else f"--model {out}" + (" --head " + str(out) if config.head_on_top else "")
    )
    click.echo(
        f"wrote {out} ({kind}, best epoch {summary['best_epoch']}"
        + (f", dev spearman {best:.2f}" if isinstance(best, float) else "")
        + f"); use it with {use}"
    )
