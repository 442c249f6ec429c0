"""The anchor (ours, issue 25): fine-tuning with it keeps plain vectors nearer the base model's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.train.anchor import Anchor
from condsearch.train.finetune import FinetuneConfig, fit_encoder
from tests.train.test_finetune_resume import _data


def _plain(encoder, texts: list[str]) -> torch.Tensor:
    with torch.no_grad():
        encoder.model.eval()
        return torch.nn.functional.normalize(encoder.forward_pairs([(t, None) for t in texts]).float(), dim=1)


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_the_anchor_keeps_plain_vectors_nearer_the_base(tiny_bert_dir: Path, kind: str) -> None:
    data = _data()
    texts = list(dict.fromkeys(data.sentence1 + data.sentence2))
    drift = {}
    for weight in (0.0, 20.0):
        encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
        start = _plain(encoder, texts)
        config = FinetuneConfig(kind=kind, epochs=2, batch_size=2, lr=2e-2, warmup=0.0, anchor_weight=weight)
        result = fit_encoder(encoder, data, config)
        drift[weight] = float((1 - (_plain(encoder, texts) * start).sum(dim=1)).mean())
        assert ("anchor" in result.history[-1]) == (weight > 0)  # the term is logged when it is on
    assert drift[0.0] > 0 and drift[20.0] < 0.5 * drift[0.0]


def test_the_anchor_is_zero_at_the_start_and_recorded_only_when_on(tiny_bert_dir: Path) -> None:
    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    texts = ["a dog runs on the beach", "two men play soccer", "a dog runs on the beach"]
    anchor = Anchor.of(encoder, texts, 1.0, batch_size=2)
    assert len(anchor.vectors) == 2
    encoder.model.eval()
    np.testing.assert_allclose(float(anchor.loss(encoder, texts)), 0.0, atol=1e-6)
    assert "anchor_weight" not in FinetuneConfig(kind="full").record()  # older checkpoints still resume
    assert FinetuneConfig(kind="full", anchor_weight=0.5).record()["anchor_weight"] == 0.5
    with pytest.raises(ValueError, match="anchor_weight"):
        FinetuneConfig(anchor_weight=-1.0)
