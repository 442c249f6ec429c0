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
import logging
import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

from condsearch.base.artifact_files import (
    CHECKPOINT_BEST,
    CHECKPOINT_EPOCHS,
    CHECKPOINT_FORMAT_VERSION,
    CHECKPOINT_OPTIMIZER,
    CHECKPOINT_STATE,
    CHECKPOINT_TRAINABLE,
    check_own_artifact,
)
from condsearch.base.atomic import OutputDirError, recover_dir, replacing_dir
from condsearch.base.regular_files import open_regular_file
from condsearch.errors import CondsearchError, ModelError, first_line
from condsearch.model.artifacts.weights import load_weights, save_weights
from condsearch.train.finite import dumps_record

if TYPE_CHECKING:
    from condsearch.corpus.csts import CstsData

STATE_FILE = CHECKPOINT_STATE
TRAINABLE_FILE = CHECKPOINT_TRAINABLE
BEST_FILE = CHECKPOINT_BEST
OPTIMIZER_FILE = CHECKPOINT_OPTIMIZER
EPOCH_FILES = CHECKPOINT_EPOCHS  # each kept epoch's trainable parameters, keyed like TRAINABLE_FILE
_RNG_KEY = "__cpu_rng_state__"
#: the largest checkpoint.json read (one holds a config and a few counters: kB)
_MAX_STATE_BYTES = 16 << 20
log = logging.getLogger(__name__)


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
        (tmp / STATE_FILE).write_text(dumps_record(info, indent=2) + "\n")


def has_checkpoint(folder: Path) -> bool:
    """Return whether folder holds a checkpoint (restoring the previous one if a save was cut off)."""
    recover_dir(Path(folder))
    return (Path(folder) / STATE_FILE).is_file()


def load_checkpoint(
    folder: Path,
    config: dict[str, object],
    params: dict[str, torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    *,
    steps_per_epoch: int | None = None,
) -> tuple[TrainingState, dict[str, torch.Tensor] | None]:
    """Restore parameters and optimizer state in place; return the state and the best epoch's tensors.

    Refuses (one-line ModelError, nothing restored) a checkpoint written under another config, or
    one whose fields, tensor names, shapes, dtypes or ranges are not what a save writes: an edited
    or damaged checkpoint. With ``steps_per_epoch``, its position must lie within the run: epoch at
    most the config's epochs, epoch_step within an epoch, step = epoch × steps_per_epoch + epoch_step.
    """
    folder = Path(folder)
    try:
        with open_regular_file(folder / STATE_FILE, ModelError) as fh:  # not a FIFO, not /dev/zero
            info = json.loads(fh.read(_MAX_STATE_BYTES + 1))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{folder}: checkpoint unreadable ({type(exc).__name__})") from exc
    if not isinstance(info, dict):
        raise _damaged(folder, f"{STATE_FILE} is not an object")
    if info.get("format_version") != CHECKPOINT_FORMAT_VERSION:
        raise ModelError(f"{folder}: unsupported checkpoint format; drop --resume to start over")
    saved = info.get("config")
    if not isinstance(saved, dict):
        raise _damaged(folder, "config is not an object")
    if saved != config:
        changed = sorted(k for k in set(config) | set(saved) if saved.get(k) != config.get(k))
        raise ModelError(f"{folder}: checkpoint was written with other settings ({', '.join(changed)}); drop --resume")
    state = _read_state(folder, info, config, steps_per_epoch)
    steps = _optimizer_steps(folder, info.get("optimizer_steps"), params, state.step)
    trained = load_weights(folder / TRAINABLE_FILE, "checkpoint tensors")
    moments = load_weights(folder / OPTIMIZER_FILE, "checkpoint tensors")
    best = load_weights(folder / BEST_FILE, "checkpoint tensors") if (folder / BEST_FILE).is_file() else None
    _check_tensors(folder, TRAINABLE_FILE, trained, {n: p.shape for n, p in params.items()})
    if best is not None:
        _check_tensors(folder, BEST_FILE, best, {n: p.shape for n, p in params.items()})
    if (best is None) != (state.best_score == -float("inf")):
        raise _damaged(folder, f"best_score and {BEST_FILE} disagree")
    expected = {f"{n}.{m}": params[n].shape for n in steps for m in ("exp_avg", "exp_avg_sq")}
    state.rng = moments.pop(_RNG_KEY, None)
    if state.rng is None or state.rng.dtype != torch.uint8 or state.rng.shape != torch.get_rng_state().shape:
        raise _damaged(folder, f"{OPTIMIZER_FILE} holds no random generator state of this torch's shape")
    _check_tensors(folder, OPTIMIZER_FILE, moments, expected)
    if any(bool((moments[f"{n}.exp_avg_sq"] < 0).any()) for n in steps):
        raise _damaged(folder, f"{OPTIMIZER_FILE}: a negative second moment (exp_avg_sq)")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(trained[name].to(p.device, p.dtype))
            if name in steps:
                optimizer.state[p] = {
                    "step": torch.tensor(float(steps[name])),
                    "exp_avg": moments[f"{name}.exp_avg"].to(p.device, p.dtype),
                    "exp_avg_sq": moments[f"{name}.exp_avg_sq"].to(p.device, p.dtype),
                }
    return state, best


def _damaged(folder: Path, why: str) -> ModelError:
    return ModelError(f"{folder}: damaged checkpoint ({why}); drop --resume to start over")


def _integer(folder: Path, value: object, what: str, low: int, high: int | None = None) -> int:
    """Return value if it is an integer (not a bool) in [low, high], else raise the damaged-checkpoint error."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bounds = f"in {low}..{high}" if high is not None else f">= {low}"
        raise _damaged(folder, f"{what} is {_shown(value)}, not an integer {bounds}")
    return value


def _shown(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(folder: Path, value: object, key: str) -> dict[str, float]:
    """Return value if it is {str: finite number}, else raise the damaged-checkpoint error."""
    if not isinstance(value, dict):
        raise _damaged(folder, f"{key} is not an object")
    for name, number in value.items():
        if not _is_number(number) or not math.isfinite(number):
            raise _damaged(folder, f"{key}: {name} is {_shown(number)}, not a finite number")
    return value


def _history_row(folder: Path, row: object) -> dict[str, Any]:
    """Return a history row: numbers, an undefined one (NaN from older checkpoints, null) as None."""
    if not isinstance(row, dict) or not all(v is None or _is_number(v) for v in row.values()):
        raise _damaged(folder, "history holds a row that is not an object of numbers")
    return {k: v if v is None or math.isfinite(v) else None for k, v in row.items()}


def _read_state(
    folder: Path, info: Mapping[str, object], config: dict[str, object], steps_per_epoch: int | None
) -> TrainingState:
    """Return the checkpoint's position, history and best epoch, each field checked for type and range."""
    within = steps_per_epoch is not None  # check the position against the run
    epochs = config.get("epochs")
    epoch = _integer(folder, info.get("epoch"), "epoch", 0, epochs if within and isinstance(epochs, int) else None)
    # a finished run ends on an epoch's end; any other checkpoint lies within an epoch's steps
    last = None if steps_per_epoch is None else 0 if epoch == epochs else steps_per_epoch - 1
    epoch_step = _integer(folder, info.get("epoch_step"), "epoch_step", 0, last)
    step = _integer(folder, info.get("step"), "step", 0)
    if steps_per_epoch is not None and step != epoch * steps_per_epoch + epoch_step:
        expected = epoch * steps_per_epoch + epoch_step
        raise _damaged(folder, f"step is {step}, not epoch × {steps_per_epoch} + epoch_step = {expected}")
    best_epoch = _integer(folder, info.get("best_epoch"), "best_epoch", 0, epoch if within else None)
    best_score = info.get("best_score")
    if best_score is not None and not (_is_number(best_score) and math.isfinite(best_score)):
        raise _damaged(folder, f"best_score is {_shown(best_score)}, not a finite number or null")
    history = info.get("history")
    if not isinstance(history, list):
        raise _damaged(folder, "history is not a list")
    rows = [_history_row(folder, row) for row in history]
    for row in rows if within else []:
        _integer(folder, row.get("epoch"), "a history row's epoch", 0, epoch)
    partial = _numbers(folder, info.get("partial"), "partial")
    if epoch_step and not ("loss" in partial and partial.get("n_rows", 0) >= epoch_step):
        raise _damaged(folder, "partial lacks the epoch's running loss or its row count")
    if not epoch_step and partial:
        raise _damaged(folder, "partial sums outside an epoch")
    return TrainingState(
        config=config,
        epoch=epoch,
        step=step,
        history=rows,
        best_epoch=best_epoch,
        best_score=float(best_score) if best_score is not None else -float("inf"),
        epoch_step=epoch_step,
        partial={k: float(v) for k, v in partial.items()},
    )


def _optimizer_steps(folder: Path, value: object, params: Mapping[str, object], step: int) -> dict[str, int]:
    """Return AdamW's per-parameter step counts: each a known parameter's, an integer in 1..step."""
    counts = _numbers(folder, value, "optimizer_steps")
    unknown = sorted(set(counts) - set(params))
    if unknown:
        raise _damaged(folder, f"optimizer_steps names {unknown[0]}, not a parameter that trains")
    return {name: _integer(folder, n, f"optimizer_steps: {name}", 1, step) for name, n in counts.items()}


def _check_tensors(folder: Path, file: str, tensors: Mapping[str, torch.Tensor], shapes: Mapping[str, object]) -> None:
    """Raise the damaged-checkpoint error unless tensors are exactly the named ones, floating point, of those shapes."""
    missing, extra = sorted(set(shapes) - set(tensors)), sorted(set(tensors) - set(shapes))
    if missing or extra:
        what = f"lacks {missing[0]}" if missing else f"holds {extra[0]}, which this run does not expect"
        raise _damaged(folder, f"{file} {what}")
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise _damaged(folder, f"{file}: {name} has dtype {tensor.dtype}, not floating point")
        if tensor.shape != shapes[name]:
            raise _damaged(folder, f"{file}: {name} has shape {list(tensor.shape)}, not {list(shapes[name])}")  # type: ignore[call-overload]


def check_checkpoint_dir(out: Path, checkpoint_dir: Path | None) -> None:
    """Refuse (OutputDirError) a checkpoint folder that is out, lies inside it, or holds it.

    Each save replaces its own folder whole and refuses one holding files it does not write, so
    such a run would train to the end and then fail to save (or replace one with the other).
    Paths are compared resolved: symlinks, ``..`` and relative spellings name the same folder.
    """
    if checkpoint_dir is None:
        return
    a, b = _real(out), _real(checkpoint_dir)
    if a == b:
        why = f"--checkpoint-dir {checkpoint_dir} and --out {out} are one folder"
    elif a in b.parents:
        why = f"--checkpoint-dir {checkpoint_dir} is inside --out {out}"
    elif b in a.parents:
        why = f"--out {out} is inside --checkpoint-dir {checkpoint_dir}"
    else:
        return
    raise OutputDirError(f"{why}: each save replaces its folder whole; name two folders apart")


def _real(path: Path) -> Path:
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return Path(os.path.abspath(Path(path).expanduser()))


def remove_checkpoint(folder: Path) -> bool:
    """Delete a checkpoint folder (only one holding a checkpoint's files); return whether it is gone."""
    folder = Path(folder)
    try:
        check_own_artifact(folder, "checkpoint")
        shutil.rmtree(folder)
    except (CondsearchError, OSError) as exc:
        log.warning("%s: checkpoint left in place (%s)", folder, first_line(exc))
        return False
    return True


def kept_checkpoint(folder: Path, keep: bool) -> str | None:
    """After a successful save, remove folder unless keep; return the folder still there (resolved) or None."""
    if not keep and remove_checkpoint(folder):
        return None
    return str(_real(folder)) if Path(folder).exists() else None


def default_checkpoint_dir(out: Path) -> Path:
    """Return the checkpoint folder for an output folder: under the cache, never beside the output."""
    from condsearch.base.output_cache import default_cache_dir

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
