"""Adapters at inference: fold an adapter folder's weight changes into an encoder's weights, in place.

A LoRA adapter adds ``scaling · B A`` to each adapted projection's weight; a ``delta`` adapter (a
full fine-tune's changes, made by ``finetune/lowrank.py``) adds ``B A`` or a whole tensor to
each parameter it names. Either way the merged model computes the adapted function at the base
model's cost. The folder is read and checked by :mod:`condsearch.model.artifacts.adapters`; training
adapters belongs to the ``finetune`` package.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from condsearch.errors import ModelError
from condsearch.model.artifacts.adapters import DELTA_KIND, Adapter, check_adapter, lora_factors, read_adapter
from condsearch.model.artifacts.weights import load_weights

if TYPE_CHECKING:
    from condsearch.model.encoders.bert import BertStyleEncoder
    from condsearch.model.encoders.decoder import PromptEncoder

_DELTA_SUFFIXES = (".delta_b", ".delta_a", ".delta")


def merge_lora_factors(
    model: nn.Module, factors: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scaling: float
) -> int:
    """Add ``scaling · B A`` to the weight of each named ``nn.Linear`` of model in place; return how many.

    Raises ValueError when a name is not a linear layer of model or a shape differs.
    """
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, (a, b) in factors.items():
            module = modules.get(name)
            if not isinstance(module, nn.Linear):
                raise ValueError(f"adapter does not fit the model (no linear layer {name!r})")
            if (b.shape[0], a.shape[1]) != tuple(module.weight.shape) or a.shape[0] != b.shape[1]:
                raise ValueError(f"adapter tensor {name} has shapes {tuple(a.shape)}, {tuple(b.shape)}")
            # through the weight's dtype first, as a trained adapter's factors are held
            dtype = module.weight.dtype
            delta = (b.to(dtype).float() @ a.to(dtype).float()) * scaling
            module.weight += delta.to(module.weight.device, dtype)
    return len(factors)


def apply_deltas(model: nn.Module, state: Mapping[str, torch.Tensor]) -> int:
    """Add a ``delta`` adapter's weight changes to model's parameters in place; return how many tensors changed.

    Raises ValueError when a key names no parameter of model or a shape differs.
    """
    params = dict(model.named_parameters())
    names = {key[: -len(s)] for key in state for s in _DELTA_SUFFIXES if key.endswith(s)}
    unknown = sorted(n for n in names if n not in params) + sorted(
        k for k in state if not any(k.endswith(s) for s in _DELTA_SUFFIXES)
    )
    if unknown:
        raise ValueError(f"adapter does not fit the model (unexpected {unknown[:2]})")
    with torch.no_grad():
        for name in sorted(names):
            p = params[name]
            if f"{name}.delta" in state:
                delta = state[f"{name}.delta"].float()
            elif f"{name}.delta_b" in state and f"{name}.delta_a" in state:
                delta = state[f"{name}.delta_b"].float() @ state[f"{name}.delta_a"].float()
            else:
                raise ValueError(f"adapter tensor {name}: one of its two factors is missing")
            if tuple(delta.shape) != tuple(p.shape):
                raise ValueError(f"adapter tensor {name} has shape {tuple(delta.shape)}, not {tuple(p.shape)}")
            p.add_(delta.to(p.device, p.dtype))
    return len(names)


def merge_adapter(model: nn.Module, adapter: Adapter) -> None:
    """Fold a read adapter's weights into model in place (one-line ModelError when they do not fit)."""
    state = load_weights(adapter.weights, "adapter weights")  # one line when damaged or non-finite
    try:
        if adapter.kind == DELTA_KIND:
            apply_deltas(model, state)
        else:
            assert adapter.lora is not None
            merge_lora_factors(model, lora_factors(adapter, state), adapter.lora.scaling)
    except ValueError as exc:
        raise ModelError(f"{adapter.folder}: {exc}") from exc


def apply_adapter(encoder: BertStyleEncoder | PromptEncoder, folder: Path) -> None:
    """Check the folder's adapter against the encoder and merge it into the encoder's weights (in place)."""
    adapter = read_adapter(folder)
    check_adapter(adapter, encoder)
    merge_adapter(encoder.model, adapter)
    encoder.model.to(encoder.device, encoder.dtype).eval()
    encoder.adapter_checksum = adapter.checksum
