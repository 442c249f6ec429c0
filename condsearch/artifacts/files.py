"""Artifact names, shipped folders, file names and format versions; which artifact a folder holds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from condsearch.errors import ModelError

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
#: the shipped LoRA adapter + head fine-tuned on C-STS for the default model (profile ``lora``)
LORA_PROFILE_DIR = ASSETS_DIR / "minilm-case-lora"
#: the shipped full fine-tune of the default model, as a rank-64 delta adapter without a head (profile ``full``,
#: the default: see ``condsearch.artifacts.profiles.DEFAULT_PROFILE``)
FULL_PROFILE_DIR = ASSETS_DIR / "minilm-case-full-r64"
#: the shipped head trained on the frozen default model (profile ``frozen``)
FROZEN_HEAD_DIR = ASSETS_DIR / "minilm-case-head"
#: the shipped router for the default model (``--router default``)
DEFAULT_ROUTER_DIR = ASSETS_DIR / "minilm-csr-router"

HEAD_FORMAT_VERSION = 1
HEAD_WEIGHTS = "head.safetensors"
HEAD_CONFIG = "head.json"

#: PEFT's own file names (what PEFT, TEI and vLLM load) and condsearch's settings beside them
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
ADAPTER_SIDECAR = "condsearch_adapter.json"
#: format 2: PEFT's files + the sidecar; format 1 (read, and still written for ``delta`` adapters): below
ADAPTER_FORMAT_VERSION = 2
LEGACY_ADAPTER_FORMAT_VERSION = 1
LEGACY_ADAPTER_WEIGHTS = "adapter.safetensors"
LEGACY_ADAPTER_CONFIG = "adapter.json"

ROUTER_FORMAT_VERSION = 2
ROUTER_WEIGHTS = "router.safetensors"
ROUTER_CONFIG = "router.json"

CHECKPOINT_FORMAT_VERSION = 1
CHECKPOINT_STATE = "checkpoint.json"
#: a full fine-tune's model folder: the summary ``train --finetune full`` writes beside the weights
MODEL_SUMMARY = "finetune.json"

#: The file that marks a folder as each kind of artifact, checked in this order: a full model
#: folder and an adapter folder may hold a head beside them, so the head comes last.
ARTIFACT_MARKERS: dict[str, str] = {
    "checkpoint": CHECKPOINT_STATE,
    "router": ROUTER_CONFIG,
    "model": MODEL_SUMMARY,
    "adapter": PEFT_CONFIG,
    "head": HEAD_CONFIG,
}
#: markers of the same kinds written before (format-1 adapters, and ``delta`` adapters still)
_OLDER_MARKERS: dict[str, tuple[str, ...]] = {"adapter": (LEGACY_ADAPTER_CONFIG,)}


def artifact_kind(folder: Path | str) -> str | None:
    """Return which kind of condsearch artifact folder holds (a key of ARTIFACT_MARKERS), or None."""
    folder = Path(folder)
    for kind, marker in ARTIFACT_MARKERS.items():
        if any((folder / m).is_file() for m in (marker, *_OLDER_MARKERS.get(kind, ()))):
            return kind
    return None


def file_checksum(path: Path, what: str) -> str:
    """Return the sha256 of a file, or a one-line ModelError naming ``what`` when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise ModelError(f"{Path(path).parent}: {what} unreadable ({type(exc).__name__})") from exc


def read_json(path: Path, what: str) -> dict[str, object]:
    """Return a JSON object from an artifact's config file, or a one-line ModelError."""
    try:
        meta = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{Path(path).parent}: not a condsearch {what} ({Path(path).name} unreadable)") from exc
    if not isinstance(meta, dict):
        raise ModelError(f"{Path(path).parent}: not a condsearch {what} ({Path(path).name} is not an object)")
    return meta


def write_json(path: Path, meta: dict[str, object]) -> None:
    """Write an artifact's config file as indented JSON."""
    Path(path).write_text(json.dumps(meta, indent=2) + "\n")
