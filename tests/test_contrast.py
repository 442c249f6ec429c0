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
