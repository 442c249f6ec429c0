"""Training as a blend (ours, issue 25): the CASE cosine fitted as one part of a fixed mix with plain vectors.

With ``blend`` B < 1 (`train full|lora --blend B`), the cosine the losses fit and the dev Spearman an
epoch is chosen on are B × the CASE cosine + (1 − B) × the cosine of the two texts' plain vectors from
the base model (the texts alone, no condition), computed once before the first step. That is the
cosine of the concatenation √B · CASE ⊕ √(1 − B) · plain, which ``benchmarks/studies/ood.py``'s
``blend:B:SYSTEM`` indexes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from condsearch.corpus.csts import CstsData


@dataclass(frozen=True)
class Blend:
    """Ours (issue 25): the score trained and chosen on is B × the CASE cosine + (1 − B) × ``plain``, each
    pair's cosine of the base model's plain vectors (the texts alone), fixed before training."""

    share: float  # B, the CASE cosine's share
    plain: torch.Tensor  # (len(data),) float32

    @classmethod
    def of(cls, share: float, base: dict[str, torch.Tensor], data: CstsData) -> Blend:
        """Read each pair's plain cosine off ``base`` (unit vectors keyed by text, as Anchor.of gives)."""
        first = torch.stack([base[t] for t in data.sentence1])
        second = torch.stack([base[t] for t in data.sentence2])
        return cls(share, (first * second).sum(dim=1).float())

    def mix(self, cos: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Return B × cos + (1 − B) × the plain cosines of ``rows`` (every row when None), on cos's device."""
        plain = self.plain if rows is None else self.plain[list(rows)]
        return self.share * cos + (1.0 - self.share) * plain.to(cos.device)
