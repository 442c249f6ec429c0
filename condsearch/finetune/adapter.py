"""Adapter folders on disk: LoRA weights (safetensors) + config (JSON), optionally with a head.

A folder written by ``condsearch train --finetune lora`` holds ``adapter.safetensors`` and
``adapter.json``, plus ``head.safetensors`` and ``head.json`` when the head was trained on
top. ``--head FOLDER`` loads whichever parts are present: the adapter onto the encoder
(recorded in its ``describe()`` as ``adapter_checksum``), the head after it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from condsearch.atomic import replacing_dir
from condsearch.errors import ModelError
from condsearch.finetune.lora import LoraConfig, add_lora, load_lora_state, lora_state, merge_lora
from condsearch.head import ProjectionHead, write_head_files

if TYPE_CHECKING:
    from condsearch.encoders.bert import BertStyleEncoder
    from condsearch.encoders.decoder import PromptEncoder

log = logging.getLogger(__name__)

ADAPTER_FORMAT_VERSION = 1
ADAPTER_FILE = "adapter.safetensors"
ADAPTER_CONFIG = "adapter.json"
# What else a decoder's adapter depends on besides pooling: its prompts and attention (bidirectional layers).
_ENCODER_SETTINGS = ("prompt_template", "unconditional_template", "bidirectional_layers")


def encoder_settings(encoder: BertStyleEncoder | PromptEncoder) -> dict[str, object]:
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


def lora_config_of(meta: dict[str, object]) -> LoraConfig:
    """Rebuild the LoRA config recorded in adapter.json."""
    try:
        targets = meta["targets"]
        return LoraConfig(
            rank=int(meta["rank"]),  # type: ignore[call-overload]
            alpha=float(meta["alpha"]),  # type: ignore[arg-type]
            dropout=float(meta["dropout"]),  # type: ignore[arg-type]
            targets=tuple(targets),  # type: ignore[arg-type]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"adapter config incomplete or invalid ({exc})") from exc


def save_adapter(
    encoder: BertStyleEncoder | PromptEncoder,
    config: LoraConfig,
    directory: Path,
    *,
    head: ProjectionHead | None = None,
    extra: dict[str, object] | None = None,
    dtype: torch.dtype = torch.float16,
) -> str:
    """Write the encoder's adapter (and the head, if any) into directory atomically; return the checksum.

    The adapter is stored as ``dtype`` (half the bytes of float32). The encoder's own adapter
    is rounded to that precision first, so that it gives exactly the vectors the file will.
    """
    params = lora_state(encoder.model)
    with torch.no_grad():
        for p in params.values():
            p.copy_(p.to(dtype).to(p.dtype))
    directory = Path(directory)
    with replacing_dir(directory) as tmp:
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in params.items()}
        save_file(state, str(tmp / ADAPTER_FILE), metadata={"format": "pt"})
        meta = {
            "format_version": ADAPTER_FORMAT_VERSION,
            "kind": "lora",
            **asdict(config),
            "model_id": encoder.model_id,
            "model_revision": encoder.revision,
            "encoder_pooling": encoder.pooling,
            "max_length": encoder.max_length,
            **({"encoder": encoder_settings(encoder)} if encoder_settings(encoder) else {}),
            **(extra or {}),
        }
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
        if head is not None:
            write_head_files(head, tmp, extra)
    return adapter_checksum(directory)


def check_adapter(encoder: BertStyleEncoder | PromptEncoder, folder: Path) -> dict[str, object]:
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


def apply_adapter(encoder: BertStyleEncoder | PromptEncoder, folder: Path) -> None:
    """Wrap the encoder's projections with the folder's adapter and load its weights (in place)."""
    folder = Path(folder)
    meta = check_adapter(encoder, folder)
    try:
        state = load_file(str(folder / ADAPTER_FILE))
    except Exception as exc:  # safetensors raises several types for damaged files
        raise ModelError(f"{folder}: adapter weights unreadable ({type(exc).__name__})") from exc
    try:
        add_lora(encoder.model, lora_config_of(meta))
        load_lora_state(encoder.model, state)
        merge_lora(encoder.model)  # loaded adapters only serve inference: no extra cost per layer
    except ValueError as exc:
        raise ModelError(f"{folder}: {exc}") from exc
    encoder.model.to(encoder.device, encoder.dtype).eval()
    encoder.adapter_checksum = adapter_checksum(folder)
