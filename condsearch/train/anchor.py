"""Keeping what the base model knows while fine-tuning (ours, issue 25): an anchor on plain vectors.

Fine-tuning for C-STS moves each sentence's plain vector (the text alone, without a condition)
away from what the pre-trained model gave it, and out of domain that loses what the base model
knew. With ``anchor_weight`` w > 0, each batch adds w · mean(1 − cos(f(s), f₀(s))) over its
sentences, where f₀ is the model before training (for LoRA the base model itself, as its adapters
start at the identity), computed once, in eval mode, before the first step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from condsearch.model.encoders.base import Pair


class PlainEncoder(Protocol):
    """What the anchor needs of an encoder: its model (for the train/eval mode) and differentiable pairs."""

    model: nn.Module

    def forward_pairs(self, pairs: Sequence[Pair]) -> torch.Tensor: ...


def _plain(encoder: PlainEncoder, texts: Sequence[str]) -> torch.Tensor:
    return nn.functional.normalize(encoder.forward_pairs([(t, None) for t in texts]).float(), dim=1)


class Anchor:
    """The base model's unit plain vector of every training sentence, and the weight pulling toward them."""

    def __init__(self, weight: float, vectors: dict[str, torch.Tensor]) -> None:
        self.weight = weight
        self.vectors = vectors

    @classmethod
    @torch.no_grad()
    def of(cls, encoder: PlainEncoder, texts: Sequence[str], weight: float, batch_size: int) -> Anchor:
        """Encode each distinct text once with the encoder as it is now (the start of training)."""
        was_training = encoder.model.training
        encoder.model.eval()
        distinct = sorted(dict.fromkeys(texts), key=len)  # similar lengths together: little padding
        vectors: dict[str, torch.Tensor] = {}
        for start in range(0, len(distinct), batch_size):
            chunk = distinct[start : start + batch_size]
            vectors.update(zip(chunk, _plain(encoder, chunk).cpu(), strict=True))
        encoder.model.train(was_training)
        return cls(weight, vectors)

    def loss(self, encoder: PlainEncoder, texts: Sequence[str]) -> torch.Tensor:
        """Return weight · mean(1 − cos) between the texts' plain vectors now and at the start (with gradients)."""
        distinct = list(dict.fromkeys(texts))
        now = _plain(encoder, distinct)
        start = torch.stack([self.vectors[t] for t in distinct]).to(now.device)
        return self.weight * (1.0 - (now * start).sum(dim=1)).mean()
