"""Per-epoch training checkpoints: tensors in safetensors, everything else in JSON, no pickles.

A checkpoint folder holds ``trainable.safetensors`` (the parameters being trained after the
last completed epoch), ``best.safetensors`` (those of the best epoch on dev so far),
``optimizer.safetensors`` (AdamW's moment estimates, keyed ``<parameter>.exp_avg`` and
``<parameter>.exp_avg_sq``, and the CPU random generator's state) and ``checkpoint.json`` (epoch,
step, history, the config and AdamW's per-parameter step counts). A save within an epoch also
records how many of that epoch's batches are done and the running loss sums, so that a resumed
run skips them. With ``keep_epoch``, a save at an epoch's end also writes that epoch's parameters
as ``epoch-N.safetensors``, and every later save carries them over (hard links): the weights a
soup averages. Each save replaces the folder atomically. A run's checkpoints go under the cache
folder, named after its output (:func:`default_checkpoint_dir`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from condsearch.artifacts.files import (
    CHECKPOINT_BEST,
    CHECKPOINT_EPOCHS,
    CHECKPOINT_FORMAT_VERSION,
    CHECKPOINT_OPTIMIZER,
    CHECKPOINT_STATE,
    CHECKPOINT_TRAINABLE,
    check_own_artifact,
)
from condsearch.artifacts.weights import load_weights, save_weights
from condsearch.atomic import recover_dir, replacing_dir
from condsearch.errors import ModelError

if TYPE_CHECKING:
    from condsearch.csts import CstsData

STATE_FILE = CHECKPOINT_STATE
TRAINABLE_FILE = CHECKPOINT_TRAINABLE
BEST_FILE = CHECKPOINT_BEST
OPTIMIZER_FILE = CHECKPOINT_OPTIMIZER
EPOCH_FILES = CHECKPOINT_EPOCHS  # each kept epoch's trainable parameters, keyed like TRAINABLE_FILE
_RNG_KEY = "__cpu_rng_state__"


@dataclass
class TrainingState:
    """Where a run stands: completed epochs, optimiser steps, per-epoch history, best epoch."""

    config: dict[str, object]
    epoch: int = 0
    step: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    best_score: float = -float("inf")
    #: within epoch ``epoch + 1``: batches done and running sums (loss terms, n_rows, seconds)
    epoch_step: int = 0
    partial: dict[str, float] = field(default_factory=dict)
    rng: torch.Tensor | None = None  # the CPU generator's state when the checkpoint was written


def _tensors(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in params.items()}


def save_checkpoint(
    folder: Path,
    state: TrainingState,
    params: dict[str, torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    best: dict[str, torch.Tensor] | None,
    *,
    keep_epoch: bool = False,
) -> None:
    """Write the training state into folder (replaced atomically); with keep_epoch, also the epoch's own copy."""
    folder = Path(folder)
    what = f"{folder}: checkpoint"
    check_own_artifact(folder, "checkpoint")
    with replacing_dir(folder) as tmp:
        for kept in sorted(folder.glob(EPOCH_FILES)) if folder.is_dir() else []:
            try:
                os.link(kept, tmp / kept.name)
            except OSError:  # a filesystem without hard links
                shutil.copy2(kept, tmp / kept.name)
        save_weights(_tensors(params), tmp / TRAINABLE_FILE, what)
        if keep_epoch:
            save_weights(_tensors(params), tmp / f"epoch-{state.epoch}.safetensors", what)
        if best is not None:
            save_weights(_tensors(best), tmp / BEST_FILE, what)
        moments: dict[str, torch.Tensor] = {}
        steps: dict[str, float] = {}
        for name, p in params.items():
            slot = optimizer.state.get(p)
            if not slot:
                continue
            moments[f"{name}.exp_avg"] = slot["exp_avg"]
            moments[f"{name}.exp_avg_sq"] = slot["exp_avg_sq"]
            steps[name] = float(slot["step"])
        moments[_RNG_KEY] = torch.get_rng_state()
        save_weights(_tensors(moments), tmp / OPTIMIZER_FILE, what)
        info = {
            "format_version": CHECKPOINT_FORMAT_VERSION,
            "epoch": state.epoch,
            "step": state.step,
            "history": state.history,
            "best_epoch": state.best_epoch,
            "best_score": state.best_score if state.best_score != -float("inf") else None,
            "epoch_step": state.epoch_step,
            "partial": state.partial,
            "config": state.config,
            "optimizer_steps": steps,
        }
        (tmp / STATE_FILE).write_text(json.dumps(info, indent=2) + "\n")


def has_checkpoint(folder: Path) -> bool:
    """Return whether folder holds a checkpoint (restoring the previous one if a save was cut off)."""
    recover_dir(Path(folder))
    return (Path(folder) / STATE_FILE).is_file()


def load_checkpoint(
    folder: Path,
    config: dict[str, object],
    params: dict[str, torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
) -> tuple[TrainingState, dict[str, torch.Tensor] | None]:
    """Restore parameters and optimizer state in place; return the state and the best epoch's tensors.

    Refuses a checkpoint written under another config (ModelError).
    """
    folder = Path(folder)
    try:
        info = json.loads((folder / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{folder}: checkpoint unreadable ({type(exc).__name__})") from exc
    if info.get("format_version") != CHECKPOINT_FORMAT_VERSION:
        raise ModelError(f"{folder}: unsupported checkpoint format")
    saved = info.get("config") or {}
    if saved != config:
        changed = sorted(k for k in set(config) | set(saved) if saved.get(k) != config.get(k))
        raise ModelError(f"{folder}: checkpoint was written with other settings ({', '.join(changed)}); drop --resume")
    trained = load_weights(folder / TRAINABLE_FILE, "checkpoint tensors")
    moments = load_weights(folder / OPTIMIZER_FILE, "checkpoint tensors")
    best = load_weights(folder / BEST_FILE, "checkpoint tensors") if (folder / BEST_FILE).is_file() else None
    if set(trained) != set(params):
        raise ModelError(f"{folder}: checkpoint does not hold this model's trainable parameters")
    steps = info.get("optimizer_steps") or {}
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(trained[name].to(p.device, p.dtype))
            if name in steps:
                optimizer.state[p] = {
                    "step": torch.tensor(float(steps[name])),
                    "exp_avg": moments[f"{name}.exp_avg"].to(p.device, p.dtype),
                    "exp_avg_sq": moments[f"{name}.exp_avg_sq"].to(p.device, p.dtype),
                }
    best_score = info.get("best_score")
    state = TrainingState(
        config=config,
        epoch=int(info["epoch"]),
        step=int(info["step"]),
        history=list(info.get("history") or []),
        best_epoch=int(info.get("best_epoch") or 0),
        best_score=float(best_score) if best_score is not None else -float("inf"),
        epoch_step=int(info.get("epoch_step") or 0),
        partial={k: float(v) for k, v in (info.get("partial") or {}).items()},
        rng=moments.get(_RNG_KEY),
    )
    return state, best


def default_checkpoint_dir(out: Path) -> Path:
    """Return the checkpoint folder for an output folder: under the cache, never beside the output."""
    from condsearch.cache import default_cache_dir

    out = Path(out).expanduser().resolve()
    digest = hashlib.sha256(str(out).encode("utf-8")).hexdigest()[:10]
    return default_cache_dir() / "checkpoints" / f"{out.name}-{digest}"


def data_digest(data: CstsData | None) -> str | None:
    """Return a short fingerprint of a C-STS set's rows (what a resumed run must share; None for None)."""
    if data is None:
        return None
    h = hashlib.sha256()
    for row in zip(data.sentence1, data.sentence2, data.condition, data.labels.tolist(), strict=True):
        h.update(json.dumps(row).encode("utf-8"))
    return h.hexdigest()[:16]
