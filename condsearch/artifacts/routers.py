"""A trained router's folder without torch: its config, checksum, model and the --router names."""

from __future__ import annotations

from pathlib import Path

from condsearch.artifacts.files import (
    DEFAULT_ROUTER_DIR,
    ROUTER_CONFIG,
    ROUTER_FORMAT_VERSION,
    ROUTER_WEIGHTS,
    file_checksum,
    read_json,
)
from condsearch.errors import ModelError
from condsearch.models import DEFAULT_MODEL

ROUTER_AUTO = "auto"
ROUTER_NONE = "none"
ROUTER_DEFAULT = "default"


def router_checksum(folder: Path) -> str:
    """Return the sha256 of the router weights file."""
    return file_checksum(Path(folder) / ROUTER_WEIGHTS, "router weights")


def read_router_config(folder: Path) -> dict[str, object]:
    """Return router.json, checking its format version (format 1 predates the paper/extended variants)."""
    meta = read_json(Path(folder) / ROUTER_CONFIG, "router")
    if meta.get("format_version") == 1:
        raise ModelError(f"{folder}: router format 1 predates the paper/extended variants; retrain it")
    if meta.get("format_version") != ROUTER_FORMAT_VERSION:
        raise ModelError(f"{folder}: unsupported router format {meta.get('format_version')!r}")
    return meta


def router_model_id(folder: Path) -> str | None:
    """Return the model id a router folder records (None when it records none)."""
    value = read_router_config(folder).get("model_id")
    return str(value) if value is not None else None


def resolve_router(spec: str | None, model_id: str) -> Path | None:
    """Return the router folder for a --router value (None: untrained router)."""
    spec = spec or ROUTER_AUTO
    if spec == ROUTER_AUTO:
        spec = ROUTER_DEFAULT if model_id == DEFAULT_MODEL and DEFAULT_ROUTER_DIR.is_dir() else ROUTER_NONE
    if spec == ROUTER_NONE:
        return None
    folder = DEFAULT_ROUTER_DIR if spec == ROUTER_DEFAULT else Path(spec).expanduser().resolve()
    if not folder.is_dir():
        raise ModelError(f"router {spec!r}: no such folder (use a router folder, 'default' or 'none')")
    return folder


def router_name(folder: Path | None) -> str:
    """Return what a manifest records for a router folder: 'none', 'default' or its path."""
    if folder is None:
        return ROUTER_NONE
    return ROUTER_DEFAULT if Path(folder).resolve() == DEFAULT_ROUTER_DIR.resolve() else str(folder)
