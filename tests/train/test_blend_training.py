"""Training as a blend (ours, issue 25): the score fitted and chosen on is B × CASE + (1 − B) × plain."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from condsearch.corpus.csts import CstsData
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.train.anchor import Anchor
from condsearch.train.blend import Blend
from condsearch.train.finetune import FinetuneConfig, evaluate_encoder, fit_encoder
from condsearch.train.head import case_features
from tests.train.test_finetune_resume import _data


def _encoder(tiny_bert_dir: Path):  # type: ignore[no-untyped-def]
    return load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))


def _distinct() -> CstsData:
    """Six pairs of different texts and labels (no tied cosines to rank)."""
    s1 = ["a red dress", "a man rides a horse", "two dogs play", "a blue car", "an old man reads", "kids swim"]
    s2 = ["a girl in orange", "a woman on a bike", "a cat sleeps", "a green truck", "a boy writes", "a fish swims"]
    conditions = ["the color", "the animal", "the animal", "the color", "the activity", "the activity"]
    return CstsData(s1, s2, conditions, np.array([4.0, 2.5, 3.0, 1.0, 2.0, 5.0], np.float32))


def test_the_dev_score_is_the_blends_spearman(tiny_bert_dir: Path) -> None:
    data = _distinct()
    encoder = _encoder(tiny_bert_dir)
    base = Anchor.of(encoder, data.sentence1 + data.sentence2, 1.0, batch_size=4).vectors
    blend = Blend.of(0.3, base, data)
    got = evaluate_encoder(encoder, None, data, batch_size=4, blend=blend)["spearman"]
    # the same score built by hand: the CASE cosine under each row's condition, and the plain one
    f = case_features(encoder, data, batch_size=4, cache=None)
    case = torch.nn.functional.cosine_similarity(torch.from_numpy(f.x1), torch.from_numpy(f.x2), dim=1).numpy()
    plain = np.array([float(base[a] @ base[b]) for a, b in zip(data.sentence1, data.sentence2, strict=True)])
    mixed = 0.3 * case + 0.7 * plain
    assert np.diff(np.sort(mixed)).min() > 1e-4  # no near-ties: the ranks do not depend on rounding
    want = 100 * spearmanr(mixed, data.labels)[0]
    np.testing.assert_allclose(got, want, atol=1e-3)
    assert abs(got - evaluate_encoder(encoder, None, data, batch_size=4)["spearman"]) > 1e-3  # the blend counts


def test_training_as_a_blend_fits_the_blended_score(tiny_bert_dir: Path) -> None:
    data = _data()
    losses = {}
    for share in (1.0, 0.5):
        torch.manual_seed(0)
        encoder = _encoder(tiny_bert_dir)
        config = FinetuneConfig(kind="full", epochs=2, batch_size=4, lr=1e-2, warmup=0.0, blend=share)
        result = fit_encoder(encoder, data, config, dev=data)
        losses[share] = result.history[0]["loss"]
        assert np.isfinite(result.history[-1]["dev_spearman"])
    # the same weights and batches, but half the score is fixed: the first epoch's loss differs
    assert losses[1.0] != pytest.approx(losses[0.5], abs=1e-6)


def test_blend_is_recorded_only_when_on_and_checked() -> None:
    assert "blend" not in FinetuneConfig(kind="full").record()  # older checkpoints still resume
    assert FinetuneConfig(kind="full", blend=0.5).record()["blend"] == 0.5
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="blend"):
            FinetuneConfig(blend=bad)
