"""`condsearch train router`: a CSR router on C-STS (its top layers; for the context router, its backbone)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from condsearch.cli.options import FiniteFloatRange, config_from, config_option, given
from condsearch.cli.train import check_out, common_options, dev_note, report_epoch, run_training
from condsearch.model.csr import CONTEXT, PRESETS, ROUTER_VARIANTS, TRAIN_SCOPES, ContextConfig, RouterConfig
from condsearch.train import DEFAULT_SCOPE, INITS, LOSSES, WHOLE_BACKBONE_LR, RouterTrainConfig, TrainSource

_DEFAULTS = RouterTrainConfig()
#: flags that only the context router takes
_CONTEXT_FLAGS = ("k", "init")


@click.command("router")
@common_options(_DEFAULTS, "Folder to write the router into (use it with --mode csr --router OUT).")
@config_option(
    _DEFAULTS,
    "loss",
    "--loss",
    type=click.Choice(LOSSES),
    help="Objective: mse on the scaled label (the paper), wacl (CCL eq. 9) or both.",
)
@config_option(
    _DEFAULTS,
    "contrast_weight",
    "--contrast-weight",
    type=FiniteFloatRange(min=0),
    help="Ours: weight of an in-condition contrastive term beside --loss (each row's first sentence nearer "
    "its own second than the batch's other rows under the same condition; 0: off). Batches then gather "
    "rows that share a condition.",
)
@config_option(
    RouterConfig(),
    "variant",
    "--variant",
    "--router-variant",
    type=click.Choice(ROUTER_VARIANTS),
    help=(
        "paper is eq. 1 of the router paper (layer t's own W_Q, (1 + w), no gain); extended is ours "
        "(a trainable query copy, a learned gain, a condition-generated projection); context is ours too "
        "(sentence tokens attend to the condition's tokens in the top --k layers)."
    ),
)
@config_option(
    RouterConfig(),
    "layer",
    "--router-layer",
    type=int,
    help="paper/extended: first routed backbone layer; negative counts from the top (-1: the last layer only).",
)
@config_option(
    ContextConfig(),
    "k",
    "--k",
    type=click.IntRange(min=1),
    help="context: how many top layers see the condition (the layers below are cached per sentence).",
)
@config_option(
    _DEFAULTS,
    "train_backbone",
    "--train-backbone",
    type=click.Choice(TRAIN_SCOPES),
    help=(
        "Train the whole backbone, or only the routed layers over cached sentence states: the top --k "
        f"for context [default: {DEFAULT_SCOPE}], layers from --router-layer up for paper/extended "
        f"[default: top; all is the paper's own setting, at lr {WHOLE_BACKBONE_LR:g} unless --lr]."
    ),
)
@config_option(
    _DEFAULTS,
    "init",
    "--init",
    type=click.Choice(INITS),
    help="context: start from the base model, from the shipped full CASE profile's weights, or from the shipped "
    "router itself (router: its variant and k; what `condsearch adapt` trains).",
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=(
        "Per-epoch checkpoints, kept after a successful run "
        "[default: a folder under the cache, named after --out, removed once --out is saved]."
    ),
)
@click.option(
    "--checkpoint-every",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Also checkpoint every N optimiser steps within an epoch (0: at epoch ends only).",
)
@click.option("--resume", is_flag=True, help="Continue from the last checkpoint (mid-epoch ones included).")
@click.pass_context
def router_cmd(
    ctx: click.Context,
    train_csv: tuple[TrainSource, ...],
    out: Path,
    dev_csv: Path | None,
    as_json: bool,
    **params: Any,
) -> None:
    """Train a CSR router: the paper, extended or context variant.

    paper/extended: fine-tunes the router query and the layers from the router layer up, leaving
    lower layers frozen so sentence caches stay valid (--train-backbone all: the whole backbone, as
    the paper does, saved whole: about 45 MB for MiniLM). context (ours): trains the backbone, whole
    or its top --k layers, and saves its change from the base model (checksummed: caches and
    indexes made with other weights are never reused). AdamW, linear warm-up then decay; a
    checkpoint after each epoch, which --resume continues from.
    """
    from condsearch.train import default_checkpoint_dir, fit_and_save_router

    variant = params["variant"]
    if params["init"] == "router":
        if given(ctx, "variant") and variant != CONTEXT:
            raise click.UsageError("--init router starts from the shipped router, a context router: --variant context")
        if flags := given(ctx, "k", "layer"):
            raise click.UsageError(f"{flags[0]} does not apply with --init router (the shipped router's own)")
        variant = CONTEXT
    if variant == CONTEXT:
        if flags := given(ctx, "layer"):
            raise click.UsageError(f"{flags[0]} applies to --variant paper/extended (the context router takes --k)")
        router_config: RouterConfig | ContextConfig = ContextConfig(k=params["k"])
    else:
        if flags := given(ctx, *_CONTEXT_FLAGS):
            raise click.UsageError(f"{', '.join(flags)} apply with --variant context")
        router_config = replace(PRESETS[variant], layer=params["layer"])
    check_out(out, "router", params["checkpoint_dir"])
    config = config_from(RouterTrainConfig, params)
    run_training(
        lambda: fit_and_save_router(
            train_csv,
            out,
            config,
            dev_csv=dev_csv,
            model=params["model"],
            router_config=router_config,
            device=params["device"],
            max_length=params["max_length"],
            trust_remote_code=params["trust_remote_code"],
            on_epoch=report_epoch,
            checkpoint_dir=params["checkpoint_dir"],
            resume=params["resume"],
            checkpoint_every=params["checkpoint_every"],
        ),
        as_json,
        lambda s: f"wrote {out} ({s['variant']} router from layer {s['layer']})" + dev_note(s),
        checkpoints=params["checkpoint_dir"] or default_checkpoint_dir(out),
    )
