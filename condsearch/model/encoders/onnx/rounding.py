"""How far two correct float runs of one model may differ: a bound from rounding at the magnitudes computed.

Two correct runs of one model on other backends (torch, onnxruntime), batchings, thread counts or
CPU kinds differ only by rounding: each operation rounds its result to within half an ulp, ``eps / 2``
relative to the values it works on. Those errors are as often up as down and add like a random walk,
so after ``depth`` chained operations at magnitude ``M`` two runs differ by about
``eps * sqrt(depth) * M``; :func:`float_tolerance` allows :data:`SAFETY` times that.

``M`` is the largest value the computation passes through, not its result: a sum that cancels keeps
the rounding of its terms (a LoRA adapter's large activations before a layer norm), which is why a
fixed absolute bound is fragile. :func:`largest_activation` measures it on a torch model's own
forward pass. The ONNX exports' probe (:func:`condsearch.model.encoders.onnx.export.disagreement`, CASE's
and the router's) and the tests' differential checks (``tests/tolerance.py``) both derive their
bounds here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

#: float32's machine epsilon, 2**-23: the gap between 1.0 and the next float32
EPS32 = float(np.finfo(np.float32).eps)
#: how many times the expected rounding difference two correct runs may differ by; rounding rarely
#: adds up in one direction, so real differences stay well inside (measured across thread counts and
#: CPU kernels with ``make test-numerics``), while a real defect (another pooling, a dropped token,
#: a wrong mask, damaged weights) moves vectors by 1e-2 or more
SAFETY = 4.0


def float_tolerance(*magnitudes: Any, depth: int, eps: float = EPS32) -> float:
    """Return how far two runs of one float computation may differ: SAFETY * eps * sqrt(depth) * max|magnitudes|.

    ``magnitudes``: numbers or arrays holding the largest values the computation passes through;
    ``depth``: the operations chained from input to output (matrix products, normalisations, sums).
    """
    scale = max((float(np.max(np.abs(np.asarray(m, dtype=np.float64)))) for m in magnitudes), default=0.0)
    return SAFETY * eps * math.sqrt(max(depth, 1)) * scale


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

    Yields a list; each completed forward pass of ``model`` itself appends one number, and on leaving,
    one more holds the largest of any values its modules produced since (the router's passes run
    the model's layers one by one, never the model itself).
    """
    found: list[float] = []
    current = [0.0]
    pending = [False]

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
                pending[0] = True

    def done(_module: torch.nn.Module, _inputs: Any, _output: Any) -> None:
        found.append(current[0])
        current[0], pending[0] = 0.0, False

    hooks = [m.register_forward_hook(note) for m in model.modules()]
    hooks.append(model.register_forward_hook(done))
    try:
        yield found
    finally:
        for hook in hooks:
            hook.remove()
        if pending[0]:
            found.append(current[0])
