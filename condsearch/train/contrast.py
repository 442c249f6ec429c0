"""In-condition contrastive objective (ours, issue 39): in-batch negatives that share the condition.

A C-STS-shaped row ``(s1, s2, c, label)`` with a high label says that s1 and s2 agree on what c
names. Regressing the cosine onto a 5/1 label (``mse``) teaches the size of a cosine; retrieval
needs only its order among the candidates a query meets under the same condition. This loss asks
for that order: each high row's s1 under c should be nearer its own s2 than every other second
sentence of the batch encoded under the *same* condition c, rows it is not known to agree with.
Vectors under different conditions live in different spaces and are never compared.

Known agreements are masked out of the negatives: two rows agree when they share a text under one
condition and both are high (their texts then share the value c names), which ``agreement_mask``
finds by joining the high rows' texts per condition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

#: a cosine / temperature of 20 at cos 1: SimCSE's and sentence-transformers' MNRL scale
TEMPERATURE = 0.05
#: a row's label (1-5, unscaled) at or above which its two texts agree on its condition
HIGH_LABEL = 4.0


def agreement_mask(
    sentence1: Sequence[str], sentence2: Sequence[str], conditions: Sequence[str], high: Sequence[bool]
) -> torch.Tensor:
    """Return (n, n) bool: row i's s1 and row j's s2 are known to share the value their condition names.

    True on the diagonal for high rows, and wherever both rows are high under one condition and
    their texts connect (a shared text joins two agreeing pairs into one group of equal values).
    """
    n = len(conditions)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    seen: dict[tuple[str, str], int] = {}
    for i in range(n):
        if not high[i]:
            continue
        for text in (sentence1[i], sentence2[i]):
            key = (conditions[i], text)
            if key in seen:
                parent[find(i)] = find(seen[key])
            else:
                seen[key] = i
    roots = [find(i) for i in range(n)]
    mask = torch.zeros((n, n), dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            mask[i, j] = bool(high[i] and high[j] and roots[i] == roots[j])
    return mask


def label_agreement(
    sentence1: Sequence[str],
    sentence2: Sequence[str],
    conditions: Sequence[str],
    values: Mapping[tuple[str, str], str],
) -> torch.Tensor:
    """Return (n, n) bool: row i's s1 and row j's s2 share a known value under one condition.

    values: ``(condition, text) -> value``, from the table the rows were drawn from (``adapt``
    knows every text's labels; C-STS rows do not, and use :func:`agreement_mask`). The
    diagonal marks the rows whose two texts share their condition's value.
    """
    n = len(conditions)
    left = [values.get((c, s)) for c, s in zip(conditions, sentence1, strict=True)]
    right = [values.get((c, s)) for c, s in zip(conditions, sentence2, strict=True)]
    mask = torch.zeros((n, n), dtype=torch.bool)
    for i in range(n):
        if left[i] is None:
            continue
        for j in range(n):
            mask[i, j] = conditions[i] == conditions[j] and left[i] == right[j]
    return mask


def in_condition_loss(
    a: torch.Tensor,
    b: torch.Tensor,
    conditions: Sequence[str],
    agree: torch.Tensor,
    *,
    temperature: float = TEMPERATURE,
) -> torch.Tensor:
    """Mean InfoNCE over the high rows that have at least one same-condition negative in the batch.

    a: (n, d) first sentences under their rows' conditions; b: (n, d) second sentences likewise;
    conditions: (n,) each row's condition; agree: (n, n) from :func:`agreement_mask` (its diagonal
    marks the high rows). Row i's candidates are every b_j with conditions[j] == conditions[i];
    its positive is b_i, and the other rows it agrees with are left out. A zero tensor (with a
    gradient path) when no row has a negative.
    """
    n = len(conditions)
    ids = {c: k for k, c in enumerate(dict.fromkeys(conditions))}
    cond = torch.tensor([ids[c] for c in conditions], device=a.device)
    same = cond[:, None] == cond[None, :]
    agree = agree.to(a.device)
    eye = torch.eye(n, dtype=torch.bool, device=a.device)
    candidates = same & ~(agree & ~eye)  # own positive kept, other agreeing rows dropped
    anchors = agree.diagonal() & ((candidates & ~eye).sum(dim=1) > 0)
    if not bool(anchors.any()):
        return (a.sum() + b.sum()) * 0.0
    scores = nn.functional.normalize(a, dim=-1) @ nn.functional.normalize(b, dim=-1).T / temperature
    scores = scores.masked_fill(~candidates, float("-inf"))
    rows = torch.nonzero(anchors).squeeze(1)
    return nn.functional.cross_entropy(scores[rows], rows)


def condition_batches(keys: Sequence[str], batch_size: int, seed: int) -> list[list[int]]:
    """Return batches of positions that share a key where they can: a shuffled order of whole batches.

    keys: (n,) one key per item (a group's high condition). Items of one key fill batches of
    batch_size together; what is left of every key over a multiple of batch_size is pooled and
    cut into mixed batches, so every item comes exactly once.
    """
    import random

    rng = random.Random(seed)
    by_key: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        by_key.setdefault(key, []).append(i)
    batches: list[list[int]] = []
    rest: list[int] = []
    for items in by_key.values():
        rng.shuffle(items)
        full = len(items) - len(items) % batch_size
        batches += [items[s : s + batch_size] for s in range(0, full, batch_size)]
        rest += items[full:]
    rng.shuffle(rest)
    batches += [rest[s : s + batch_size] for s in range(0, len(rest), batch_size)]
    rng.shuffle(batches)
    return batches
