"""The ONNX export's probe: its float32 bound follows the rounding of the probe's own activations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from condsearch.base.model_sources import resolve_model
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.onnx.bert import _PROBE, OnnxBertEncoder, write_export
from condsearch.model.encoders.onnx.export import FLOAT32_TOLERANCE, probe_tolerance
from condsearch.model.encoders.onnx.rounding import largest_activation
from condsearch.model.encoders.spec import EncoderSpec, Runtime

pytest.importorskip("onnxruntime")


def _stretched(folder: Path, gain: float):  # noqa: ANN202 - a BertStyleEncoder
    """Return the tiny BERT, its last layer norm's weight times gain: pooled outputs (and rounding) that large."""
    encoder = load_encoder(EncoderSpec(str(folder), runtime=Runtime(device="cpu")))
    with torch.no_grad():
        encoder.model.encoder.layer[-1].output.LayerNorm.weight.mul_(gain)
    return encoder


def _largest(encoder) -> float:  # noqa: ANN001
    with largest_activation(encoder.model) as found:
        encoder.encode_batch(_PROBE)
    return max(found)


def test_the_probe_bound_grows_with_the_activations(tiny_bert_dir: Path) -> None:
    plain, stretched = _stretched(tiny_bert_dir, 1.0), _stretched(tiny_bert_dir, 1000.0)
    small, large = _largest(plain), _largest(stretched)
    assert large > 500 * small
    assert probe_tolerance(plain.model, small) == FLOAT32_TOLERANCE  # small activations: the fixed floor
    assert probe_tolerance(stretched.model, large) > 20 * FLOAT32_TOLERANCE
    assert probe_tolerance(stretched.model, 2 * large) == pytest.approx(2 * probe_tolerance(stretched.model, large))


@pytest.mark.numerics
def test_a_good_export_of_a_model_with_large_activations_is_kept(tiny_bert_dir: Path) -> None:
    # its pooled outputs are in the thousands: onnxruntime rounds them a few 1e-4 off torch (2.4e-4
    # here), past the fixed 1e-4 that refused it before, and far inside float32 rounding at that size
    reference = _stretched(tiny_bert_dir, 1000.0)
    source = resolve_model(str(tiny_bert_dir))
    encoder, refused = write_export(reference, source, None, "float32", max_length=None, threads=1)
    assert refused is None and encoder is not None
    want = reference.encode_batch(_PROBE)
    assert np.abs(encoder.encode_batch(_PROBE) - want).max() <= probe_tolerance(reference.model, _largest(reference))


@pytest.mark.parametrize(("gain", "shift"), [(1.0, 3e-4), (1000.0, 0.1)], ids=["small", "large"])
def test_an_export_off_by_more_than_rounding_is_still_refused(
    tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch, gain: float, shift: float
) -> None:
    reference = _stretched(tiny_bert_dir, gain)
    bound = probe_tolerance(reference.model, _largest(reference))
    assert shift > 2 * bound
    real = OnnxBertEncoder.encode_batch
    monkeypatch.setattr(OnnxBertEncoder, "encode_batch", lambda self, pairs: real(self, pairs) + np.float32(shift))
    source = resolve_model(str(tiny_bert_dir))
    encoder, refused = write_export(reference, source, None, "float32", max_length=None, threads=1)
    assert encoder is None and refused is not None and "max difference" in refused
