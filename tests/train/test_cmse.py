"""CCL's C-MSE term: its value by hand, its gradient's sign, its weight in --loss, and what it trains."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from condsearch.corpus.csts import CstsData
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.train.finetune import ContrastiveProjection, FinetuneConfig, batch_loss, prepare
from condsearch.train.losses import (
    LossSettings,
    cmse_loss,
    combined_loss,
    group_positions,
    pair_groups,
    parse_loss_spec,
)

FIRST = torch.tensor([[2.0, 1.0], [1.0, 1.0], [3.0, 4.0]])
SECOND = torch.tensor([[1.0, 2.0], [0.0, 1.0], [4.0, 3.0]])
LABELS = torch.tensor([0.5, 1.0, 0.0])


def test_cmse_by_hand() -> None:
    # cosines 4/5, 1/sqrt(2) and 24/25 against labels 0.5, 1 and 0
    expected = ((4 / 5 - 0.5) ** 2 + (1 / math.sqrt(2) - 1) ** 2 + (24 / 25) ** 2) / 3
    assert cmse_loss(FIRST, SECOND, LABELS).item() == pytest.approx(expected, rel=1e-6)
    # scale-free: only the directions count
    assert cmse_loss(7 * FIRST, SECOND, LABELS).item() == pytest.approx(expected, rel=1e-6)


def test_cmse_gradient_raises_a_cosine_below_its_label_and_lowers_one_above() -> None:
    first = FIRST.clone().requires_grad_(True)
    cmse_loss(first, SECOND, LABELS).backward()
    assert first.grad is not None
    before = nn.functional.cosine_similarity(FIRST, SECOND, dim=-1)
    after = nn.functional.cosine_similarity(FIRST - 0.1 * first.grad, SECOND, dim=-1)  # one descent step
    assert after[0] < before[0]  # cos 0.8 over label 0.5: lowered
    assert after[1] > before[1]  # cos 0.71 under label 1: raised
    assert after[2] < before[2]  # cos 0.96 over label 0: lowered
    # d loss / d cos = 2 (cos - y) / n: the sign of cos - y, nothing else
    cos = before.clone().requires_grad_(True)
    nn.functional.mse_loss(cos, LABELS).backward()
    assert cos.grad is not None
    assert torch.equal(torch.sign(cos.grad), torch.sign(before - LABELS))


def test_cmse_combines_with_weights_in_the_loss_spec() -> None:
    assert parse_loss_spec("mse+cmse") == {"mse": 1.0, "cmse": 1.0}
    weights = parse_loss_spec("mse=1,cmse=0.5,wacl=0.25")
    assert weights == {"mse": 1.0, "cmse": 0.5, "wacl": 0.25}
    assert LossSettings(weights).needs_projection and not LossSettings({"mse": 1.0}).needs_projection
    cos = torch.tensor([0.9, 0.1, 0.5])
    total, terms = combined_loss(
        LossSettings({"mse": 1.0, "cmse": 0.5}),
        cos,
        LABELS,
        group_positions([[0, 1], [2]]),
        contrastive=(FIRST, SECOND),
    )
    mse = ((0.9 - 0.5) ** 2 + (0.1 - 1.0) ** 2 + 0.5**2) / 3
    cmse = cmse_loss(FIRST, SECOND, LABELS).item()
    assert terms == pytest.approx({"mse": mse, "cmse": cmse})
    assert total.item() == pytest.approx(mse + 0.5 * cmse)
    with pytest.raises(ValueError, match="contrastive"):
        combined_loss(LossSettings({"cmse": 1.0}), cos, LABELS, group_positions([[0, 1], [2]]))


def test_the_contrastive_projection_starts_as_tanh() -> None:
    g = ContrastiveProjection(2)
    torch.testing.assert_close(g(FIRST), torch.tanh(FIRST))


def test_cmse_alone_trains_the_adapters_the_head_and_g(tiny_bert_dir: Path) -> None:
    data = CstsData(
        ["a girl in a red dress", "a girl in a red dress", "two men play soccer", "two men play soccer"],
        ["a woman in a red dress", "a woman in a red dress", "a boy plays soccer", "a boy plays soccer"],
        ["color of the dress", "the sport", "the sport", "color of the dress"],
        np.array([5, 2, 5, 1], np.float32),
    )
    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    config = FinetuneConfig(kind="lora", losses=(("cmse", 1.0),), head_on_top=True, head_dim=4)
    head = prepare(encoder, config)  # type: ignore[arg-type]
    assert head is not None
    g = ContrastiveProjection(4)
    labels = torch.tensor((data.labels - 1) / 4)
    loss, terms = batch_loss(encoder, head, data, pair_groups(data), config.loss_settings, labels, g)  # type: ignore[arg-type]
    assert set(terms) == {"cmse"} and terms["cmse"] == pytest.approx(loss.item())
    loss.backward()
    adapters = [p for p in encoder.model.parameters() if p.requires_grad]
    assert adapters and any(p.grad is not None and p.grad.abs().sum() > 0 for p in adapters)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in g.parameters())
