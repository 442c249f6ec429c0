"""`condsearch train router`: the CSR router layers, trained on cached sentence states."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from condsearch.cli_config import config_from, config_option
from condsearch.cli_train import check_out, common_options, dev_note, report_epoch, run_training
from condsearch.csr.router import PRESETS, RouterConfig
from condsearch.csr.training import LOSSES, RouterTrainConfig

_DEFAULTS = RouterTrainConfig()


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
    RouterConfig(),
    "variant",
    "--router-variant",
    type=click.Choice(tuple(PRESETS)),
    help=(
        "paper is eq. 1 of the router paper (layer t's own W_Q, (1 + w), no gain); extended is ours "
        "(a trainable query copy, a learned gain, a condition-generated projection)."
    ),
)
@config_option(
    RouterConfig(),
    "layer",
    "--router-layer",
    type=int,
    help="First routed backbone layer; negative counts from the top (-1: the last layer only).",
)
def router_cmd(train_csv: Path, out: Path, dev_csv: Path | None, as_json: bool, **params: Any) -> None:
    """Train the CSR router layers on cached sentence states.

    Fine-tunes the router query and the layers from the router layer up, leaving lower layers
    frozen so sentence caches stay valid (AdamW, linear warm-up then decay).
    """
    from condsearch.csr.training import train_router_and_save

    check_out(out, "router")
    config = config_from(RouterTrainConfig, params)
    router_config = replace(PRESETS[params["variant"]], layer=params["layer"])
    run_training(
        lambda: train_router_and_save(
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
        ),
        as_json,
        lambda s: f"wrote {out} ({s['variant']} router from layer {s['layer']})" + dev_note(s),
    )
