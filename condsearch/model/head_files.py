"""A projection head applied with numpy: a one-shot query uses it so that it need not ``import torch``.

The head's folder (config, checksum, fit) is :mod:`condsearch.model.artifacts.heads`'s; the torch
module that trains it is :class:`condsearch.model.head.ProjectionHead`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from condsearch.base.artifact_files import HEAD_WEIGHTS
from condsearch.errors import ModelError
from condsearch.model.artifacts.heads import HeadConfig, read_head_config

#: the one weight a head holds (``ProjectionHead.linear``, no bias): (dim, input_dim)
LINEAR_WEIGHT = "linear.weight"


@dataclass(frozen=True)
class NumpyHead:
    """The head in eval mode (LeakyReLU of a linear map; dropout is off) as a numpy function."""

    config: HeadConfig
    weight: np.ndarray  # (dim, input_dim) float32

    def project(self, vectors: np.ndarray) -> np.ndarray:
        """Project (n, input_dim) float32 vectors: (n, dim) float32."""
        x = np.asarray(vectors, dtype=np.float32) @ self.weight.T
        return np.where(x >= 0, x, x * np.float32(self.config.negative_slope)).astype(np.float32, copy=False)


def load_numpy_head(directory: Path) -> NumpyHead:
    """Load a head saved by ``condsearch.model.head.save_head`` for numpy inference."""
    from condsearch.model.artifacts.weights import load_weights

    config = read_head_config(directory)
    state = load_weights(Path(directory) / HEAD_WEIGHTS, "head weights", framework="numpy")
    if LINEAR_WEIGHT not in state:
        raise ModelError(f"{directory}: head weights hold no {LINEAR_WEIGHT}")
    weight = np.asarray(state[LINEAR_WEIGHT], dtype=np.float32)
    if weight.shape != (config.dim, config.input_dim):
        raise ModelError(f"{directory}: head weights are {weight.shape}, not ({config.dim}, {config.input_dim})")
    return NumpyHead(config, weight)
