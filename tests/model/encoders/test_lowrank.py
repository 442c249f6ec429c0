"""A full fine-tune as a low-rank delta adapter (truncated SVD of each ΔW), and weight averaging, on the tiny BERT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from condsearch.base.artifact_files import NATIVE_ADAPTER_CONFIG as ADAPTER_CONFIG
from condsearch.corpus.csts import CstsData
from condsearch.errors import ModelError
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.lowrank import apply_deltas, average_weights, low_rank, read_tuned, weight_deltas
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.train.adapter import save_delta_adapter
from condsearch.train.finetune import FinetuneConfig, fit_encoder
from tests.tolerance import assert_rows_close, case_tolerance

TEXTS = ["a girl in an orange dress serves the ball", "two men play soccer on a grass field"]
COND = "color of the dress"


def _encoder(folder: Path, adapter: Path | None = None):  # noqa: ANN202 - a BertStyleEncoder
    return load_encoder(EncoderSpec(str(folder), adapter=adapter, runtime=Runtime(device="cpu")))


def _data() -> CstsData:
    rows = [
        ("a girl in a red dress", "a woman in a red dress", COND, 5),
        ("a girl in a red dress", "a woman in a red dress", "the sport", 2),
        ("two men play soccer", "a boy plays soccer", "the sport", 5),
        ("two men play soccer", "a boy plays soccer", COND, 1),
    ]
    return CstsData(*[list(c) for c in zip(*[r[:3] for r in rows], strict=True)], np.array([r[3] for r in rows], "f4"))


def _base_state(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in _encoder(folder).model.state_dict().items()}


def test_low_rank_is_exact_at_full_rank_and_optimal_below() -> None:
    torch.manual_seed(0)
    delta = torch.randn(12, 7)
    b, a = low_rank(delta, 7)
    assert b.shape == (12, 7) and a.shape == (7, 7)
    torch.testing.assert_close(b @ a, delta, rtol=0, atol=1e-5)
    b, a = low_rank(delta, 3)
    s = torch.linalg.svdvals(delta)
    # Eckart–Young: the error is exactly the dropped singular values
    assert torch.linalg.norm(delta - b @ a).item() == pytest.approx(torch.linalg.norm(s[3:]).item(), rel=1e-4)
    assert low_rank(delta, 50)[1].shape == (7, 7)  # a rank above the matrix's is its full rank


@pytest.mark.numerics
def test_full_fine_tune_at_full_rank_reproduces_the_model(tiny_bert_dir: Path, tmp_path: Path) -> None:
    # two steps: the linear schedule's first step warms up from a rate of 0
    config = FinetuneConfig(kind="full", epochs=2, batch_size=4, lr=1e-2)
    tuned = _encoder(tiny_bert_dir)
    fit_encoder(tuned, _data(), config, checkpoint_dir=tmp_path / "ckpt")
    expected = tuned.encode(TEXTS, COND)
    base = _encoder(tiny_bert_dir)
    assert not np.allclose(base.encode(TEXTS, COND), expected, atol=1e-3)  # training moved it

    state = weight_deltas(_base_state(tiny_bert_dir), read_tuned(tmp_path / "ckpt"), rank=None)
    tuned.model.save_pretrained(str(tmp_path / "model"))  # a model folder reads as the same weights
    from_folder = read_tuned(tmp_path / "model")
    assert set(from_folder) <= set(dict(tuned.model.named_parameters()))
    for key, value in weight_deltas(_base_state(tiny_bert_dir), from_folder, rank=None).items():
        torch.testing.assert_close(value, state[key], msg=key)
    assert not any(k.startswith("pooler.") for k in state)  # untouched by training: left out
    save_delta_adapter(base, state, tmp_path / "full", rank=None, dtype=torch.float32)
    assert json.loads((tmp_path / "full" / ADAPTER_CONFIG).read_text())["kind"] == "delta"
    loaded = _encoder(tiny_bert_dir, adapter=tmp_path / "full")
    # each weight is base + (tuned - base), which rounds to tuned or a neighbouring float32: a second rounding
    assert_rows_close(loaded.encode(TEXTS, COND), expected, 2 * case_tolerance(tuned, TEXTS, COND))
    assert loaded.describe()["adapter_checksum"]

    # float16 as shipped: the same vectors up to rounding; rank 1: another model, and a smaller file
    save_delta_adapter(base, state, tmp_path / "half", rank=None)
    half = _encoder(tiny_bert_dir, adapter=tmp_path / "half").encode(TEXTS, COND)
    np.testing.assert_allclose(half, expected, rtol=1e-2, atol=1e-2)
    small = weight_deltas(_base_state(tiny_bert_dir), read_tuned(tmp_path / "ckpt"), rank=1)
    assert sum(t.numel() for t in small.values()) < sum(t.numel() for t in state.values())
    save_delta_adapter(base, small, tmp_path / "r1", rank=1)
    assert not np.allclose(_encoder(tiny_bert_dir, adapter=tmp_path / "r1").encode(TEXTS, COND), expected)


def test_apply_deltas_refuses_what_does_not_fit(tiny_bert_dir: Path) -> None:
    model = _encoder(tiny_bert_dir).model
    with pytest.raises(ValueError, match="does not fit"):
        apply_deltas(model, {"no.such.weight.delta": torch.zeros(3)})
    name, p = next((n, p) for n, p in model.named_parameters() if p.ndim == 2)
    with pytest.raises(ValueError, match="missing"):
        apply_deltas(model, {f"{name}.delta_b": torch.zeros(p.shape[0], 1)})
    with pytest.raises(ModelError, match="do not fit"):
        weight_deltas({name: p.detach()}, {name: torch.zeros(1, 1)}, rank=2)


def test_average_weights_is_the_mean() -> None:
    a, b = {"w": torch.zeros(2, 2)}, {"w": torch.full((2, 2), 2.0)}
    torch.testing.assert_close(average_weights([a, b])["w"], torch.ones(2, 2))
    with pytest.raises(ModelError, match="different tensors"):
        average_weights([a, {"v": torch.zeros(1)}])


def test_lowrank_benchmark_smoke(tiny_bert_dir: Path, tmp_path: Path) -> None:
    from tests.benchmarks.test_benchmarks import load_script

    out = tmp_path / "out.json"
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--ranks", "1,64", "--out", str(tmp_path / "ad")]
    assert load_script("lowrank").main([*argv, "--out-rank", "64", "--json-out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["setting"] for r in rows] == ["base (no fine-tuning)", "full fine-tune", "rank 1", "rank 64"]
    assert rows[3]["vs_full"] == pytest.approx(0, abs=0.5)  # full rank (float16): the fine-tune itself
    assert (tmp_path / "ad" / ADAPTER_CONFIG).is_file()
    assert rows[2]["energy"] < rows[3]["energy"] == pytest.approx(1.0)  # full rank keeps all of ΔW
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--ranks", "1,64", "--energy-only", "--json-out", str(out)]
    assert load_script("lowrank").main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["rank"] for r in rows] == [1, 64] and "dev_spearman" not in rows[0]

    from condsearch.model.encoders.spec import EncoderSpec, Runtime
    from condsearch.model.vectorizer import load_vectorizer

    base = _encoder(tiny_bert_dir)
    torch.manual_seed(0)
    tuned = {n: p.detach() + 0.05 * torch.randn_like(p) for n, p in base.model.named_parameters()}
    save_delta_adapter(base, weight_deltas(_base_state(tiny_bert_dir), tuned, rank=4), tmp_path / "ad", rank=4)
    vec = load_vectorizer(EncoderSpec(str(tiny_bert_dir), head=str(tmp_path / "ad"), runtime=Runtime(device="cpu")))
    assert vec.head is None and vec.dim == 32
    want = vec.encode(TEXTS, COND)
    assert not np.allclose(
        want,
        load_vectorizer(EncoderSpec(str(tiny_bert_dir), head="none", runtime=Runtime(device="cpu"))).encode(
            TEXTS, COND
        ),
    )
