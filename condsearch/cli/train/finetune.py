"""`condsearch train lora` and `condsearch train full`: their options, a thin shell over condsearch.train.finetune."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from condsearch.cli.options import FINITE_FLOAT, FiniteFloatRange, config_from, config_option, encoder_options, given
from condsearch.cli.train import check_out, common_options, dev_note, encode_batch_option, run_training
from condsearch.errors import CondsearchError, first_line
from condsearch.model.encoders import ENCODE_BATCH_SIZE, model_family
from condsearch.train import FinetuneConfig, LoraConfig, format_loss_spec

F = TypeVar("F", bound=Callable[..., Any])
_HEAD_FLAGS = ("head_dim", "head_dropout", "head_lr", "init_head")
_DECODER_FLAGS = ("prompt_template", "unconditional_template", "bidirectional_layers", "preset")


def _finetune_options(kind: str) -> Callable[[F], F]:
    """Add the options of `train lora` / `train full`, their defaults read from FinetuneConfig(kind=kind)."""
    defaults = FinetuneConfig(kind=kind)
    out_help = {
        "lora": "Folder to write the adapter (and --head-on-top's head) into; use it with --profile OUT.",
        "full": "Folder to write the model (and --head-on-top's head) into; use it with --model OUT.",
    }[kind]
    decorators = [
        common_options(defaults, out_help),
        click.option(
            "--loss",
            default=format_loss_spec(defaults.losses),
            show_default=True,
            help=(
                "Objective: mse (on the scaled label), quad (C-STS quadruplet margin), wacl (CCL eq. 9), bcl (CCL "
                "eq. 10), cmse (CCL's C-MSE: mse in a contrastive projection's space, where bcl then compares too), "
                "weighted as 'mse=1,wacl=0.5' ('+' joins at weight 1)."
            ),
        ),
        config_option(defaults, "margin", "--quad-margin", type=FINITE_FLOAT, help="Margin of the quad loss."),
        config_option(
            defaults,
            "bcl_temperature",
            "--bcl-temperature",
            type=FiniteFloatRange(min=0, min_open=True),
            help="Temperature of the bcl loss (cos/τ; CCL's tuned values are 3-10).",
        ),
        config_option(
            defaults,
            "bcl_sigma",
            "--bcl-sigma",
            type=FiniteFloatRange(0, 1),
            help="bcl: a pair's own second sentence is no negative once its scaled label reaches this.",
        ),
        config_option(
            defaults,
            "anchor_weight",
            "--anchor-weight",
            type=FiniteFloatRange(min=0),
            help="Ours: also pull each training sentence's plain vector (the text alone) toward the base model's, "
            "by this weight times 1 - cos (0: off), to keep what the base model knows out of domain.",
        ),
        config_option(
            defaults,
            "blend",
            "--blend",
            type=FiniteFloatRange(0, 1, min_open=True),
            help="Ours: fit and choose on B × the CASE cosine + (1 - B) × the base model's plain cosine of the two "
            "texts, to train the CASE vectors as the CASE part of such a blend (1: off).",
        ),
        config_option(
            defaults,
            "layer_decay",
            "--layer-decay",
            type=FiniteFloatRange(0, 1, min_open=True),
            help="Layer-wise learning-rate decay: each encoder layer below the top learns at this times the rate "
            "of the one above, the embeddings one step lower still (1: off).",
        ),
        click.option(
            "--head-on-top",
            "head_on_top",
            is_flag=True,
            help="Also train a --dim projection head jointly (saved beside the adapter or model).",
        ),
        config_option(
            defaults, "head_dim", "--dim", type=click.IntRange(min=1), help="--head-on-top: output dimension."
        ),
        config_option(
            defaults,
            "head_dropout",
            "--dropout",
            type=FiniteFloatRange(0, 1, max_open=True),
            help="--head-on-top: dropout after the head's activation (training only).",
        ),
        config_option(
            defaults,
            "head_lr",
            "--head-lr",
            type=FiniteFloatRange(min=0, min_open=True),
            help="--head-on-top: the head's learning rate.",
        ),
        click.option(
            "--init-head",
            "init_head",
            default=None,
            help="--head-on-top: start the head from this trained head (a folder, 'default' or 'frozen').",
        ),
        encode_batch_option(ENCODE_BATCH_SIZE, "Pairs per forward pass when scoring --dev."),
        click.option(
            "--checkpoint-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help=(
                "Per-epoch checkpoints, kept after a successful run [default: a folder under the cache, named "
                "after --out, removed once --out is saved unless --keep-epochs]."
            ),
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

    def decorate(command: F) -> F:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return decorate


def _lora_options(command: F) -> F:
    """Add the adapter's options (defaults from LoraConfig) and the decoder embedders' encoder options."""
    lora = LoraConfig()
    command = cast(F, encoder_options(command))
    # fine-tuning trains in float32: --dtype would have one allowed value, so it is no option here
    command.__click_params__ = [p for p in command.__click_params__ if p.name != "dtype"]  # type: ignore[attr-defined]
    for option in reversed(
        [
            config_option(lora, "rank", "--lora-rank", type=click.IntRange(min=1), help="Adapter rank."),
            config_option(
                lora,
                "alpha",
                "--lora-alpha",
                type=FiniteFloatRange(min=0, min_open=True),
                help="Adapter scale numerator (update scaled by alpha/rank).",
            ),
            config_option(
                lora,
                "dropout",
                "--lora-dropout",
                type=FiniteFloatRange(0, 1, max_open=True),
                help="Dropout on the adapters' input.",
            ),
            config_option(lora, "targets", "--lora-targets", help="Comma-separated projections to adapt."),
        ]
    ):
        command = option(command)
    return command


@click.command("lora")
@_finetune_options("lora")
@_lora_options
@click.pass_context
def lora_cmd(ctx: click.Context, **params: Any) -> None:
    """Fine-tune the encoder with LoRA adapters.

    Low-rank adapters train on the encoder's projections (BERT-style encoders with condition-mean
    pooling, or decoder embedders on their prompts), checkpointed after each epoch; --resume
    continues. The adapter folder in --out is used with --profile OUT.
    """
    if model_family(params["model"]) != "decoder":
        if params["pooling"] not in ("auto", "condition-mean"):
            raise click.UsageError("train lora trains BERT-style encoders with condition-mean pooling")
        if flags := given(ctx, *_DECODER_FLAGS):
            raise click.UsageError(f"{', '.join(flags)}: prompts and attention settings apply to decoder embedders")
    try:
        targets = tuple(t.strip() for t in params["targets"].split(",") if t.strip())
        lora = config_from(LoraConfig, params, targets=targets)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    settings = {k: params[k] for k in ("pooling", *_DECODER_FLAGS)}
    _run(ctx, "lora", params, lora=lora, encoder_settings=settings)


@click.command("full")
@_finetune_options("full")
@click.pass_context
def full_cmd(ctx: click.Context, **params: Any) -> None:
    """Fine-tune every weight of the encoder.

    BERT-style encoders with condition-mean pooling; checkpointed after each epoch, --resume
    continues. The model folder in --out is used with --model OUT (and --profile OUT with
    --head-on-top).
    """
    _run(ctx, "full", params)


def _run(ctx: click.Context, kind: str, params: dict[str, Any], **extra: Any) -> None:
    """Check the flags against each other, build the config, fine-tune, save, report."""
    from condsearch.train import default_checkpoint_dir, fit_and_save_encoder

    losses = _parse_losses(params["loss"])
    if not params["head_on_top"] and (flags := given(ctx, *_HEAD_FLAGS)):
        raise click.UsageError(f"{', '.join(flags)} apply with --head-on-top")
    if params["dev_csv"] is None and given(ctx, "encode_batch_size"):
        raise click.UsageError("--batch-size applies with --dev (it sets how dev is scored)")
    for name, objective in (("margin", "quad"), ("bcl_temperature", "bcl"), ("bcl_sigma", "bcl")):
        if objective not in dict(losses) and (flag := given(ctx, name)):
            raise click.UsageError(f"{flag[0]} applies with --loss {objective}")
    out = params["out"]
    check_out(out, "adapter" if kind == "lora" else "model", params["checkpoint_dir"])
    try:
        config = config_from(
            FinetuneConfig,
            params,
            kind=kind,
            losses=losses,
            init_head=_init_head(params["init_head"], params["model"]),
            **({"lora": extra["lora"]} if "lora" in extra else {}),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc

    def report(epoch: int, row: dict[str, float]) -> None:
        dev = f"  dev spearman {row['dev_spearman']:.2f}" if "dev_spearman" in row else ""
        click.echo(f"epoch {epoch:>3}  loss {row['loss']:.5f}  {row['train_seconds']:.0f}s{dev}", err=True)

    head = f" --profile {out}" if config.head_on_top else ""
    use = f"--profile {out}" if kind == "lora" else f"--model {out}{head}"
    run_training(
        lambda: fit_and_save_encoder(
            params["train_csv"],
            out,
            config,
            dev_csv=params["dev_csv"],
            model=params["model"],
            device=params["device"],
            max_length=params["max_length"],
            trust_remote_code=params["trust_remote_code"],
            checkpoint_dir=params["checkpoint_dir"],
            resume=params["resume"],
            checkpoint_every=params["checkpoint_every"],
            keep_epochs=params["keep_epochs"],
            eval_batch_size=params["encode_batch_size"],
            on_epoch=report,
            encoder_settings=extra.get("encoder_settings"),
        ),
        params["as_json"],
        lambda s: f"wrote {out} ({kind}, best epoch {s['best_epoch']}{dev_note(s, ', ')}); use it with {use}",
        checkpoints=params["checkpoint_dir"] or default_checkpoint_dir(out),
    )


def _parse_losses(spec: str) -> tuple[tuple[str, float], ...]:
    """Return --loss as (name, weight) pairs, or raise UsageError."""
    from condsearch.train import parse_loss_spec

    try:
        return tuple(parse_loss_spec(spec).items())
    except ValueError as exc:
        raise click.UsageError(f"--loss: {exc}") from exc


def _init_head(spec: str | None, model: str | None) -> str | None:
    """Resolve --init-head (a folder or a shipped head's name) to a folder path, or raise UsageError."""
    from condsearch.train import resolve_init_head

    try:
        return resolve_init_head(spec, model)
    except CondsearchError as exc:
        raise click.UsageError(first_line(exc)) from exc
