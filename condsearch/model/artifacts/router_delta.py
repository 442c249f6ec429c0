"""What router.json records of a context router's backbone change, checked against the weights file's tensors.

A context router (:mod:`condsearch.model.csr.context_weights`) stores its backbone change whole, as int8
low-rank factors (compact), or as float factors (the shipped router's float16; a decoded study's
float32), and ``router.json``'s ``backbone_delta`` records its rank, encoding, tensor count and
bytes. The weights' sha256 ties the file to ``router.json``, not ``router.json``'s other fields to
the file: :func:`check_delta_record` does that, on the shapes alone. It reads them from the
safetensors header (:func:`weights_shapes`) without torch, so that the one-shot query checks what
the torch loader checks.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from condsearch.base.artifact_files import ROUTER_CONFIG
from condsearch.base.regular_files import open_regular_file
from condsearch.errors import ModelError

#: backbone_delta.encoding: how save_context_router stored the change (whole or compact), or benchmarks/studies/wise.py
#: (decoded: float factors and whole tensors, no int8 parts)
ENCODINGS = ("whole", "compact", "decoded")
#: the key of each kind of low-rank factors' B half (its A half: ``_a`` for ``_b``)
_FACTORS = {"int8": ".qdelta_b", "float": ".delta_b"}
_QUANTIZED = (".qdelta_b", ".qdelta_a", ".sdelta_rows", ".sdelta_signs")
#: the largest safetensors header read (ours are tens of kB: a name, dtype, shape and offsets per tensor)
_MAX_HEADER_BYTES = 16 << 20


class Sized(Protocol):
    """A tensor's shape and bytes: a torch tensor, a NumPy array or a :class:`TensorShape`."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def nbytes(self) -> int: ...


@dataclass(frozen=True)
class TensorShape:
    """A tensor as a safetensors header describes it: its shape and the bytes it takes."""

    shape: tuple[int, ...]
    nbytes: int


def weights_shapes(path: Path) -> dict[str, TensorShape]:
    """Return each tensor's shape and bytes from a safetensors file's header; a one-line ModelError if damaged."""
    try:
        with open_regular_file(Path(path), ModelError) as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            if size > _MAX_HEADER_BYTES:
                raise ValueError("header too large")
            header = json.loads(fh.read(size))
        shapes = {
            name: TensorShape(
                tuple(int(n) for n in entry["shape"]), int(entry["data_offsets"][1] - entry["data_offsets"][0])
            )
            for name, entry in header.items()
            if name != "__metadata__"
        }
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, struct.error) as exc:
        raise ModelError(f"{Path(path).parent}: router weights unreadable ({type(exc).__name__})") from exc
    return shapes


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_delta_record(meta: Mapping[str, object], state: Mapping[str, Sized], where: object) -> None:
    """Raise a one-line ModelError unless a backbone change's tensors have the shape router.json records.

    ``backbone_delta`` records the rank of its factors, int8 or float (None: none, or a decoded change's),
    the encoding, how many backbone tensors changed and the bytes they take; each field present is checked.
    ``state``: the tensors, or their shapes (:func:`weights_shapes`).
    """
    record = meta.get("backbone_delta")
    if record is None:
        return
    if not isinstance(record, dict):
        raise ModelError(f"{where}: {ROUTER_CONFIG}'s backbone_delta is not an object")
    rank, encoding = record.get("rank"), record.get("encoding")
    _check_rank(rank, encoding, state, where)
    if encoding is not None:
        if encoding not in ENCODINGS:
            raise ModelError(f"{where}: {ROUTER_CONFIG}'s backbone_delta.encoding {encoding!r} is unknown")
        whole = all(k.endswith(".delta") for k in state)
        quantized = any(k.endswith(_QUANTIZED) for k in state)
        if (
            (encoding == "whole" and not whole)
            or (encoding == "compact" and rank is None)
            or (encoding == "decoded" and quantized)
        ):
            raise ModelError(
                f"{where}: the weights are not stored as {ROUTER_CONFIG}'s backbone_delta.encoding {encoding!r} says"
            )
    checks = (
        ("tensors", len({k.rsplit(".", 1)[0] for k in state}), "changed backbone tensors"),
        ("bytes", sum(int(t.nbytes) for t in state.values()), "bytes of tensors"),
    )
    for field, actual, what in checks:
        recorded = record.get(field)
        if recorded is not None and recorded != actual:
            raise ModelError(
                f"{where}: the weights hold {actual} {what} where {ROUTER_CONFIG} records {recorded!r} "
                f"(backbone_delta.{field}): not this router's weights"
            )


def _check_rank(rank: object, encoding: object, state: Mapping[str, Sized], where: object) -> None:
    """Refuse factors (int8 or float) of another rank than the recorded one, or factors where none is recorded.

    A decoded change records no rank: its float factors are whatever the change it was cut from held.
    """
    factors = {k: kind for kind, suffix in _FACTORS.items() for k in state if k.endswith(suffix)}
    checked = {k: kind for k, kind in factors.items() if encoding != "decoded" or kind == "int8"}
    if rank is None:
        if checked:
            kind = checked[min(checked)]
            raise ModelError(
                f"{where}: the weights hold {kind} factors where {ROUTER_CONFIG} records none (backbone_delta.rank)"
            )
        return
    if not _is_count(rank) or not isinstance(rank, int) or rank < 1:
        raise ModelError(f"{where}: {ROUTER_CONFIG}'s backbone_delta.rank {rank!r} is not a rank")
    for key, kind in sorted(checked.items()):
        suffix = _FACTORS[kind]
        name = key.removesuffix(suffix)
        b, a = state[key].shape, state.get(name + suffix.replace("_b", "_a"))
        if a is None or len(b) != 2 or len(a.shape) != 2 or b[1] != a.shape[0]:
            raise ModelError(f"{where}: {name}'s {kind} factors do not fit together")
        if b[1] != min(rank, b[0], a.shape[1]):
            raise ModelError(
                f"{where}: {name} is stored at rank {b[1]}, where {ROUTER_CONFIG} records "
                f"backbone_delta.rank {rank}: not this router's weights"
            )
