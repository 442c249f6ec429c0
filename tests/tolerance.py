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

Rankings are compared up to ties: :func:`assert_same_ranking` in ``tests/conftest.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

#: float32's machine epsilon, 2**-23: the gap between 1.0 and the next float32
EPS32 = float(np.finfo(np.float32).eps)
#: float16's, 2**-10: for states cached in float16
EPS16 = float(np.finfo(np.float16).eps)
#: how many times the expected rounding difference two correct runs may differ by; rounding rarely
#: adds up in one direction, so real differences stay well inside (10 to 40 times, measured across
#: thread counts and CPU kernels with ``make test-numerics``), while a real defect (another pooling,
#: a dropped token, a wrong mask) moves vectors by 1e-2 or more
SAFETY = 4.0


def float_tolerance(*magnitudes: Any, depth: int, eps: float = EPS32) -> float:
    """Return how far two runs of one float computation may differ: SAFETY * eps * sqrt(depth) * max|magnitudes|.

    ``magnitudes``: numbers or arrays holding the largest values the computation passes through;
    ``depth``: the operations chained from input to output (matrix products, normalisations, sums).
    """
    scale = max((float(np.max(np.abs(np.asarray(m, dtype=np.float64)))) for m in magnitudes), default=0.0)
    return SAFETY * eps * math.sqrt(max(depth, 1)) * scale


def float32_tolerance(*magnitudes: Any, depth: int) -> float:
    """Return :func:`float_tolerance` for float32."""
    return float_tolerance(*magnitudes, depth=depth, eps=EPS32)


def transformer_depth(model: torch.nn.Module) -> int:
    """Return the operations chained through a BERT-style model, pooling and a CASE difference included.

    Each layer chains ten: the query, key and value projections, their scores, the softmax, the weighted
    sum, the output projection, a layer norm, the feed-forward pair and a second layer norm.
    """
    config = getattr(model, "config", None)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    if not layers:  # a module without a transformers config: count its layer-norm'ed blocks
        layers = max(1, sum(isinstance(m, torch.nn.LayerNorm) for m in model.modules()) // 2)
    return 10 * layers + 4  # + embeddings, pooling, the CASE difference and a head


@contextmanager
def largest_activation(model: torch.nn.Module) -> Iterator[list[float]]:
    """Record the largest |value| each forward pass of ``model`` produces in any of its modules.

    Yields a list; each completed forward pass of ``model`` itself appends one number.
    """
    found: list[float] = []
    current = [0.0]

    def note(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            outputs: Any = [output]
        elif isinstance(output, dict):  # a transformers ModelOutput
            outputs = output.values()
        else:
            outputs = output if isinstance(output, tuple | list) else []
        for t in outputs:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                current[0] = max(current[0], float(t.detach().abs().max()))

    def done(_module: torch.nn.Module, _inputs: Any, _output: Any) -> None:
        found.append(current[0])
        current[0] = 0.0

    hooks = [m.register_forward_hook(note) for m in model.modules()]
    hooks.append(model.register_forward_hook(done))
    try:
        yield found
    finally:
        for hook in hooks:
            hook.remove()


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
    """Return the tolerance of each unit vector a torch BERT-style vectorizer gives texts under a condition: (n,)."""
    raw = vectorizer.encoder.encode(texts, condition)
    return unit_tolerance(raw, case_tolerance(vectorizer.encoder, texts, condition), vectorizer.head)


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
