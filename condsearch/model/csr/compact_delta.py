"""A backbone change in few bytes (ours): int8 low-rank factors, and the token table's changed rows as signs.

Two encodings, each fitted to how a whole-backbone fine-tune changes its weights (measured on the
WN18RR run, benchmarks/README "Whole-backbone training"):

- **A matrix** is kept as its best rank-r factors ``B = U_r S_r`` (out, r) and ``A = V_rᵀ`` (r, in),
  each rounded to int8 with one float16 scale per rank component (B's columns, A's rows), so r
  doubles in the bytes float16 factors took. Keys ``<name>.qdelta_b`` / ``.qdelta_a`` (int8) and
  ``.qdelta_b_scale`` / ``.qdelta_a_scale`` (float16).
- **The input token table** changes only in the rows of tokens that training saw, and their change
  has a flat spectrum: rank 33 kept a third of its energy. Each changed row is kept as its signs
  (1 bit a value, packed) times the row's mean absolute change, which is the least-squares best
  scale for those signs. Keys ``<name>.sdelta_rows`` (int32 row ids), ``.sdelta_signs`` (uint8,
  bits packed along the row) and ``.sdelta_scale`` (float16).

:func:`decode` turns both back into the float ``<name>.delta`` / ``.delta_b`` / ``.delta_a`` tensors that
:func:`condsearch.model.encoders.lora.apply_deltas` adds; tensors already in that form pass through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from condsearch.model.encoders.lowrank import low_rank

_FACTOR_KEYS = (".qdelta_b", ".qdelta_a", ".qdelta_b_scale", ".qdelta_a_scale")
_SIGN_KEYS = (".sdelta_rows", ".sdelta_signs", ".sdelta_scale")


def factor_bytes(shape: tuple[int, ...], rank: int) -> int:
    """Return the bytes of a matrix's int8 rank-``rank`` factors and their scales."""
    r = min(rank, *shape)
    return (shape[0] + shape[1]) * r + 2 * 2 * r


def sign_rows_bytes(rows: int, columns: int) -> int:
    """Return the bytes of ``rows`` sign-coded rows of ``columns`` values (bits, scale, row id)."""
    return rows * (math.ceil(columns / 8) + 2 + 4)


def _int8(values: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Round values to int8 with one scale per slice along dim (the slice's largest magnitude / 127)."""
    scale = (values.abs().amax(dim=dim, keepdim=True) / 127).half().float()  # as stored, so rounding uses it
    # a slice below float16's range (a rank component the change does not have) is stored as zeros
    q = torch.where(scale > 0, values / scale.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros(()))
    return q.round().clamp(-127, 127).to(torch.int8), scale.squeeze(dim).half()


def encode_factors(name: str, delta: torch.Tensor, rank: int) -> dict[str, torch.Tensor]:
    """Return a matrix change's int8 rank-``rank`` factors and scales, keyed under name."""
    b, a = low_rank(delta, rank)
    qb, sb = _int8(b, dim=0)  # one scale per column of B
    qa, sa = _int8(a, dim=1)  # one per row of A
    return {f"{name}.qdelta_b": qb, f"{name}.qdelta_a": qa, f"{name}.qdelta_b_scale": sb, f"{name}.qdelta_a_scale": sa}


def encode_sign_rows(name: str, delta: torch.Tensor) -> dict[str, torch.Tensor]:
    """Return a table change's changed rows as row ids, packed signs and per-row scales, keyed under name."""
    rows = torch.nonzero(delta.abs().sum(dim=1) > 0).squeeze(1)
    changed = delta[rows].float()
    signs = np.packbits((changed >= 0).numpy(), axis=1)
    scale = changed.abs().mean(dim=1)
    return {
        f"{name}.sdelta_rows": rows.to(torch.int32),
        f"{name}.sdelta_signs": torch.from_numpy(signs),
        f"{name}.sdelta_scale": scale.half(),
    }


def _take(state: dict[str, torch.Tensor], name: str, keys: tuple[str, ...]) -> list[torch.Tensor]:
    missing = [name + k for k in keys if name + k not in state]
    if missing:
        raise ValueError(f"adapter tensor {name}: {missing[0]} is missing")
    return [state.pop(name + k) for k in keys]


def decode(state: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Return state with every compact tensor turned back into float ``.delta`` / ``.delta_b`` / ``.delta_a``.

    shapes gives each parameter's shape by name (a sign-coded table's column count and row count
    come from it). Raises ValueError when a part is missing or does not fit.
    """
    rest = dict(state)
    out: dict[str, torch.Tensor] = {}
    for name in sorted({k.removesuffix(".qdelta_b") for k in state if k.endswith(".qdelta_b")}):
        qb, qa, sb, sa = _take(rest, name, _FACTOR_KEYS)
        if qb.ndim != 2 or qa.ndim != 2 or sb.shape != (qb.shape[1],) or sa.shape != (qa.shape[0],):
            raise ValueError(f"adapter tensor {name}: its int8 factors and scales do not fit together")
        out[f"{name}.delta_b"] = qb.float() * sb.float()[None, :]
        out[f"{name}.delta_a"] = qa.float() * sa.float()[:, None]
    for name in sorted({k.removesuffix(".sdelta_rows") for k in state if k.endswith(".sdelta_rows")}):
        rows, signs, scale = _take(rest, name, _SIGN_KEYS)
        if name not in shapes or len(shapes[name]) != 2:
            raise ValueError(f"adapter does not fit the model (unexpected {name!r})")
        n_rows, columns = shapes[name]
        bits = np.unpackbits(signs.numpy(), axis=1, count=columns) if signs.ndim == 2 else None
        if bits is None or bits.shape != (rows.numel(), columns) or scale.shape != rows.shape:
            raise ValueError(f"adapter tensor {name}: its sign-coded rows do not fit together")
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= n_rows):
            raise ValueError(f"adapter tensor {name}: a sign-coded row id is out of range")
        delta = torch.zeros(n_rows, columns)
        delta[rows.long()] = (torch.from_numpy(bits).float() * 2 - 1) * scale.float()[:, None]
        out[f"{name}.delta"] = delta
    leftover = [k for k in rest if k.endswith(_FACTOR_KEYS + _SIGN_KEYS)]
    if leftover:
        raise ValueError(f"adapter tensor {leftover[0]}: its other parts are missing")
    return {**rest, **out}
