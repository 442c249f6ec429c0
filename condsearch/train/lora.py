"""Training low-rank adapters (LoRA) on the linear projections of BERT-style encoders and decoder LLMs.

Each wrapped ``nn.Linear`` computes ``W x + b + (alpha / rank) * B A dropout(x)`` with the
base weights frozen, ``A`` (rank, in) initialised like a linear layer and ``B`` (out, rank)
at zero, so a fresh adapter leaves the model's outputs exactly as they were.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from torch import nn

from condsearch.train.finite import check_finite_fields

# Projection kinds, matched on module names of BERT, RoBERTa, XLM-R, E5 and SimCSE
# (``attention.self.query``, ``intermediate.dense``, ...), DistilBERT (``q_lin``, ``ffn.lin1``)
# and LLaMA-style decoders: Qwen2/3, Mistral, LLaMA (``self_attn.q_proj``, ``mlp.gate_proj``, ...).
TARGET_PATTERNS = {
    "query": r"\.(query|q_lin|q_proj)$",
    "key": r"\.(key|k_lin|k_proj)$",
    "value": r"\.(value|v_lin|v_proj)$",
    "attn_out": r"(attention\.output\.dense|attention\.out_lin|self_attn\.o_proj)$",
    "ffn_in": r"(intermediate\.dense|ffn\.lin1|mlp\.gate_proj|mlp\.up_proj)$",
    "ffn_out": r"((?<!attention\.)output\.dense|ffn\.lin2|mlp\.down_proj)$",
}
ALL_TARGETS = tuple(TARGET_PATTERNS)


@dataclass(frozen=True)
class LoraConfig:
    """Where the adapters go and how large they are."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.1
    targets: tuple[str, ...] = ALL_TARGETS

    def __post_init__(self) -> None:
        check_finite_fields(self)
        if self.rank < 1:
            raise ValueError("LoRA rank must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("LoRA dropout must be in [0, 1)")
        unknown = [t for t in self.targets if t not in TARGET_PATTERNS]
        if unknown or not self.targets:
            raise ValueError(f"LoRA targets must be among {', '.join(ALL_TARGETS)}; got {', '.join(unknown) or 'none'}")


class LoraLinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        device, dtype = base.weight.device, base.weight.dtype
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, device=device, dtype=dtype))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scaling = alpha / rank
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    # Code that inspects the wrapped layer (dtype checks, weight init) still finds its tensors.
    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = self.dropout(x) @ self.lora_a.T @ self.lora_b.T
        return self.base(x) + update * self.scaling


def target_modules(model: nn.Module, targets: tuple[str, ...]) -> list[str]:
    """Return the names of the ``nn.Linear`` modules of model that the targets select, in order."""
    patterns = [re.compile(TARGET_PATTERNS[t]) for t in targets]
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and any(p.search(name) for p in patterns)
    ]


def add_lora(model: nn.Module, config: LoraConfig) -> list[str]:
    """Freeze model and wrap its targeted projections with adapters in place; return their names.

    Raises ValueError when no module matches (an architecture this naming does not cover).
    """
    names = target_modules(model, config.targets)
    if not names:
        raise ValueError(f"no {', '.join(config.targets)} projections found in {type(model).__name__}")
    for p in model.parameters():
        p.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        base = getattr(parent, child)
        setattr(parent, child, LoraLinear(base, config.rank, config.alpha, config.dropout))
    return names


def lora_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Return the adapter tensors keyed ``<module>.lora_a`` / ``<module>.lora_b`` (no base weights)."""
    state: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLinear):
            state[f"{name}.lora_a"] = module.lora_a
            state[f"{name}.lora_b"] = module.lora_b
    return state
