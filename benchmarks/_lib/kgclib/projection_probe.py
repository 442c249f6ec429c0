"""What projected training keeps of an update (ours; ``kgc.py --projection-probe N``).

Projected training (``--project-every``) puts both towers back into the committed artifact's
form every so many steps: int8 low-rank factors for each matrix, the token table's changed rows
as signs (:mod:`condsearch.model.csr.compact_delta`). This trains N steps from the weights loaded,
without projecting, then splits what one projection would take away from the trained weights:

- ``token_table``: the sign-coded table's loss (its rows' signs and mean sizes hardly move in N
  steps, so an update there is lost almost whole);
- ``rank_cut``: each factored matrix's change beyond its best rank-r approximation, in float;
- ``rounding``: that approximation against its int8 factors (drawn afresh at every projection);
- ``other``: tensors kept whole (float16 rounding).

Each is a Frobenius norm over both towers' backbones, beside the norm of the N steps' update
(``update``) and of its part in the token table (``token_table_update``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from .training import train_kgc

PARTS = ("token_table", "rank_cut", "rounding", "other")


def _kept(decoded: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    """Return a parameter's change as the artifact keeps it (None: left out, as unchanged)."""
    if f"{name}.delta" in decoded:
        return decoded[f"{name}.delta"].float()
    if f"{name}.delta_b" in decoded:
        return decoded[f"{name}.delta_b"].float() @ decoded[f"{name}.delta_a"].float()
    return None


def tower_losses(
    tower: Any, before: dict[str, torch.Tensor], base: dict[str, torch.Tensor], max_bytes: int
) -> dict[str, float]:
    """Return squared norms of a tower's update since ``before`` and of what projecting it now loses, by part."""
    from condsearch.model.csr.compact_delta import decode
    from condsearch.model.csr.context_weights import backbone_delta
    from condsearch.model.encoders.lowrank import low_rank

    delta, rank = backbone_delta(base, tower.model, max_bytes=max_bytes)
    shapes = {n: tuple(p.shape) for n, p in tower.model.named_parameters()}
    decoded = decode(delta, shapes)
    factored = {k.removesuffix(".qdelta_b") for k in delta if k.endswith(".qdelta_b")}
    signed = {k.removesuffix(".sdelta_rows") for k in delta if k.endswith(".sdelta_rows")}
    out = {"update": 0.0, "token_table_update": 0.0, **dict.fromkeys(PARTS, 0.0)}
    for name, p in tower.trainable_parameters().items():
        weight = p.detach().float().cpu()
        update = float((weight - before[name]).pow(2).sum())
        out["update"] += update
        if name in signed:
            out["token_table_update"] += update
        change = weight - base[name].float()
        kept = _kept(decoded, name)
        if kept is None:
            continue
        if name in factored and rank is not None:
            b, a = low_rank(change, rank)
            best = b @ a
            out["rank_cut"] += float((change - best).pow(2).sum())
            out["rounding"] += float((best - kept).pow(2).sum())
        else:
            out["token_table" if name in signed else "other"] += float((change - kept).pow(2).sum())
    return out


def projection_probe(
    encoder: Any,
    entities: Any,
    data: Any,
    config: Any,
    tail: Any,
    base: dict[str, torch.Tensor],
    steps: int,
    linked: Any = None,
) -> dict[str, object]:
    """Train ``steps`` steps without projecting, then report what one projection would lose (norms)."""
    from condsearch.model.csr.context_weights import MAX_DELTA_BYTES

    towers = [encoder.router] if tail is None else [encoder.router, tail]
    share = MAX_DELTA_BYTES // len(towers)  # as project_towers and save_towers split the budget
    before = [{n: p.detach().float().cpu().clone() for n, p in t.trainable_parameters().items()} for t in towers]
    one = replace(config, epochs=1, max_examples=steps * config.batch_size, project_every=0)
    train_kgc(encoder, entities, data, one, tail=tail, linked=linked)
    total = {"update": 0.0, "token_table_update": 0.0, **dict.fromkeys(PARTS, 0.0)}
    for tower, start in zip(towers, before, strict=True):
        for key, value in tower_losses(tower, start, base, share).items():
            total[key] += value
    lost = sum(total[k] for k in PARTS)
    norms = {k: round(math.sqrt(v), 4) for k, v in total.items()}
    return {
        "steps": steps,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "bytes_per_tower": share,
        "norms": {**norms, "lost": round(math.sqrt(lost), 4)},
        "lost_over_update": round(math.sqrt(lost / total["update"]), 4) if total["update"] else None,
    }
