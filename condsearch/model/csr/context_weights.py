"""Saving and loading a context router (ours): k and the backbone's change, as a delta adapter's tensors.

A context router's folder is a router folder (``router.json`` + ``router.safetensors``, see
:mod:`condsearch.model.artifacts.routers`). What trains is the backbone itself, so the weights file holds
``tuned - base`` for every backbone tensor that changed, keyed as :mod:`condsearch.model.encoders.lowrank`'s
delta adapters are (``<parameter>.delta`` whole, or ``.delta_b`` / ``.delta_a`` factors) and merged
with :func:`condsearch.model.encoders.lora.apply_deltas`. The change is stored whole when that fits in
:data:`MAX_DELTA_BYTES` (the top 2 layers of MiniLM-L6 at float16 take 7.1 MB); otherwise compactly
(:mod:`condsearch.model.csr.compact_delta`): the token table's changed rows as signs, each matrix as int8
factors at the largest rank that fits (where those are smaller than the matrix), the rest whole.
The top 3 layers of MiniLM-L6 then fit at full rank; all of it, embeddings included, with the
21,600 token rows that WN18RR's texts use, at rank 205 in 10 MB and 87 in 5 MB (each tower of the
WN18RR artifact). The budget counts the weights file's header. ``router.json`` records the rank.

The weights file's sha256 is the router's checksum: it reaches the index manifest, the incremental
re-index fingerprint and, for this variant, the sentence-cache key, since the cached states
depend on the backbone's lower layers. ``router.json`` records it with the file's size, and a
load checks both, then the recorded shape of the change (rank, encoding, tensor count and bytes)
against the tensors themselves (:mod:`condsearch.model.artifacts.router_delta`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from condsearch.base.artifact_files import (
    ROUTER_CONFIG,
    ROUTER_FORMAT_VERSION,
    ROUTER_WEIGHTS,
    check_own_artifact,
    write_json,
)
from condsearch.base.atomic import replacing_dir
from condsearch.errors import ModelError
from condsearch.model.artifacts.routers import (
    WEIGHTS_RECORD,
    checked_router_checksum,
    read_router_config,
    router_checksum,
    weights_record,
)
from condsearch.model.artifacts.weights import load_weights, save_weights
from condsearch.model.csr.compact_delta import decode, encode_factors, encode_sign_rows, factor_bytes
from condsearch.model.csr.context import ContextConfig, ContextRouter
from condsearch.model.encoders.lora import apply_deltas

#: the largest backbone change kept whole (bytes at float16); a larger one is stored compactly within it
MAX_DELTA_BYTES = 10_000_000
#: a bound on what the weights file's header takes per tensor (its JSON entry: name, dtype, shape, offsets)
HEADER_BYTES_PER_TENSOR = 160


def base_weights(location: str, trust_remote_code: bool = False) -> dict[str, torch.Tensor]:
    """Return a model folder's own weights (float32, CPU) by parameter name: what a delta is taken from."""
    from condsearch.model.encoders.first_use import loading
    from condsearch.model.encoders.runtime import load_pretrained

    with loading(location):
        from transformers import AutoModel

        model = load_pretrained(
            AutoModel.from_pretrained, location, dtype=torch.float32, trust_remote_code=trust_remote_code
        )
    return {n: p.detach() for n, p in model.named_parameters()}


def _factored(shape: tuple[int, ...], rank: int, bytes_per_value: int = 2) -> bool:
    """Return whether a tensor is stored as int8 rank-``rank`` factors: a matrix that they make smaller."""
    return len(shape) == 2 and factor_bytes(shape, rank) < math.prod(shape) * bytes_per_value


def _size(shape: tuple[int, ...], rank: int, bytes_per_value: int) -> int:
    if _factored(shape, rank, bytes_per_value):
        return factor_bytes(shape, rank)
    return math.prod(shape) * bytes_per_value


def fitting_rank(shapes: Iterable[tuple[int, ...]], max_bytes: int, bytes_per_value: int = 2) -> int:
    """Return the largest rank r (at least 1) at which tensors of these shapes take at most max_bytes:
    matrices as int8 rank-r factors where those are smaller, everything else whole at bytes_per_value."""
    shapes = list(shapes)
    matrices = [s for s in shapes if len(s) == 2]

    def size(r: int) -> int:
        return sum(_size(s, r, bytes_per_value) for s in shapes)

    lo, hi = 1, max((min(s) for s in matrices), default=1)
    while lo < hi:  # the largest r with size(r) <= max_bytes; size grows with r
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if size(mid) <= max_bytes else (lo, mid - 1)
    return lo


def token_table(model: torch.nn.Module) -> str | None:
    """Return the parameter name of model's input token table (None: it has none that we can find)."""
    get = getattr(model, "get_input_embeddings", None)
    table = get() if callable(get) else None
    weight = getattr(table, "weight", None)
    return next((n for n, p in model.named_parameters() if p is weight), None)


def backbone_delta(
    base: Mapping[str, torch.Tensor],
    model: torch.nn.Module,
    *,
    max_bytes: int = MAX_DELTA_BYTES,
    rank: int | None = None,
    dtype: torch.dtype = torch.float16,
) -> tuple[dict[str, torch.Tensor], int | None]:
    """Return the adapter tensors of model - base, and the rank used (None: stored whole at dtype).

    The change is stored whole at dtype when it fits in max_bytes (the weights file's header
    counted). Else it is stored compactly (:mod:`condsearch.model.csr.compact_delta`), within the same
    budget: the input token table's changed rows as signs, each
    matrix whose int8 rank-``rank`` factors are smaller than it as those (rank None: the largest
    rank that fits what the table left), the rest whole. Tensors that did not change are left
    out, as is the pooler (no router reads it).
    """
    tuned = {n: p.detach().float().cpu() for n, p in model.named_parameters() if not n.startswith("pooler.")}
    changed: dict[str, torch.Tensor] = {}
    for name, weight in tuned.items():
        if name not in base or tuple(base[name].shape) != tuple(weight.shape):
            raise ModelError(f"{name}: the trained weights do not fit the base model")
        delta = weight - base[name].float().cpu()
        if torch.any(delta):
            changed[name] = delta
    size = torch.finfo(dtype).bits // 8
    if sum(d.numel() * size + HEADER_BYTES_PER_TENSOR for d in changed.values()) <= max_bytes:
        return {f"{n}.delta": d.to(dtype).contiguous() for n, d in changed.items()}, None
    out: dict[str, torch.Tensor] = {}
    table = token_table(model)
    if table in changed:
        out.update(encode_sign_rows(table, changed.pop(table)))
    keys = len(out) + sum(4 if d.ndim == 2 else 1 for d in changed.values())  # at most, with every matrix factored
    left = max_bytes - sum(t.numel() * t.element_size() for t in out.values()) - HEADER_BYTES_PER_TENSOR * keys
    used = rank or fitting_rank((tuple(d.shape) for d in changed.values()), left, size)
    for name, delta in changed.items():
        if _factored(tuple(delta.shape), used, size):
            out.update(encode_factors(name, delta, used))
        else:
            out[f"{name}.delta"] = delta.to(dtype)
    return {k: v.contiguous() for k, v in out.items()}, used


def save_context_router(
    router: ContextRouter,
    delta: Mapping[str, torch.Tensor],
    rank: int | None,
    directory: Path,
    meta: dict[str, object],
) -> str:
    """Write k and a backbone change (from :func:`backbone_delta`) atomically; return the checksum."""
    directory = Path(directory)
    check_own_artifact(directory, "router")
    with replacing_dir(directory) as tmp:
        save_weights(dict(delta), tmp / ROUTER_WEIGHTS, f"{directory}: router weights")  # float16 can overflow
        info = {
            "format_version": ROUTER_FORMAT_VERSION,
            "layer": router.layer,
            "router_config": router.config.to_dict(),
            "backbone_delta": {
                "rank": rank,
                "encoding": "whole" if rank is None else "compact",
                "tensors": len({k.rsplit(".", 1)[0] for k in delta}),
                "bytes": sum(t.numel() * t.element_size() for t in delta.values()),
            },
            **meta,
            WEIGHTS_RECORD: weights_record(tmp),
        }
        write_json(tmp / ROUTER_CONFIG, info)
    return router_checksum(directory)


def apply_backbone_delta(router: ContextRouter, delta: Mapping[str, torch.Tensor], where: object) -> None:
    """Add a backbone change to a context router's weights in place (ModelError when it does not fit)."""
    try:
        shapes = {n: tuple(p.shape) for n, p in router.model.named_parameters()}
        apply_deltas(router.model, decode(delta, shapes))
    except ValueError as exc:
        raise ModelError(f"{where}: {exc}") from exc


def saved_context_config(directory: Path) -> ContextConfig | None:
    """Return the ContextConfig a router folder was saved with (None: a paper/extended router)."""
    raw = read_router_config(directory).get("router_config")
    if not isinstance(raw, dict) or raw.get("variant") != "context":
        return None
    return ContextConfig.from_dict(raw)


def load_context_weights(router: ContextRouter, directory: Path) -> str:
    """Add a saved backbone change to a context router built on the base model, in place; return its checksum.

    The weights must match router.json's recorded size and sha256 and recorded shape
    (:func:`condsearch.model.artifacts.router_delta.check_delta_record`): a one-line ModelError if not.
    """
    meta = read_router_config(directory)
    if meta.get("layer") != router.layer:
        raise ModelError(
            f"{directory}: context router saved with first routed layer {meta.get('layer')}, not {router.layer}"
        )
    checksum = checked_router_checksum(directory, meta)  # and the recorded shape of the change
    state = load_weights(Path(directory) / ROUTER_WEIGHTS, "router weights")
    apply_backbone_delta(router, state, directory)
    return checksum
