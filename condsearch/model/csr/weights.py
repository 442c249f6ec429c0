"""Saving and loading a trained router's weights (safetensors + JSON, never pickles).

A router folder holds ``router.safetensors`` (the trainable parameters) and ``router.json``
(format version, the :class:`RouterConfig` that rebuilds it, the size and sha256 of the weights,
the model it was trained for and how); its names, format and checks are
:mod:`condsearch.model.artifacts.routers`'s.
"""

from __future__ import annotations

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
from condsearch.model.csr.router import Router, RouterConfig


def save_router(router: Router, directory: Path, meta: dict[str, object], dtype: torch.dtype = torch.float16) -> str:
    """Write the router's trainable parameters and metadata atomically; return the checksum."""
    directory = Path(directory)
    check_own_artifact(directory, "router")
    with replacing_dir(directory) as tmp:
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in router.trainable_parameters().items()}
        save_weights(state, tmp / ROUTER_WEIGHTS, f"{directory}: router weights")  # float16 can overflow to inf
        info = {
            "format_version": ROUTER_FORMAT_VERSION,
            "layer": router.layer,
            "router_config": router.config.to_dict(),
            "train_backbone": router.trainable,
            **meta,
            WEIGHTS_RECORD: weights_record(tmp),
        }
        write_json(tmp / ROUTER_CONFIG, info)
    return router_checksum(directory)


def saved_config(directory: Path) -> RouterConfig:
    """Return the RouterConfig a router folder was trained with (its layer as trained)."""
    meta = read_router_config(directory)
    raw = meta.get("router_config")
    if not isinstance(raw, dict):
        raise ModelError(f"{directory}: {ROUTER_CONFIG} has no router_config")
    return RouterConfig.from_dict({**raw, "layer": meta.get("layer", raw.get("layer", -1))})


def load_router_weights(router: Router, directory: Path) -> str:
    """Load trained parameters into a router built from the folder's own config; return their checksum.

    The weights must match router.json's recorded size and sha256, and every tensor the router's
    config makes (its variant, layer and ranks) must be there in its shape: a one-line ModelError if not.
    """
    meta = read_router_config(directory)
    if meta.get("layer") != router.layer:
        raise ModelError(f"{directory}: router trained at layer {meta.get('layer')}, not {router.layer}")
    checksum = checked_router_checksum(directory, meta)
    state = load_weights(Path(directory) / ROUTER_WEIGHTS, "router weights")
    router.trainable = str(meta.get("train_backbone", "top"))  # routers saved before the option trained the top
    params = router.trainable_parameters()
    if set(state) != set(params):
        raise ModelError(f"{directory}: router weights do not fit this backbone and router config")
    with torch.no_grad():
        for name, p in params.items():
            if state[name].shape != p.shape:
                raise ModelError(f"{directory}: router weight {name} has shape {tuple(state[name].shape)}")
            p.copy_(state[name].to(p.dtype))
    return checksum
