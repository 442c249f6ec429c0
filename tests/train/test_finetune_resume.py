"""Resuming a fine-tune from a checkpoint written within an epoch: the same weights as a run never stopped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from condsearch.corpus.csts import CstsData
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.train import finetune as trainer
from condsearch.train.finetune import FinetuneConfig, fit_encoder, trainable_parameters

ROWS = [
    ("a girl in a red dress", "a woman in a red dress", "the colour", 5),
    ("a girl in a red dress", "a woman in a red dress", "the sport", 2),
    ("two men play soccer", "a boy plays soccer", "the sport", 5),
    ("two men play soccer", "a boy plays soccer", "the colour", 1),
    ("a dog runs on the beach", "a cat runs on the beach", "the animal", 2),
    ("a dog runs on the beach", "a cat runs on the beach", "the place", 5),
]


class _Stop(Exception):
    pass


def _data() -> CstsData:
    cols = [list(c) for c in zip(*[r[:3] for r in ROWS], strict=True)]
    return CstsData(*cols, np.array([r[3] for r in ROWS], np.float32))


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_resume_within_an_epoch_matches_a_run_never_stopped(
    kind: str, tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 pairs, 1 pair per batch: 3 steps an epoch; dropout on, so the random state must be restored too
    config = FinetuneConfig(kind=kind, epochs=2, batch_size=2, lr=1e-2, head_on_top=True, head_dim=4)
    data = _data()
    straight = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    expected = fit_encoder(straight, data, config, dev=data, checkpoint_dir=tmp_path / "a", checkpoint_every=1)

    real, calls = trainer.batch_loss, []

    def crash_at_step_5(*args: object, **kwargs: object):  # noqa: ANN202
        calls.append(1)
        if len(calls) == 5:  # the second of epoch 2's three steps
            raise _Stop
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "batch_loss", crash_at_step_5)
    with pytest.raises(_Stop):
        fit_encoder(
            load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu"))),
            data,
            config,
            dev=data,
            checkpoint_dir=tmp_path / "b",
            checkpoint_every=1,
        )
    monkeypatch.setattr(trainer, "batch_loss", real)
    info = json.loads((tmp_path / "b" / "checkpoint.json").read_text())
    assert (info["epoch"], info["epoch_step"], info["step"]) == (1, 1, 4)

    resumed_enc = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    resumed = fit_encoder(resumed_enc, data, config, dev=data, checkpoint_dir=tmp_path / "b", resume=True)
    assert resumed.resumed_from == 1 and resumed.best_epoch == expected.best_epoch
    for a, b in zip(expected.history, resumed.history, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["dev_spearman"] == pytest.approx(b["dev_spearman"])
    a, b = trainable_parameters(straight, expected.head), trainable_parameters(resumed_enc, resumed.head)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    assert json.loads((tmp_path / "b" / "checkpoint.json").read_text())["epoch_step"] == 0


def test_layer_decay_scales_each_layer_and_keeps_old_checkpoints_resumable(tiny_bert_dir: Path) -> None:
    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    names = [f"encoder.{n}" for n, _ in encoder.model.named_parameters()]
    scales = trainer.layer_lr_scales(names, 0.5)  # the tiny BERT has 2 layers
    assert scales["encoder.encoder.layer.1.output.dense.weight"] == 1.0
    assert scales["encoder.encoder.layer.0.attention.self.query.weight"] == 0.5
    assert scales["encoder.embeddings.word_embeddings.weight"] == 0.25
    assert set(trainer.layer_lr_scales(names, 1.0).values()) == {1.0}
    # at its default the new field is not in the record a checkpoint is compared on; set, it is
    assert "layer_decay" not in FinetuneConfig(kind="full").record()
    assert FinetuneConfig(kind="full", layer_decay=0.8).record()["layer_decay"] == 0.8
    with pytest.raises(ValueError, match="layer_decay"):
        FinetuneConfig(layer_decay=0.0)


def test_layer_decay_trains_lower_layers_less(tiny_bert_dir: Path) -> None:
    data = _data()
    moved = {}
    for decay in (1.0, 0.1):
        encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
        before = {n: p.detach().clone() for n, p in encoder.model.named_parameters()}
        fit_encoder(encoder, data, FinetuneConfig(kind="full", epochs=1, batch_size=2, lr=1e-2, layer_decay=decay))
        after = dict(encoder.model.named_parameters())
        moved[decay] = {n: float((after[n] - before[n]).abs().max()) for n in before}
    emb, top = "embeddings.word_embeddings.weight", "encoder.layer.1.output.dense.weight"
    assert moved[0.1][emb] < 0.2 * moved[1.0][emb]
    assert moved[0.1][top] > 0.5 * moved[1.0][top]


def test_keep_epochs_keeps_each_epoch_through_later_saves_and_a_resume(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    config = FinetuneConfig(kind="full", epochs=2, batch_size=2, lr=1e-2)
    real, calls = trainer.batch_loss, []

    def crash_at_step_5(*args: object, **kwargs: object):  # noqa: ANN202
        calls.append(1)
        if len(calls) == 5:
            raise _Stop
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "batch_loss", crash_at_step_5)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(_Stop):
        fit_encoder(
            load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu"))),
            _data(),
            config,
            checkpoint_dir=ckpt,
            checkpoint_every=1,
            keep_epochs=True,
        )
    monkeypatch.setattr(trainer, "batch_loss", real)
    assert sorted(f.name for f in ckpt.glob("epoch-*")) == ["epoch-1.safetensors"]  # kept through a mid-epoch save
    first = load_file(str(ckpt / "epoch-1.safetensors"))
    fit_encoder(
        load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu"))),
        _data(),
        config,
        checkpoint_dir=ckpt,
        resume=True,
        keep_epochs=True,
    )
    assert sorted(f.name for f in ckpt.glob("epoch-*")) == ["epoch-1.safetensors", "epoch-2.safetensors"]
    last, trained = load_file(str(ckpt / "epoch-2.safetensors")), load_file(str(ckpt / "trainable.safetensors"))
    for name, value in load_file(str(ckpt / "epoch-1.safetensors")).items():
        torch.testing.assert_close(value, first[name], rtol=0, atol=0)
        torch.testing.assert_close(last[name], trained[name], rtol=0, atol=0)
