"""Training what condsearch ships: the CASE head, fine-tuned encoders (LoRA or full) and CSR routers.

Each trainer has the same shape: ``fit_<thing>(…, train, config, *, dev=None, on_epoch=None, …)``
trains in memory, keeps the best dev epoch and returns the per-epoch history (``fit_router``: the
history, the router trained in place; ``fit_head``: the head and the history; ``fit_encoder``: a
``FinetuneResult`` holding the jointly trained head, the history and the best epoch), and
``fit_and_save_<thing>(train_csv, out, config, *, dev_csv=None, model=None, device=None, …)`` reads
the C-STS files, fits, writes the artifact into ``out`` and returns a JSON summary (what
``condsearch train … --json`` prints).

- ``head``: :class:`HeadTrainConfig`, ``fit_head``, ``fit_and_save_head`` (frozen encoder, cached outputs);
- ``finetune``: :class:`FinetuneConfig`, ``fit_encoder``; ``finetune_save``: ``fit_and_save_encoder`` (``train lora`` /
  ``train full``);
- ``router``: :class:`RouterTrainConfig`, ``fit_router``, ``fit_and_save_router`` (``train router``).

Their shared parts: ``losses`` (the objectives and pair batching), ``schedule`` (the one LR
schedule), ``best_epoch`` (the one best-epoch keeper), ``checkpoint`` (resumable per-epoch state and
where it lives), ``lora`` (the adapter layers), ``adapter`` (writing adapter folders) and ``lowrank``
(a full fine-tune's weight changes at reduced rank). Importing this package loads none of them:
its front door, the names below (the configs and ``fit_and_save_<thing>`` first), loads each on
first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base.front_door import lazy_names

if TYPE_CHECKING:
    from condsearch.train.adapt import ANCHORS, ID_COLUMN, AdaptConfig, adapt_router, check_adapt_paths
    from condsearch.train.checkpoint import check_checkpoint_dir, default_checkpoint_dir, has_checkpoint
    from condsearch.train.finetune import FinetuneConfig
    from condsearch.train.finetune_save import fit_and_save_encoder, resolve_init_head
    from condsearch.train.finite import dumps_record
    from condsearch.train.head import HeadTrainConfig, fit_and_save_head
    from condsearch.train.lora import LoraConfig
    from condsearch.train.losses import format_loss_spec, parse_loss_spec
    from condsearch.train.mixture import TrainSource, parse_train_source
    from condsearch.train.pairs import LabelSpec, PairsConfig, check_label_specs, make_pairs, parse_label_spec
    from condsearch.train.pairs_files import check_output, read_labelled, write_pairs
    from condsearch.train.router import (
        DEFAULT_SCOPE,
        INITS,
        LOSSES,
        WHOLE_BACKBONE_LR,
        RouterTrainConfig,
        fit_and_save_router,
    )

__all__ = [
    "ANCHORS",
    "DEFAULT_SCOPE",
    "ID_COLUMN",
    "INITS",
    "LOSSES",
    "WHOLE_BACKBONE_LR",
    "AdaptConfig",
    "FinetuneConfig",
    "HeadTrainConfig",
    "LabelSpec",
    "LoraConfig",
    "PairsConfig",
    "RouterTrainConfig",
    "TrainSource",
    "adapt_router",
    "check_adapt_paths",
    "check_checkpoint_dir",
    "check_label_specs",
    "check_output",
    "default_checkpoint_dir",
    "dumps_record",
    "fit_and_save_encoder",
    "fit_and_save_head",
    "fit_and_save_router",
    "format_loss_spec",
    "has_checkpoint",
    "make_pairs",
    "parse_label_spec",
    "parse_loss_spec",
    "parse_train_source",
    "read_labelled",
    "resolve_init_head",
    "write_pairs",
]

#: public name -> the module of this package it is imported from, when first asked for (so importing stays cheap)
_HOMES = {
    "ANCHORS": "adapt",
    "DEFAULT_SCOPE": "router",
    "ID_COLUMN": "adapt",
    "INITS": "router",
    "LOSSES": "router",
    "WHOLE_BACKBONE_LR": "router",
    "AdaptConfig": "adapt",
    "FinetuneConfig": "finetune",
    "HeadTrainConfig": "head",
    "LabelSpec": "pairs",
    "LoraConfig": "lora",
    "PairsConfig": "pairs",
    "RouterTrainConfig": "router",
    "TrainSource": "mixture",
    "adapt_router": "adapt",
    "check_adapt_paths": "adapt",
    "check_checkpoint_dir": "checkpoint",
    "check_label_specs": "pairs",
    "check_output": "pairs_files",
    "default_checkpoint_dir": "checkpoint",
    "dumps_record": "finite",
    "fit_and_save_encoder": "finetune_save",
    "fit_and_save_head": "head",
    "fit_and_save_router": "router",
    "format_loss_spec": "losses",
    "has_checkpoint": "checkpoint",
    "make_pairs": "pairs",
    "parse_label_spec": "pairs",
    "parse_loss_spec": "losses",
    "parse_train_source": "mixture",
    "read_labelled": "pairs_files",
    "resolve_init_head": "finetune_save",
    "write_pairs": "pairs_files",
}


__getattr__ = lazy_names(__name__, _HOMES)
