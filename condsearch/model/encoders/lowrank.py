"""A full fine-tune shipped small: each weight matrix's change as a truncated SVD, an adapter of kind ``delta``.

For a matrix, ``ΔW = W_tuned - W_base ≈ B A`` with ``B = U_r S_r`` (out, r) and ``A = V_rᵀ``
(r, in), the best rank-r approximation in Frobenius norm (Eckart–Young); at ``r = min(out, in)``
it is ΔW itself. Vectors (biases, LayerNorm) are few numbers and are kept whole; unchanged
tensors (the pooler, which C-STS training never reaches) are left out. The factors live in an
adapter folder (``adapter.safetensors`` keyed ``<parameter>.delta_b`` / ``.delta_a`` /
``.delta``, ``adapter.json`` with ``"kind": "delta"``) that ``--adapter FOLDER`` loads like a LoRA
adapter: the products are added to the base weights, so inference costs what the base model costs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from condsearch.base.artifact_files import CHECKPOINT_STATE, CHECKPOINT_TRAINABLE
from condsearch.errors import ModelError
from condsearch.model.artifacts.adapters import DELTA_KIND  # noqa: F401 - the adapter kind this module's output is
from condsearch.model.artifacts.weights import load_weights
from condsearch.model.encoders.lora import apply_deltas  # noqa: F401 - applying a delta adapter is inference's


def low_rank(delta: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (B, A), (out, r) and (r, in) float32, whose product is delta's best rank-r approximation."""
    u, s, vh = torch.linalg.svd(delta.float(), full_matrices=False)
    r = min(rank, s.numel())
    return (u[:, :r] * s[:r]).contiguous(), vh[:r].contiguous()


def weight_deltas(
    base: Mapping[str, torch.Tensor], tuned: Mapping[str, torch.Tensor], rank: int | None
) -> dict[str, torch.Tensor]:
    """Return the adapter tensors for tuned - base: matrices as rank-``rank`` factors (None: full rank), vectors whole.

    Raises ModelError when tuned names a tensor base lacks or has another shape.
    """
    out: dict[str, torch.Tensor] = {}
    for name, weight in tuned.items():
        if name not in base or tuple(base[name].shape) != tuple(weight.shape):
            raise ModelError(f"{name}: the tuned weights do not fit the base model")
        delta = weight.float() - base[name].float()
        if not torch.any(delta):
            continue
        if delta.ndim == 2:
            out[f"{name}.delta_b"], out[f"{name}.delta_a"] = low_rank(delta, rank or min(delta.shape))
        else:
            out[f"{name}.delta"] = delta
    return out


def read_tuned(path: Path) -> dict[str, torch.Tensor]:
    """Return a fine-tune's encoder weights from a model folder, a checkpoint folder or a checkpoint's tensor file.

    A checkpoint's tensors are keyed ``encoder.<name>`` (and ``head.``/``contrastive.``, dropped here);
    a model folder's ``model.safetensors`` by the names themselves.
    """
    path = Path(path)
    checkpoint = not path.is_dir() or (path / CHECKPOINT_STATE).is_file()
    if path.is_dir():
        path = path / (CHECKPOINT_TRAINABLE if checkpoint else "model.safetensors")
    state = load_weights(path, "fine-tuned weights")
    if checkpoint:
        state = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
    return state


def average_weights(states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Return the element-wise mean of several fine-tunes of one model (a uniform weight average, a 'soup')."""
    if not states:
        raise ValueError("nothing to average")
    names = set(states[0])
    if any(set(s) != names for s in states[1:]):
        raise ModelError("the weights to average name different tensors")
    return {n: torch.stack([s[n].float() for s in states]).mean(0).to(states[0][n].dtype) for n in states[0]}


def kept_energy(
    base: Mapping[str, torch.Tensor], tuned: Mapping[str, torch.Tensor], ranks: Sequence[int]
) -> dict[int, float]:
    """Return, per rank, the share of the matrices' total ΔW energy (squared Frobenius norm) that rank keeps."""
    values = [
        torch.linalg.svdvals(weight.float() - base[name].float()) ** 2
        for name, weight in tuned.items()
        if weight.ndim == 2
    ]
    total = float(sum(v.sum() for v in values)) or 1.0
    return {r: float(sum(v[:r].sum() for v in values)) / total for r in ranks}


def delta_bytes(state: Mapping[str, torch.Tensor], bytes_per_value: int = 2) -> int:
    """Return the size of the adapter tensors at bytes_per_value (2: float16 as saved)."""
    return sum(t.numel() for t in state.values()) * bytes_per_value
