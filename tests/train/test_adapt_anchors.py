"""The anchors adapting trains with: the replay anchor (bundled captions under their conditions) and distillation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from condsearch.corpus.csts import CstsData
from condsearch.corpus.demo import read_demo_rows
from condsearch.train.replay import REPLAY_CONDITIONS, demo_replay


def test_demo_replay_is_every_caption_under_every_condition() -> None:
    _, captions = read_demo_rows()
    rows = demo_replay()
    assert len(rows) == len(captions) * len(REPLAY_CONDITIONS)
    assert set(zip(rows.sentence1, rows.condition, strict=True)) == {
        (t, c) for t in captions for c in REPLAY_CONDITIONS
    }
    assert rows.sentence1 == rows.sentence2


def _train_rows() -> CstsData:
    colours, animals = ["red", "blue", "green"], ["cat", "dog", "horse"]
    s1, s2, cond, labels = [], [], [], []
    for i in range(48):
        a = f"a {colours[i % 3]} {animals[(i // 3) % 3]} runs in the park"
        b = f"a {colours[(i + 1) % 3]} {animals[(i // 3) % 3]} sleeps at home"
        for condition, same in (("the colour", False), ("the kind of animal", True)):
            s1.append(a)
            s2.append(b)
            cond.append(condition)
            labels.append(5.0 if same else 1.0)
    return CstsData(s1, s2, cond, np.asarray(labels, dtype=np.float32))


def _drift(tiny_bert_dir: Path, replay: CstsData, **weights: float) -> float:
    """Train a fresh context router hard on the toy rows; return the replay rows' mean cosine to their start vectors."""
    from condsearch.model.csr.context import CONTEXT
    from condsearch.model.csr.encoder import load_csr_encoder
    from condsearch.train.router import RouterTrainConfig, _Featurizer, _start_routed, fit_router

    enc = load_csr_encoder(str(tiny_bert_dir), router="none", variant=CONTEXT, device="cpu")
    feats = _Featurizer(enc, replay, cached=False)
    before = _start_routed(feats)
    config = RouterTrainConfig(epochs=2, batch_size=8, lr=5e-3, seed=0, train_backbone="top", init="router", **weights)
    fit_router(enc, _train_rows(), config, replay=replay)
    after = _start_routed(feats)
    return float((before * after).sum(dim=1).mean())


def test_the_replay_anchor_keeps_the_captions_vectors_nearer_their_start(tiny_bert_dir: Path) -> None:
    torch.manual_seed(0)
    replay = demo_replay(("the colour", "the place")).head(200)
    free = _drift(tiny_bert_dir, replay)
    held = _drift(tiny_bert_dir, replay, replay_weight=20.0, replay_batch=32)
    assert free < 0.999  # the training moved them
    assert held > free


def test_replay_weights_are_checked() -> None:
    from condsearch.train.router import RouterTrainConfig

    with pytest.raises(ValueError, match="replay_weight"):
        RouterTrainConfig(replay_weight=-1.0)
    with pytest.raises(ValueError, match="replay_batch"):
        RouterTrainConfig(replay_batch=0)
