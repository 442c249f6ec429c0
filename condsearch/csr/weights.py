"""Saving and loading a trained router (safetensors + JSON, never pickles).

A router folder holds ``router.safetensors`` (the trainable parameters) and ``router.json``
(format version, the :class:`RouterConfig` that rebuilds it, the model it was trained for and
how). Format 1 (before the paper/extended split) is refused with a message to retrain.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from condsearch.atomic import replacing_dir
from condsearch.csr.router import Router, RouterConfig
from condsearch.errors import ModelError

ROUTER_FORMAT_VERSION = 2
WEIGHTS_FILE = "router.safetensors"
CONFIG_FILE = "router.json"
DEFAULT_ROUTER_DIR = Path(__file__).parent.parent / "assets" / "minilm-csr-router"


def save_router(router: Router, directory: Path, meta: dict[str, object], dtype: torch.dtype = torch.float16) -> str:
    """Write the router's trainable parameters and metadata atomically; return the checksum."""
    directory = Path(directory)
    with replacing_dir(directory) as tmp:
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in router.trainable_parameters().items()}
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        info = {
            "format_version": ROUTER_FORMAT_VERSION,
            "layer": router.layer,
            "router_config": router.config.to_dict(),
            **meta,
        }
        (tmp / CONFIG_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return router_checksum(directory)


def router_checksum(directory: Path) -> str:
    """Return the sha256 of the router weights file."""
    return hashlib.sha256((Path(directory) / WEIGHTS_FILE).read_bytes()).hexdigest()


def read_router_config(directory: Path) -> dict[str, object]:
    """Return router.json, checking its format version."""
    try:
        meta = json.loads((Path(directory) / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{directory}: not a condsearch router ({CONFIG_FILE} unreadable)") from exc
    if not isinstance(meta, dict):
        raise ModelError(f"{directory}: not a condsearch router")
    if meta.get("format_version") == 1:
        raise ModelError(f"{directory}: router format 1 predates the paper/extended variants; retrain it")
    if meta.get("format_version") != ROUTER_FORMAT_VERSION:
        raise ModelError(f"{directory}: unsupported router format {meta.get('format_version')!r}")
    return meta


def saved_config(directory: Path) -> RouterConfig:
    """Return the RouterConfig a router folder was trained with (its layer as trained)."""
    meta = read_router_config(directory)
    raw = meta.get("router_config")
    if not isinstance(raw, dict):
        raise ModelError(f"{directory}: {CONFIG_FILE} has no router_config")
    return RouterConfig.from_dict({**raw, "layer": meta.get("layer", raw.get("layer", -1))})


def load_router_weights(router: Router, directory: Path) -> None:
    """Load trained parameters into a router built from the folder's own config."""
    meta = read_router_config(directory)
    if meta.get("layer") != router.layer:
        raise ModelError(f"{directory}: router trained at layer {meta.get('layer')}, not {router.layer}")
    try:
        state = load_file(str(Path(directory) / WEIGHTS_FILE))
    except Exception as exc:  # safetensors raises several types for damaged files
        raise ModelError(f"{directory}: router weights unreadable ({type(exc).__name__})") from exc
    params = router.trainable_parameters()
    if set(state) != set(params):
        raise ModelError(f"{directory}: router weights do not fit this backbone and router config")
    with torch.no_grad():
        for name, p in params.items():
            if state[name].shape != p.shape:
                raise ModelError(f"{directory}: router weight {name} has shape {tuple(state[name].shape)}")
            p.copy_(state[name].to(p.dtype))
