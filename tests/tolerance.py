"""Tolerances for two float computations of one quantity, derived from rounding at the magnitudes computed.

Two correct runs of one model on other backends (torch, onnxruntime), batchings, thread counts, CPU
kinds or cache paths differ only by rounding: each operation rounds its result to within half an ulp,
``eps / 2`` relative to the values it works on. Those errors are as often up as down and add like a
random walk, so after ``depth`` chained operations at magnitude ``M`` two runs differ by about
``eps * sqrt(depth) * M``; :func:`float_tolerance` allows :data:`SAFETY` times that.

``M`` is the largest value the computation passes through, not its result: a sum that cancels keeps
the rounding of its terms (a LoRA adapter's large activations before a layer norm, a CASE difference
of two nearly equal vectors), which is why a fixed absolute tolerance such as 1e-5 is fragile. The
helpers below measure it: :func:`forward_scales` records the largest activation of each input's own
forward pass, :func:`pooled_tolerance` turns that into a tolerance per pooled vector,
:func:`case_tolerance` adds the condition's own vector, and :func:`unit_tolerance` carries a tolerance
through a head and the normalisation to unit length (which divides the error by the vector's norm).

The rule itself (:func:`float_tolerance`, :data:`SAFETY`, :func:`transformer_depth`,
:func:`largest_activation`) lives in :mod:`condsearch.model.encoders.onnx.rounding`, which the ONNX exports'
probe uses too. Rankings are compared up to ties: :func:`assert_same_ranking` in ``tests/conftest.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from condsearch.model.encoders.onnx.rounding import (  # noqa: F401 - re-exported: the tests' one place for tolerances
    EPS32,
    SAFETY,
    float_tolerance,
    largest_activation,
    transformer_depth,
)

#: float16's, 2**-10: for states cached in float16
EPS16 = float(np.finfo(np.float16).eps)


def float32_tolerance(*magnitudes: Any, depth: int) -> float:
    """Return :func:`float_tolerance` for float32."""
    return float_tolerance(*magnitudes, depth=depth, eps=EPS32)


def forward_scales(model: torch.nn.Module, run_one: Callable[[Any], object], items: Sequence[Any]) -> np.ndarray:
    """Return, for each item, the largest activation of ``model`` while ``run_one(item)`` runs it alone: (n,)."""
    scales = []
    with torch.inference_mode():
        for item in items:
            with largest_activation(model) as found:
                run_one(item)
            scales.append(max(found, default=0.0))
    return np.asarray(scales, dtype=np.float64)


def pooled_tolerance(encoder: Any, pairs: Sequence[tuple[str, str | None]]) -> np.ndarray:
    """Return the float32 tolerance of each pair's pooled vector f(c; I(s)) from a torch BERT-style encoder: (n,).

    Each pair runs alone through ``encoder.model`` to find the magnitudes its own forward pass reaches.
    """
    model = encoder.model
    scales = forward_scales(model, lambda pair: encoder.encode_batch([pair]), pairs)
    depth = transformer_depth(model)
    return np.asarray([float32_tolerance(s, depth=depth) for s in scales])


def case_tolerance(encoder: Any, texts: Sequence[str], condition: str) -> np.ndarray:
    """Return the float32 tolerance of each raw CASE vector f(c; I(s)) - f(c; I(∅)): (n,), both terms' rounding."""
    pairs: list[tuple[str, str | None]] = [(condition, t) for t in texts]
    tol = pooled_tolerance(encoder, [*pairs, (condition, None)])
    return tol[:-1] + tol[-1]


def _alone(tokenizer: Any, text: str) -> dict[str, torch.Tensor]:
    return dict(tokenizer([text], return_tensors="pt"))


def text_tolerance(model: torch.nn.Module, tokenizer: Any, texts: Sequence[str], *context: str) -> np.ndarray:
    """Return the float32 tolerance of each text's pooled hidden states from a BERT-style model: (n,).

    Each text runs alone through ``model`` (a router's backbone too); ``context`` (the conditions routed
    into it) adds the largest magnitude of their own forward passes.
    """
    scales = forward_scales(model, lambda text: model(**_alone(tokenizer, text)), texts)
    if context:
        scales = np.maximum(scales, forward_scales(model, lambda text: model(**_alone(tokenizer, text)), context).max())
    depth = transformer_depth(model)
    return np.asarray([float32_tolerance(s, depth=depth) for s in scales])


def mean_pooled(model: torch.nn.Module, tokenizer: Any, texts: Sequence[str]) -> np.ndarray:
    """Return each text's mean last hidden state, the text run alone: (n, hidden) float64 (norms for unit_tolerance)."""
    rows = []
    with torch.inference_mode():
        for text in texts:
            rows.append(model(**_alone(tokenizer, text)).last_hidden_state[0].mean(0).double().numpy())
    return np.stack(rows)


def routed_tolerance(encoder: Any, texts: Sequence[str], conditions: str | Sequence[str] = ()) -> np.ndarray:
    """Return the float32 tolerance of each raw routed vector a CSR encoder gives texts under conditions: (n,).

    Cached lower-layer states finished under a condition code round as the one forward pass does, at
    the magnitudes of the backbone's pass over the text and over the condition.
    """
    context = [conditions] if isinstance(conditions, str) else list(dict.fromkeys(conditions))
    return text_tolerance(encoder.router.model, encoder.tokenizer, texts, *context)


def score_tolerance(dim: int) -> float:
    """Return how far two inner products of unit vectors of dim entries may differ, summed in other orders."""
    return float32_tolerance(1.0, depth=dim)


def head_gain(head: Any) -> float:
    """Return how much a head can stretch a difference of its inputs: its weight's largest singular value.

    A leaky ReLU after it stretches nothing; no head, 1.
    """
    if head is None:
        return 1.0
    weight = getattr(getattr(head, "linear", None), "weight", None)
    if weight is None:
        weight = head.weight
    w = weight.detach().cpu().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
    return float(np.linalg.norm(np.asarray(w, dtype=np.float64), 2))


def unit_tolerance(raw: np.ndarray, raw_tolerance: np.ndarray, head: Any = None) -> np.ndarray:
    """Return the tolerance of each row of normalize(head(raw)) given each raw row's elementwise tolerance: (n,).

    A row's error of at most ``t`` in each of its d entries has a length of at most t * sqrt(d); the head
    stretches it by at most :func:`head_gain`; normalising divides it by the projected row's length. The
    head's own float32 products add a rounding at the raw rows' magnitude.
    """
    raw = np.asarray(raw, dtype=np.float64)
    projected = head.project(raw.astype(np.float32)) if head is not None else raw
    own = np.asarray([float32_tolerance(row, depth=raw.shape[1]) for row in raw]) if head is not None else 0.0
    error = (np.asarray(raw_tolerance) + own) * math.sqrt(raw.shape[1]) * head_gain(head)
    return error / np.maximum(np.linalg.norm(projected, axis=1), np.finfo(np.float32).tiny)


def vector_tolerance(vectorizer: Any, texts: Sequence[str], condition: str) -> np.ndarray:
    """Return the tolerance of each unit vector a torch vectorizer (CASE or CSR) gives texts under a condition: (n,)."""
    encoder = vectorizer.encoder
    raw = encoder.encode(texts, condition)
    if hasattr(encoder, "router"):  # a CSR encoder: routed vectors
        return unit_tolerance(raw, routed_tolerance(encoder, texts, condition), vectorizer.head)
    return unit_tolerance(raw, case_tolerance(encoder, texts, condition), vectorizer.head)


def assert_rows_close(actual: np.ndarray, desired: np.ndarray, tolerance: np.ndarray | float) -> None:
    """Assert that each row of actual is within its tolerance of desired's, entry by entry."""
    actual, desired = np.asarray(actual), np.asarray(desired)
    assert actual.shape == desired.shape, (actual.shape, desired.shape)
    tol = np.broadcast_to(np.asarray(tolerance, dtype=np.float64).reshape(-1, *([1] * (actual.ndim - 1))), actual.shape)
    gap = np.abs(actual.astype(np.float64) - desired.astype(np.float64))
    bad = np.argwhere(gap > tol)
    assert not len(bad), (
        f"{len(bad)} entries differ past their float32 tolerance; first at {tuple(bad[0])}: "
        f"{actual[tuple(bad[0])]} vs {desired[tuple(bad[0])]} (gap {gap[tuple(bad[0])]:.3g} > {tol[tuple(bad[0])]:.3g})"
    )
