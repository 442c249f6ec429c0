"""A trained router's folder without torch: its config, checksum, model and the --router names.

``router.json`` records the size and sha256 of ``router.safetensors`` (:data:`WEIGHTS_RECORD`),
and no router loads weights that do not match them: another router's weights copied in, or a
damaged file, is a one-line ModelError, not a router that answers differently; so is a router.json
whose recorded backbone change (rank, encoding, tensor count, bytes) is not what the weights hold
(:mod:`condsearch.model.artifacts.router_delta`). A folder written before the record existed loads with
its shapes checked and a one-line warning naming the command that records it
(``python tools/record_router_checksum.py FOLDER``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from condsearch.base.artifact_files import (
    DEFAULT_ROUTER_DIR,
    ROUTER_CONFIG,
    ROUTER_FORMAT_VERSION,
    ROUTER_WEIGHTS,
    file_checksum,
    read_json,
)
from condsearch.base.model_sources import DEFAULT_MODEL
from condsearch.errors import ModelError
from condsearch.model.artifacts.router_delta import check_delta_record, weights_shapes

log = logging.getLogger(__name__)

ROUTER_AUTO = "auto"
ROUTER_NONE = "none"
ROUTER_DEFAULT = "default"
#: in router.json: {"size", "sha256"} of router.safetensors, checked before the weights load
WEIGHTS_RECORD = "weights"
#: what records the weights' checksum in a router folder written before router.json held it
RECORD_COMMAND = "python tools/record_router_checksum.py"


def router_checksum(folder: Path) -> str:
    """Return the sha256 of the router weights file."""
    return file_checksum(Path(folder) / ROUTER_WEIGHTS, "router weights")


def weights_record(folder: Path) -> dict[str, object]:
    """Return what router.json records of the folder's weights file: its size and sha256."""
    return {"size": _size_of(folder), "sha256": router_checksum(folder)}


def checked_router_checksum(folder: Path, meta: dict[str, object] | None = None) -> str:
    """Return the sha256 of a router folder's weights once it matches router.json's record (size first).

    A mismatch is a one-line ModelError; a router.json without the record (written before it
    existed) gives a one-line warning, and the loader's shape checks alone stand between it and
    another router's weights of the same shapes. Either way, what router.json records of a backbone
    change must be what the weights hold (:func:`check_delta_record`).
    """
    folder = Path(folder)
    meta = read_router_config(folder) if meta is None else meta
    if meta.get("backbone_delta") is not None:
        check_delta_record(meta, weights_shapes(folder / ROUTER_WEIGHTS), folder)
    record = meta.get(WEIGHTS_RECORD)
    if record is None:
        log.warning(
            "%s: %s records no sha256 of %s, so only its shapes are checked; record it: %s %s",
            folder,
            ROUTER_CONFIG,
            ROUTER_WEIGHTS,
            RECORD_COMMAND,
            folder,
        )
        return router_checksum(folder)
    if not isinstance(record, dict) or not _is_size(record.get("size")) or not isinstance(record.get("sha256"), str):
        raise ModelError(f"{folder}: {ROUTER_CONFIG}'s {WEIGHTS_RECORD!r} is not a size and a sha256")
    size = _size_of(folder)
    if size != record["size"]:
        raise ModelError(
            f"{folder}: {ROUTER_WEIGHTS} has {size} bytes where {ROUTER_CONFIG} records {record['size']}: "
            "not this router's weights (damaged, or another router's)"
        )
    checksum = router_checksum(folder)
    if checksum != record["sha256"]:
        raise ModelError(
            f"{folder}: {ROUTER_WEIGHTS} does not have the sha256 {ROUTER_CONFIG} records: "
            "not this router's weights (damaged, or another router's)"
        )
    return checksum


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _size_of(folder: Path) -> int:
    try:
        return (Path(folder) / ROUTER_WEIGHTS).stat().st_size
    except OSError as exc:
        raise ModelError(f"{folder}: router weights unreadable ({type(exc).__name__})") from exc


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
