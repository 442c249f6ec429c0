"""Metrics and head training on small synthetic features."""

from __future__ import annotations

import math

import numpy as np
import pytest

from condsearch.corpus.csts import CstsData
from condsearch.metrics import correlations, cosine_rows
from condsearch.train.head import HeadTrainConfig, PairFeatures, case_features, evaluate_head, fit_head
from tests.benchmarks.test_benchmarks import load_script
from tests.conftest import HashEncoder


def test_correlations_perfect_and_inverse() -> None:
    x = np.array([0.1, 0.4, 0.2, 0.9], dtype=np.float32)
    up = correlations(x, x * 3 + 1)
    assert up["n"] == 4
    assert up["spearman"] == pytest.approx(100.0) and up["pearson"] == pytest.approx(100.0)
    down = correlations(x, -x)
    assert down["spearman"] == pytest.approx(-100.0)


def test_correlations_match_hand_computation() -> None:
    p = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    y = np.array([2.0, 1.0, 4.0, 3.0, 5.0])
    out = correlations(p, y)
    assert out["pearson"] == pytest.approx(100 * np.corrcoef(p, y)[0, 1])
    # ranks equal values here, so Spearman equals Pearson
    assert out["spearman"] == pytest.approx(out["pearson"])
    assert out["spearman"] == pytest.approx(80.0)


@pytest.mark.parametrize("p", [np.array([0.5]), np.array([]), np.array([0.3, 0.3, 0.3])])
def test_correlations_undefined(p: np.ndarray) -> None:
    out = correlations(p, np.arange(len(p), dtype=float))
    assert math.isnan(out["spearman"]) and math.isnan(out["pearson"]) and out["n"] == len(p)


def test_cosine_rows() -> None:
    a = np.array([[1, 0], [1, 1], [0, 0]], dtype=np.float32)
    b = np.array([[2, 0], [-1, -1], [1, 0]], dtype=np.float32)
    np.testing.assert_allclose(cosine_rows(a, b), [1.0, -1.0, 0.0], atol=1e-6)


def _synthetic(n: int, seed: int, d_signal: int = 4, d_noise: int = 12) -> PairFeatures:
    """Pairs whose label follows the similarity of a few signal dimensions hidden under louder noise."""
    rng = np.random.default_rng(seed)
    s1 = rng.standard_normal((n, d_signal))
    mix = rng.uniform(0, 1, size=(n, 1))
    s2 = mix * s1 + (1 - mix) * rng.standard_normal((n, d_signal))
    cos = (s1 * s2).sum(1) / np.linalg.norm(s1, axis=1) / np.linalg.norm(s2, axis=1)
    labels = np.clip(np.round(1 + 4 * (cos + 1) / 2), 1, 5).astype(np.float32)
    x1 = np.hstack([s1, 3 * rng.standard_normal((n, d_noise))]).astype(np.float32)
    x2 = np.hstack([s2, 3 * rng.standard_normal((n, d_noise))]).astype(np.float32)
    return PairFeatures(x1, x2, labels)


def test_train_head_learns_and_keeps_best_epoch() -> None:
    train, dev = _synthetic(600, 0), _synthetic(300, 1)
    config = HeadTrainConfig(dim=8, epochs=20, batch_size=64, lr=3e-2, dropout=0.0, seed=0)
    untrained, _ = fit_head(train, HeadTrainConfig(dim=8, epochs=1, lr=1e-12, seed=0), dev=dev)
    before = evaluate_head(untrained, dev)["spearman"]
    epochs_seen = []
    head, history = fit_head(train, config, dev=dev, on_epoch=lambda e, loss, d: epochs_seen.append((e, d)))
    after = evaluate_head(head, dev)["spearman"]
    assert len(history) == 20 and [e for e, _ in epochs_seen] == list(range(1, 21))
    assert all(d is not None and "spearman" in d for _, d in epochs_seen)
    assert after > before + 30, (before, after)
    assert after > 60
    best = max(row["dev_spearman"] for row in history)
    assert after == pytest.approx(best, abs=1e-4)  # the best epoch's weights are the ones returned
    assert history[-1]["loss"] < history[0]["loss"]
    assert not head.training
    assert head.config.input_dim == 16 and head.config.dim == 8


def test_train_head_is_reproducible() -> None:
    train = _synthetic(200, 2)
    config = HeadTrainConfig(dim=4, epochs=3, batch_size=32, seed=7)
    a, _ = fit_head(train, config)
    b, _ = fit_head(train, config)
    np.testing.assert_array_equal(a.linear.weight.detach().numpy(), b.linear.weight.detach().numpy())


def test_train_head_without_dev_has_loss_only_history() -> None:
    _, history = fit_head(_synthetic(100, 3), HeadTrainConfig(dim=4, epochs=2, batch_size=50))
    assert [set(r) for r in history] == [{"epoch", "loss"}] * 2


def test_case_and_plain_features_use_the_encoder() -> None:
    data = CstsData(
        ["red dress", "tennis"], ["blue dress", "soccer"], ["colour", "sport"], np.array([2.0, 4.0], dtype=np.float32)
    )
    enc = HashEncoder()
    f = case_features(enc, data)
    v = HashEncoder.vector
    np.testing.assert_allclose(f.x1[0], v(("colour", "red dress")) - v(("colour", None)), atol=1e-6)
    np.testing.assert_allclose(f.x2[1], v(("sport", "soccer")) - v(("sport", None)), atol=1e-6)
    np.testing.assert_array_equal(f.labels, data.labels)
    p = load_script("features").plain_features(HashEncoder(), data)
    np.testing.assert_array_equal(p.x2[0], v(("blue dress", None)))
    no_head = evaluate_head(None, f)
    assert no_head["n"] == 2


def test_train_head_returns_best_dev_epoch_not_last() -> None:
    train = _synthetic(600, 0)
    flipped = _synthetic(300, 1)
    dev = PairFeatures(flipped.x1, flipped.x2, 6 - flipped.labels)  # dev rewards the opposite of train
    config = HeadTrainConfig(dim=8, epochs=12, batch_size=64, lr=3e-2, dropout=0.0, seed=0)
    head, history = fit_head(train, config, dev=dev)
    scores = [row["dev_spearman"] for row in history]
    best_epoch = int(np.argmax(scores))
    assert best_epoch < len(scores) - 1 and scores[-1] < max(scores) - 10  # training made dev worse
    assert evaluate_head(head, dev)["spearman"] == pytest.approx(max(scores), abs=1e-4)
