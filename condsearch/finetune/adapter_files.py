"""An adapter folder's files without torch: whether there is one, its checksum, its config and its checks.

``condsearch.finetune.adapter`` loads and saves the weights (with torch) and re-exports these; a
one-shot query checks an adapter here without paying for ``import torch``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from condsearch.errors import ModelError

if TYPE_CHECKING:
    from condsearch.encoders.bert import BertStyleEncoder
    from condsearch.encoders.decoder import PromptEncoder
    from condsearch.encoders.onnx_files import OnnxBertEncoder


log = logging.getLogger(__name__)

ADAPTER_FORMAT_VERSION = 1
ADAPTER_FILE = "adapter.safetensors"
ADAPTER_CONFIG = "adapter.json"
# What else a decoder's adapter depends on besides pooling: its prompts and attention (bidirectional layers).
_ENCODER_SETTINGS = ("prompt_template", "unconditional_template", "bidirectional_layers")


def encoder_settings(encoder: BertStyleEncoder | PromptEncoder | OnnxBertEncoder) -> dict[str, object]:
    """Return the settings of encoder's describe() that an adapter trained on it depends on ({} for BERT-style)."""
    described = encoder.describe()
    return {key: described[key] for key in _ENCODER_SETTINGS if key in described}


def has_adapter(folder: Path) -> bool:
    """Return whether folder holds a LoRA adapter."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_checksum(folder: Path) -> str:
    """Return the sha256 of the adapter weights file."""
    try:
        return hashlib.sha256((Path(folder) / ADAPTER_FILE).read_bytes()).hexdigest()
    except OSError as exc:
        raise ModelError(f"{folder}: adapter weights unreadable ({type(exc).__name__})") from exc


def read_adapter_config(folder: Path) -> dict[str, object]:
    """Return adapter.json, checking its format version."""
    try:
        meta = json.loads((Path(folder) / ADAPTER_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{folder}: not a condsearch adapter ({ADAPTER_CONFIG} unreadable)") from exc
    if not isinstance(meta, dict) or meta.get("format_version") != ADAPTER_FORMAT_VERSION:
        raise ModelError(f"{folder}: unsupported adapter format")
    return meta


def check_adapter(encoder: BertStyleEncoder | PromptEncoder | OnnxBertEncoder, folder: Path) -> dict[str, object]:
    """Return the folder's adapter.json after checking that its adapter was trained on this encoder."""
    folder = Path(folder)
    meta = read_adapter_config(folder)
    if meta.get("model_id") and meta["model_id"] != encoder.model_id:
        raise ModelError(f"adapter {folder} was trained for {meta['model_id']}, not {encoder.model_id}")
    if meta.get("model_revision") and meta["model_revision"] != encoder.revision:
        log.warning(
            "adapter %s was trained on %s at %s; it now resolves to %s",
            folder,
            encoder.model_id,
            meta["model_revision"],
            encoder.revision,
        )
    if meta.get("encoder_pooling") and meta["encoder_pooling"] != encoder.pooling:
        raise ModelError(f"adapter {folder} was trained on {meta['encoder_pooling']} pooling, not {encoder.pooling}")
    recorded = meta.get("encoder")
    trained: dict[str, object] = recorded if isinstance(recorded, dict) else {}
    now = encoder_settings(encoder)
    unset = {"bidirectional_layers": 0}  # absent means causal
    for key in _ENCODER_SETTINGS:
        was, is_ = trained.get(key, unset.get(key)), now.get(key, unset.get(key))
        if was != is_:
            name = key.replace("_", " ")
            raise ModelError(f"adapter {folder} was trained with {name} {was!r}, not {is_!r}")
    return meta
