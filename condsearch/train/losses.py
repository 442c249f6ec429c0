"""Training objectives on C-STS batches: pure functions on tensors.

C-STS gives every sentence pair twice, under a high- and a low-similarity condition.
Trainers batch those two rows together (:func:`pair_groups`), so that the contrastive
objectives can compare a pair with itself under the other condition. Labels passed here
are already scaled to [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from condsearch.corpus.csts import CstsData

#: objective names accepted by :func:`parse_loss_spec`
LOSS_NAMES = ("mse", "quad", "wacl", "bcl", "cmse")
#: BCL's default temperature: CCL's tuned values (its Table 2) lie between 3 and 10 for cos/τ. A
#: SimCSE-style 0.05 lets the contrastive term swamp the regression (benchmarks/README.md).
BCL_TEMPERATURE = 5.0


def pair_groups(data: CstsData) -> list[list[int]]:
    """Group row indices by sentence pair: [high, low] when a pair has two rows, else [row].

    A pair given k times over (a training CSV weighted k, :mod:`condsearch.train.mixture`) has 2k
    rows: they make k groups, each of one of the k highest rows and one of the k lowest.
    """
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(data.sentence1, data.sentence2, strict=True)):
        groups.setdefault(key, []).append(i)
    out: list[list[int]] = []
    for rows in groups.values():
        if len(rows) % 2 == 0:
            ordered = sorted(rows, key=lambda r: -float(data.labels[r]))
            half = len(rows) // 2
            out.extend([ordered[k], ordered[half + k]] for k in range(half))
        else:
            out.extend([r] for r in rows)
    return out


def group_positions(batch: list[list[int]]) -> list[tuple[int, int] | None]:
    """Map each group of a batch to its (high, low) positions in the flattened batch."""
    out: list[tuple[int, int] | None] = []
    pos = 0
    for g in batch:
        out.append((pos, pos + 1) if len(g) == 2 else None)
        pos += len(g)
    return out


def quadruplet_loss(cos_pos: torch.Tensor, cos_neg: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """Quadruplet margin loss of C-STS (Deshpande et al.): mean of max(margin + cos_neg - cos_pos, 0).

    cos_pos: (g,) cosine of the pair under its high condition; cos_neg: (g,) under its low one.
    """
    return (margin + cos_neg - cos_pos).clamp_min(0.0).mean()


def wacl_loss(cos_pos: torch.Tensor, cos_neg: torch.Tensor, y_pos: torch.Tensor, y_neg: torch.Tensor) -> torch.Tensor:
    """Weighted adaptive contrastive loss (CCL eq. 9) over (high, low) groups; labels in [0, 1].

    The cosine gap is pulled towards the label gap from either side, weighted by the label gap.
    """
    gap = y_pos - y_neg
    return (gap * (gap + cos_neg - cos_pos).abs()).mean()


def bcl_loss(
    anchor: torch.Tensor,
    positive: torch.Tensor,
    negative: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = BCL_TEMPERATURE,
    sigma: float = 0.5,
) -> torch.Tensor:
    """Balanced contrastive loss (CCL eqs. 10-11), averaged over the batch.

    anchor: (n, d) first sentences under their conditions; positive: (n, d) the same inputs
    through a second dropout pass; negative: (n, d) the second sentences under their
    conditions; labels: (n,) in [0, 1]. Row i's own second sentence is a negative weighted
    1 - label, or left out when its label reaches ``sigma`` (a likely false negative);
    every other row's second sentence weighs 1.
    """
    a = nn.functional.normalize(anchor, dim=-1)
    pos = (a * nn.functional.normalize(positive, dim=-1)).sum(-1) / temperature  # (n,)
    neg = a @ nn.functional.normalize(negative, dim=-1).T / temperature  # (n, n)
    own = torch.where(labels >= sigma, torch.zeros_like(labels), 1.0 - labels)
    weights = torch.ones_like(neg)
    weights.diagonal().copy_(own)
    # log of the weighted sum in the denominator; a zero weight drops its term exactly
    logits = torch.cat([pos.unsqueeze(1), neg + weights.log()], dim=1)
    return (torch.logsumexp(logits, dim=1) - pos).mean()


def cmse_loss(first: torch.Tensor, second: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Conditional MSE of CCL (its eq. 3, term l_C-MSE): the label regression in the contrastive space.

    CCL trains two similarity regressions side by side: l_MSE on the cosine of the
    conditional embeddings h1, h2 themselves, and l_C-MSE on the cosine of the same two
    embeddings after the projection g that its BCL compares in (eq. 10: cos(g(f(s, c)), ...)).
    The paper defines it in words only ("[the two MSE terms] constrain similarity scores in
    the embedding and contrastive learning spaces, respectively"), so this computes

        mean_i (cos(g(h1_i), g(h2_i)) - y_i)^2

    first, second: (n, d) g(h1), g(h2), already projected by the caller; labels: (n,) in [0, 1].
    The gradient raises the contrastive-space cosine of a pair scored below its label and
    lowers it above.
    """
    cos = nn.functional.cosine_similarity(first, second, dim=-1)
    return nn.functional.mse_loss(cos, labels)


@dataclass(frozen=True)
class LossSettings:
    """Weights of the objectives and their own hyper-parameters."""

    weights: Mapping[str, float]
    margin: float = 1.0  # quad
    temperature: float = BCL_TEMPERATURE
    sigma: float = 0.5  # bcl

    @property
    def needs_second_pass(self) -> bool:
        """BCL's positives are a second dropout pass over the first sentences."""
        return self.weights.get("bcl", 0.0) != 0.0

    @property
    def needs_projection(self) -> bool:
        """C-MSE lives in a contrastive space: a projection g trained beside the model (and BCL moves there too)."""
        return self.weights.get("cmse", 0.0) != 0.0


def format_loss_spec(losses: Sequence[tuple[str, float]]) -> str:
    """Return (name, weight) pairs as parse_loss_spec reads them, e.g. 'mse' or 'mse,wacl=0.5'."""
    return ",".join(name if weight == 1.0 else f"{name}={weight:g}" for name, weight in losses)


def parse_loss_spec(spec: str) -> dict[str, float]:
    """Parse 'mse', 'mse+wacl' or 'mse=1,wacl=0.5' into {name: weight}.

    Raises ValueError naming the problem.
    """
    weights: dict[str, float] = {}
    for part in spec.replace("+", ",").split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip()
        if not name:
            raise ValueError(f"empty objective in {spec!r}")
        if name not in LOSS_NAMES:
            raise ValueError(f"unknown objective {name!r} (choose from {', '.join(LOSS_NAMES)})")
        if name in weights:
            raise ValueError(f"objective {name!r} given twice")
        try:
            weight = float(value) if sep else 1.0
        except ValueError:
            raise ValueError(f"weight of {name!r} is not a number: {value!r}") from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight of {name!r} must be a finite, non-negative number")
        weights[name] = weight
    if not any(weights.values()):
        raise ValueError("every objective has weight 0")
    return weights


def combined_loss(
    settings: LossSettings,
    cos: torch.Tensor,
    labels: torch.Tensor,
    positions: list[tuple[int, int] | None],
    *,
    anchor: torch.Tensor | None = None,
    positive: torch.Tensor | None = None,
    negative: torch.Tensor | None = None,
    contrastive: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the weighted sum of the objectives and each term's value.

    cos: (n,) cosine of each row's two sentences; labels: (n,) in [0, 1]; positions: the
    (high, low) rows of each group (:func:`group_positions`). ``anchor``, ``positive`` and
    ``negative`` (n, d) are needed for BCL only; ``contrastive``, each row's two sentences
    in the contrastive space (g(h1), g(h2)), for C-MSE only.
    """
    terms: dict[str, torch.Tensor] = {}
    w = settings.weights
    if w.get("mse"):
        terms["mse"] = nn.functional.mse_loss(cos, labels)
    pairs = [p for p in positions if p is not None]
    if pairs and (w.get("quad") or w.get("wacl")):
        hi = torch.tensor([p[0] for p in pairs], device=cos.device)
        lo = torch.tensor([p[1] for p in pairs], device=cos.device)
        if w.get("quad"):
            terms["quad"] = quadruplet_loss(cos[hi], cos[lo], settings.margin)
        if w.get("wacl"):
            terms["wacl"] = wacl_loss(cos[hi], cos[lo], labels[hi], labels[lo])
    if w.get("bcl"):
        if anchor is None or positive is None or negative is None:
            raise ValueError("bcl needs anchor, positive and negative vectors")
        terms["bcl"] = bcl_loss(
            anchor, positive, negative, labels, temperature=settings.temperature, sigma=settings.sigma
        )
    if w.get("cmse"):
        if contrastive is None:
            raise ValueError("cmse needs the contrastive-space vectors")
        terms["cmse"] = cmse_loss(*contrastive, labels)
    total = sum((w[name] * value for name, value in terms.items()), torch.zeros((), device=cos.device))
    return total, {name: float(value.detach()) for name, value in terms.items()}
