"""`condsearch train head`: the CASE projection head on the frozen encoder's (cached) outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from condsearch.cli.options import FiniteFloatRange, config_from, config_option, encoder_options
from condsearch.cli.train import check_out, common_options, dev_note, encode_batch_option, report_epoch, run_training
from condsearch.model.encoders import ENCODE_BATCH_SIZE
from condsearch.train import HeadTrainConfig, TrainSource

_DEFAULTS = HeadTrainConfig()
_ENCODER = ("pooling", "prompt_template", "unconditional_template", "dtype", "bidirectional_layers", "preset")


@click.command("head")
@common_options(_DEFAULTS, "Folder to write the head into (use it with --profile OUT).")
@config_option(_DEFAULTS, "dim", "--dim", type=click.IntRange(min=1), help="Output (index) dimension of the head.")
@config_option(
    _DEFAULTS,
    "dropout",
    "--dropout",
    type=FiniteFloatRange(0, 1, max_open=True),
    help="Dropout after the activation (training only).",
)
@encode_batch_option(ENCODE_BATCH_SIZE, "Pairs per encoder forward pass.")
@click.option("--no-cache", is_flag=True, help="Do not read or write the encoder-output cache.")
@encoder_options
def head_cmd(train_csv: tuple[TrainSource, ...], out: Path, dev_csv: Path | None, as_json: bool, **params: Any) -> None:
    """Train the CASE projection head on the frozen encoder.

    The encoder's outputs are cached (env CONDSEARCH_CACHE_DIR), so retraining takes seconds.
    The head trains by MSE between the cosine and the scaled label (Adam at a constant rate).
    """
    from condsearch.train import fit_and_save_head

    check_out(out, "head")
    config = config_from(HeadTrainConfig, params)
    run_training(
        lambda: fit_and_save_head(
            train_csv,
            out,
            config,
            dev_csv=dev_csv,
            model=params["model"],
            device=params["device"],
            batch_size=params["encode_batch_size"],
            use_cache=not params["no_cache"],
            trust_remote_code=params["trust_remote_code"],
            on_epoch=report_epoch,
            max_length=params["max_length"],
            **{k: params[k] for k in _ENCODER},
        ),
        as_json,
        lambda summary: f"wrote {out} ({summary['dim']}-d head)" + dev_note(summary),
    )
