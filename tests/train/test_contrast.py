"""The in-condition contrastive objective (condsearch.train.contrast): masks, batches and gradients."""

from __future__ import annotations

import torch

from condsearch.train.contrast import agreement_mask, condition_batches, in_condition_loss


def test_agreement_joins_high_rows_that_share_a_text_under_one_condition():
    s1 = ["a", "b", "a", "x"]
    s2 = ["b", "c", "d", "y"]
    cond = ["colour", "colour", "shape", "colour"]
    high = [True, True, False, True]
    agree = agreement_mask(s1, s2, cond, high)
    assert agree[0, 1] and agree[1, 0]  # a~b and b~c under colour: one group
    assert not agree[0, 3] and not agree[3, 0]  # x~y is another group
    assert not agree[2, 2]  # a low row agrees with nothing, itself included
    assert agree[0, 0] and agree[3, 3]


def test_loss_compares_only_rows_under_the_same_condition():
    torch.manual_seed(0)
    a = torch.randn(4, 8)
    b = torch.randn(4, 8)
    cond = ["c1", "c1", "c2", "c2"]
    agree = torch.eye(4, dtype=torch.bool)
    loss = in_condition_loss(a, b, cond, agree)
    # by hand: row 0 against b0, b1; row 1 against b0, b1; rows 2 and 3 against b2, b3
    cos = torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(b, dim=-1).T / 0.05
    parts = []
    for i, cols in ((0, [0, 1]), (1, [0, 1]), (2, [2, 3]), (3, [2, 3])):
        parts.append(torch.nn.functional.cross_entropy(cos[i, cols][None], torch.tensor([cols.index(i)])))
    assert torch.allclose(loss, torch.stack(parts).mean(), atol=1e-5)


def test_agreeing_rows_are_not_negatives_and_lone_rows_are_skipped():
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    b = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    cond = ["c", "c", "other"]
    agree = torch.tensor([[True, True, False], [True, True, False], [False, False, True]])
    # rows 0 and 1 agree, so neither has a negative; row 2 is alone under its condition
    loss = in_condition_loss(a, b, cond, agree)
    assert loss.detach().item() == 0.0
    loss.backward()  # a zero with a gradient path, so a training step never breaks
    assert a.grad is not None


def test_a_better_ordering_lowers_the_loss():
    cond = ["c", "c", "c"]
    agree = torch.eye(3, dtype=torch.bool)
    b = torch.eye(3)
    good = in_condition_loss(torch.eye(3), b, cond, agree)
    bad = in_condition_loss(torch.eye(3)[[1, 2, 0]], b, cond, agree)
    assert float(good) < float(bad)


def test_condition_batches_keep_keys_together_and_cover_every_item_once():
    keys = ["x"] * 10 + ["y"] * 7 + [f"u{i}" for i in range(5)]
    batches = condition_batches(keys, 4, seed=3)
    flat = sorted(i for batch in batches for i in batch)
    assert flat == list(range(len(keys)))
    pure = [batch for batch in batches if len({keys[i] for i in batch}) == 1 and len(batch) == 4]
    assert len(pure) == 2 + 1  # two full batches of x, one of y
    assert condition_batches(keys, 4, seed=3) == batches
    assert condition_batches(keys, 4, seed=4) != batches


# ----------------------------------------------------------------- in router training


def _labelled_rows():  # type: ignore[no-untyped-def]
    """C-STS rows from a made-up table: colour and animal, each pair alike under one and unlike under the other."""
    import numpy as np

    from condsearch.corpus.csts import CstsData

    colours, animals = ["red", "blue", "green"], ["cat", "dog", "horse"]
    texts = [(c, a, f"A {c} {a} sleeps by the door.") for c in colours for a in animals]
    s1, s2, cond, labels = [], [], [], []
    for i, (c1, a1, t1) in enumerate(texts):
        for c2, a2, t2 in texts[i + 1 :]:
            if (c1 == c2) == (a1 == a2):
                continue  # a contrast pair shares exactly one of the two
            for condition, same in (("the colour", c1 == c2), ("the kind of animal", a1 == a2)):
                s1.append(t1)
                s2.append(t2)
                cond.append(condition)
                labels.append(5.0 if same else 1.0)
    return CstsData(s1, s2, cond, np.asarray(labels, dtype=np.float32))


def _contrast_of(encoder, data) -> float:  # type: ignore[no-untyped-def]
    rows = [i for i, y in enumerate(data.labels) if y >= 4]
    a = torch.from_numpy(encoder.encode([data.sentence1[i] for i in rows], [data.condition[i] for i in rows]))
    b = torch.from_numpy(encoder.encode([data.sentence2[i] for i in rows], [data.condition[i] for i in rows]))
    conds = [data.condition[i] for i in rows]
    agree = agreement_mask(
        [data.sentence1[i] for i in rows], [data.sentence2[i] for i in rows], conds, [True] * len(rows)
    )
    return float(in_condition_loss(a, b, conds, agree))


def _router(folder, cache):  # type: ignore[no-untyped-def]
    from condsearch.model.csr.encoder import load_csr_encoder

    return load_csr_encoder(
        str(folder), router="none", variant="context", layer=-1, cache_dir=cache, state_dtype=torch.float32
    )


def test_router_training_with_the_term_lowers_it(tmp_path, tiny_bert_dir):  # type: ignore[no-untyped-def]
    from condsearch.train.router import RouterTrainConfig, fit_router

    data = _labelled_rows()
    encoder = _router(tiny_bert_dir, tmp_path / "cache")
    before = _contrast_of(encoder, data)
    config = RouterTrainConfig(epochs=2, lr=3e-3, batch_size=8, warmup=0.0, contrast_weight=1.0)
    fit_router(encoder, data, config)
    assert _contrast_of(encoder, data) < before


def test_router_training_with_the_term_resumes_within_an_epoch(tmp_path, tiny_bert_dir, monkeypatch):  # type: ignore[no-untyped-def]
    import pytest

    import condsearch.train.router as training
    from condsearch.train.router import RouterTrainConfig, fit_router

    data = _labelled_rows()
    config = RouterTrainConfig(epochs=2, lr=1e-3, batch_size=8, contrast_weight=0.5)
    straight = _router(tiny_bert_dir, tmp_path / "c1")
    expected = fit_router(straight, data, config, dev=data, checkpoint_dir=tmp_path / "ck1", checkpoint_every=1)

    class Stop(Exception):
        pass

    saved = training.save_checkpoint

    def save_then_stop(folder, state, *args):  # type: ignore[no-untyped-def]
        saved(folder, state, *args)
        if state.epoch == 1 and state.epoch_step == 1:
            raise Stop

    monkeypatch.setattr(training, "save_checkpoint", save_then_stop)
    with pytest.raises(Stop):
        fit_router(
            _router(tiny_bert_dir, tmp_path / "c2"),
            data,
            config,
            dev=data,
            checkpoint_dir=tmp_path / "ck2",
            checkpoint_every=1,
        )
    monkeypatch.setattr(training, "save_checkpoint", saved)
    resumed = _router(tiny_bert_dir, tmp_path / "c3")
    history = fit_router(
        resumed, data, config, dev=data, checkpoint_dir=tmp_path / "ck2", resume=True, checkpoint_every=1
    )
    assert [r["epoch"] for r in history] == [0, 1, 2]
    assert history[-1]["loss"] == pytest.approx(expected[-1]["loss"], rel=1e-4)


def test_a_negative_contrast_weight_is_refused():
    import pytest

    from condsearch.train.router import RouterTrainConfig

    with pytest.raises(ValueError, match="contrast_weight"):
        RouterTrainConfig(contrast_weight=-1.0)
