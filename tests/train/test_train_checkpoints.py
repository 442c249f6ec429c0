"""Issue 37: checkpoints never go into the output nor stay in the cache unasked; damaged ones refuse --resume."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from condsearch.errors import CondsearchError, ModelError
from condsearch.train import finetune as trainer
from condsearch.train.finetune import FinetuneConfig, fit_encoder
from tests.cli.test_cli import assert_clean_error, ok
from tests.train.test_finetune_resume import _data, _Stop
from tests.train.test_train_hostile import _csv, _snapshot, _train

# ----------------------------------------------------------------- (7) --checkpoint-dir and --out apart


def _overlaps(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    """(out, checkpoint dir) pairs that name one folder, or one inside the other; a symlink's too."""
    (tmp_path / "link").symlink_to(tmp_path, target_is_directory=True)
    return {
        "equal": (tmp_path / "out", tmp_path / "out"),
        "equal-through-a-symlink": (tmp_path / "out", tmp_path / "link" / "out"),
        "equal-spelled-with-dots": (tmp_path / "out", tmp_path / "x" / ".." / "out"),
        "checkpoints-inside-out": (tmp_path / "out", tmp_path / "out" / "ckpt"),
        "out-inside-checkpoints": (tmp_path / "ckpt" / "out", tmp_path / "ckpt"),
    }


OVERLAPS = [
    "equal",
    "equal-through-a-symlink",
    "equal-spelled-with-dots",
    "checkpoints-inside-out",
    "out-inside-checkpoints",
]


@pytest.mark.parametrize("overlap", OVERLAPS)
@pytest.mark.parametrize("name", ["lora", "full", "router"])
def test_checkpoint_dir_and_out_must_be_apart_before_any_training(
    name: str, overlap: str, tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import condsearch.train.finetune_save
    import condsearch.train.router

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("trained before refusing")

    monkeypatch.setattr(condsearch.train.finetune_save, "fit_encoder", never)
    monkeypatch.setattr(condsearch.train.router, "fit_router", never)
    csv = _csv(tmp_path / "t.csv")
    out, ckpt = _overlaps(tmp_path)[overlap]
    before = sorted(os.listdir(tmp_path))
    message = assert_clean_error(_train(name, csv, out, tiny_bert_dir, "--checkpoint-dir", ckpt))
    assert "--checkpoint-dir" in message and "--out" in message
    assert sorted(os.listdir(tmp_path)) == before


def test_the_library_refuses_overlapping_folders_before_loading_anything(tmp_path: Path) -> None:
    from condsearch.train.finetune_save import fit_and_save_encoder
    from condsearch.train.router import RouterTrainConfig, fit_and_save_router

    csv, missing = _csv(tmp_path / "t.csv"), str(tmp_path / "no-such-model")
    out = tmp_path / "out"
    with pytest.raises(CondsearchError, match="inside"):
        fit_and_save_encoder(csv, out, FinetuneConfig(kind="full"), model=missing, checkpoint_dir=out / "ck")
    with pytest.raises(CondsearchError, match="inside"):
        fit_and_save_router(csv, out, RouterTrainConfig(), model=missing, checkpoint_dir=tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["t.csv"]


def test_folders_side_by_side_are_fine(tmp_path: Path) -> None:
    from condsearch.train.checkpoint import check_checkpoint_dir

    check_checkpoint_dir(tmp_path / "out", tmp_path / "out-ckpt")
    check_checkpoint_dir(tmp_path / "out", None)


# ----------------------------------------------------------------- (14) no checkpoint left in the cache unasked


def _cached_checkpoints() -> list[str]:
    folder = Path(os.environ["CONDSEARCH_CACHE_DIR"]) / "checkpoints"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


@pytest.mark.parametrize("name", ["lora", "full", "router"])
def test_a_successful_run_leaves_no_checkpoint_in_the_cache(name: str, tiny_bert_dir: Path, tmp_path: Path) -> None:
    before = _cached_checkpoints()
    result = ok(_train(name, _csv(tmp_path / "t.csv"), tmp_path / "out", tiny_bert_dir, "--json"))
    assert json.loads(result.stdout)["checkpoint_dir"] is None
    assert _cached_checkpoints() == before
    assert "checkpoint" not in result.stderr


@pytest.mark.parametrize("name", ["lora", "router"])
def test_a_checkpoint_dir_asked_for_is_kept_and_named(name: str, tiny_bert_dir: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    csv, out = _csv(tmp_path / "t.csv"), tmp_path / "out"
    summary = json.loads(ok(_train(name, csv, out, tiny_bert_dir, "--checkpoint-dir", ckpt, "--json")).stdout)
    assert summary["checkpoint_dir"] == str(ckpt.resolve()) and (ckpt / "checkpoint.json").is_file()
    shown = ok(_train(name, csv, out, tiny_bert_dir, "--checkpoint-dir", ckpt)).stdout
    assert f"checkpoints kept in {ckpt.resolve()}" in shown


def test_keep_epochs_keeps_the_default_checkpoint_and_names_it(tiny_bert_dir: Path, tmp_path: Path) -> None:
    before = _cached_checkpoints()
    shown = ok(_train("full", _csv(tmp_path / "t.csv"), tmp_path / "out", tiny_bert_dir, "--keep-epochs")).stdout
    (kept,) = set(_cached_checkpoints()) - set(before)
    folder = Path(os.environ["CONDSEARCH_CACHE_DIR"]) / "checkpoints" / kept
    assert (folder / "epoch-1.safetensors").is_file() and f"checkpoints kept in {folder}" in shown


def test_an_interrupted_run_keeps_its_checkpoint_and_names_it(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import condsearch.train.finetune_save

    def train_then_fail(*args: object, **kwargs: Any) -> None:
        (Path(kwargs["checkpoint_dir"]) / "checkpoint.json").parent.mkdir(parents=True)
        (Path(kwargs["checkpoint_dir"]) / "checkpoint.json").write_text("{}")
        raise ModelError("something went wrong in epoch 2")

    monkeypatch.setattr(condsearch.train.finetune_save, "fit_encoder", train_then_fail)
    before = _cached_checkpoints()
    result = _train("full", _csv(tmp_path / "t.csv"), tmp_path / "out", tiny_bert_dir)
    assert "something went wrong in epoch 2" in assert_clean_error(result)
    (kept,) = set(_cached_checkpoints()) - set(before)
    assert f"checkpoints kept in {Path(os.environ['CONDSEARCH_CACHE_DIR']) / 'checkpoints' / kept}" in result.stderr
    assert "--resume" in result.stderr


# ----------------------------------------------------------------- (9) damaged checkpoints on --resume

CONFIG = FinetuneConfig(kind="full", epochs=2, batch_size=2, lr=1e-2)
STEPS_PER_EPOCH = 3  # 3 pairs, one pair a batch


@pytest.fixture(scope="module")
def mid_epoch(tmp_path_factory: pytest.TempPathFactory, tiny_bert_dir: Path) -> Path:
    """A checkpoint written after the first step of epoch 1 (epoch 0, epoch_step 1), as a crash leaves it."""
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec, Runtime

    folder = tmp_path_factory.mktemp("mid-epoch") / "ckpt"
    real, calls = trainer.batch_loss, []

    def crash_at_step_2(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise _Stop
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer, "batch_loss", crash_at_step_2)
        with pytest.raises(_Stop):
            encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
            fit_encoder(encoder, _data(), CONFIG, checkpoint_dir=folder, checkpoint_every=1)
    info = json.loads((folder / "checkpoint.json").read_text())
    assert (info["epoch"], info["epoch_step"], info["step"]) == (0, 1, 1)
    return folder


def _resume(tiny_bert_dir: Path, folder: Path) -> trainer.FinetuneResult:
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec, Runtime

    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    return fit_encoder(encoder, _data(), CONFIG, checkpoint_dir=folder, resume=True)


def _edit_state(**changes: object) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        info = json.loads((folder / "checkpoint.json").read_text())
        info.update(changes)
        (folder / "checkpoint.json").write_text(json.dumps(info))

    return edit


def _edit_tensors(file: str, change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        tensors = load_file(str(folder / file))
        change(tensors)
        save_file(tensors, str(folder / file))

    return edit


def _first(tensors: dict[str, torch.Tensor], suffix: str = "") -> str:
    return sorted(k for k in tensors if k.endswith(suffix) and not k.startswith("__"))[0]


def _drop(suffix: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(t: dict[str, torch.Tensor]) -> None:
        del t[suffix if suffix in t else _first(t, suffix)]

    return change


def _reshape(suffix: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(t: dict[str, torch.Tensor]) -> None:
        name = _first(t, suffix)
        t[name] = torch.zeros(t[name].numel() + 1)

    return change


def _set(key: str, value: torch.Tensor) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(t: dict[str, torch.Tensor]) -> None:
        t[key] = value

    return change


def _negate(suffix: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(t: dict[str, torch.Tensor]) -> None:
        name = _first(t, suffix)
        t[name] = -t[name] - 1.0

    return change


def _as_int(suffix: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(t: dict[str, torch.Tensor]) -> None:
        name = _first(t, suffix)
        t[name] = t[name].to(torch.int64)

    return change


def _replace_state(text: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / "checkpoint.json").write_text(text)

    return edit


def _negative_optimizer_steps(folder: Path) -> None:
    steps = json.loads((folder / "checkpoint.json").read_text())["optimizer_steps"]
    _edit_state(optimizer_steps={name: -1 for name in steps})(folder)


OPT, TRAINABLE = "optimizer.safetensors", "trainable.safetensors"
DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "epoch_step past the epoch": (_edit_state(epoch_step=1_000_000_000), "epoch_step"),
    "negative epoch_step": (_edit_state(epoch_step=-1), "epoch_step"),
    "epoch past the run": (_edit_state(epoch=5, step=16), "epoch"),
    "epoch as text": (_edit_state(epoch="1"), "epoch"),
    "epoch null": (_edit_state(epoch=None), "epoch"),
    "epoch a fraction": (_edit_state(epoch=0.5), "epoch"),
    "epoch a boolean": (_edit_state(epoch=False), "epoch"),
    "step out of line": (_edit_state(step=99), "step"),
    "best_epoch as text": (_edit_state(best_epoch="x"), "best_epoch"),
    "best_score as text": (_edit_state(best_score="high"), "best_score"),
    "history not a list": (_edit_state(history="x"), "history"),
    "history of numbers": (_edit_state(history=[1]), "history"),
    "partial as text": (_edit_state(partial={"loss": "x", "n_rows": 2}), "partial"),
    "partial without its row count": (_edit_state(partial={"loss": 1.0}), "partial"),
    "optimizer steps as text": (_edit_state(optimizer_steps="x"), "optimizer_steps"),
    "optimizer step negative": (_negative_optimizer_steps, "optimizer_steps"),
    "optimizer step of an unknown parameter": (_edit_state(optimizer_steps={"encoder.nope": 1}), "optimizer_steps"),
    "config as a list": (_edit_state(config=[1]), "config"),
    "not an object": (_replace_state("[1, 2]"), "not an object"),
    "NaN best score": (_edit_state(best_score=math.nan), "best_score"),
    "a missing moment": (_edit_tensors(OPT, _drop(".exp_avg_sq")), "exp_avg_sq"),
    "a moment of the wrong shape": (_edit_tensors(OPT, _reshape(".exp_avg")), "shape"),
    "a moment of integers": (_edit_tensors(OPT, _as_int(".exp_avg")), "dtype"),
    "a negative second moment": (_edit_tensors(OPT, _negate(".exp_avg_sq")), "negative"),
    "no random state": (_edit_tensors(OPT, _drop("__cpu_rng_state__")), "random"),
    "a random state of the wrong shape": (
        _edit_tensors(OPT, _set("__cpu_rng_state__", torch.zeros(3, dtype=torch.uint8))),
        "random",
    ),
    "an unknown optimiser tensor": (_edit_tensors(OPT, _set("extra", torch.zeros(2))), "extra"),
    "a weight of the wrong shape": (_edit_tensors(TRAINABLE, _reshape("")), "shape"),
    "a missing weight": (_edit_tensors(TRAINABLE, _drop("")), "trainable"),
    "a weight of integers": (_edit_tensors(TRAINABLE, _as_int("weight")), "dtype"),
}


def test_an_unedited_checkpoint_resumes(mid_epoch: Path, tiny_bert_dir: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(mid_epoch, tmp_path / "ckpt"))
    result = _resume(tiny_bert_dir, folder)
    assert result.resumed_from == 0 and len(result.history) == 2
    assert json.loads((folder / "checkpoint.json").read_text())["step"] == 2 * STEPS_PER_EPOCH


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_one_line_and_trains_nothing(
    damage: str, mid_epoch: Path, tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = Path(shutil.copytree(mid_epoch, tmp_path / "ckpt"))
    edit, named = DAMAGE[damage]
    edit(folder)
    before = _snapshot(folder)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("trained from a damaged checkpoint")

    monkeypatch.setattr(trainer, "batch_loss", never)
    with pytest.raises(ModelError) as caught:
        _resume(tiny_bert_dir, folder)
    message = str(caught.value)
    assert "\n" not in message and str(folder) in message and named in message, message
    assert "--resume" in message
    assert _snapshot(folder) == before


def test_the_router_refuses_an_epoch_step_past_its_epoch(tiny_bert_dir: Path, tmp_path: Path) -> None:
    """The issue's case: epoch_step 1e9 trained nothing and saved an untrained router as trained."""
    csv, out, ckpt = _csv(tmp_path / "t.csv"), tmp_path / "out", tmp_path / "ckpt"
    ok(_train("router", csv, out, tiny_bert_dir, "--checkpoint-dir", ckpt))
    _edit_state(epoch=0, step=0, epoch_step=1_000_000_000, partial={"loss": 1.0, "n_rows": 2})(ckpt)
    shutil.rmtree(out)
    message = assert_clean_error(_train("router", csv, out, tiny_bert_dir, "--checkpoint-dir", ckpt, "--resume"))
    assert "epoch_step" in message and str(ckpt) in message
    assert not out.exists()
