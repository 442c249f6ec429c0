"""A projection head's files without torch: where the shipped heads live, its config, checksum and weights.

``condsearch.head`` builds the torch module from these (and re-exports them); a one-shot query
applies the head with numpy (:class:`NumpyHead`) so that it need not ``import torch``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from condsearch.errors import ModelError

HEAD_FORMAT_VERSION = 1
WEIGHTS_FILE = "head.safetensors"
CONFIG_FILE = "head.json"
ASSETS_DIR = Path(__file__).parent / "assets"
#: ``--head default`` (what auto picks for the default model): its LoRA adapter + head fine-tuned on C-STS
DEFAULT_HEAD_DIR = ASSETS_DIR / "minilm-case-lora"
#: the head trained on the frozen default model: ``--head frozen``
FROZEN_HEAD_DIR = ASSETS_DIR / "minilm-case-head"
#: the one weight a head holds (``ProjectionHead.linear``, no bias): (dim, input_dim)
LINEAR_WEIGHT = "linear.weight"


@dataclass(frozen=True)
class HeadConfig:
    """Shape and provenance of a projection head."""

    input_dim: int
    dim: int
    dropout: float = 0.15
    negative_slope: float = 0.01
    model_id: str = ""
    model_revision: str = ""
    encoder_pooling: str = ""


def head_checksum(directory: Path) -> str:
    """Return the sha256 of the head's weights file."""
    return hashlib.sha256((Path(directory) / WEIGHTS_FILE).read_bytes()).hexdigest()


def read_head_config(directory: Path) -> HeadConfig:
    """Return the config in a head folder, checking its format version."""
    directory = Path(directory)
    try:
        meta = json.loads((directory / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{directory}: not a condsearch head ({CONFIG_FILE} unreadable)") from exc
    if meta.get("format_version") != HEAD_FORMAT_VERSION:
        raise ModelError(f"{directory}: head format {meta.get('format_version')} is not supported")
    fields = set(HeadConfig.__dataclass_fields__)
    return HeadConfig(**{k: v for k, v in meta.items() if k in fields})


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
    """Load a head saved by ``condsearch.head.save_head`` for numpy inference."""
    from safetensors.numpy import load_file

    config = read_head_config(directory)
    try:
        weight = load_file(str(Path(directory) / WEIGHTS_FILE))[LINEAR_WEIGHT].astype(np.float32)
    except Exception as exc:  # safetensors raises several types for damaged files
        raise ModelError(f"{directory}: head weights unreadable ({type(exc).__name__})") from exc
    if weight.shape != (config.dim, config.input_dim):
        raise ModelError(f"{directory}: head weights are {weight.shape}, not ({config.dim}, {config.input_dim})")
    return NumpyHead(config, weight)
