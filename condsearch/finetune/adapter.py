"""Adapter folders on disk: LoRA or low-rank delta weights (safetensors) + config (JSON), optionally with a head.

A folder written by ``condsearch train --finetune lora`` holds ``adapter.safetensors`` and
``adapter.json``, plus ``head.safetensors`` and ``head.json`` when the head was trained on
top. ``--head FOLDER`` loads whichever parts are present: the adapter onto the encoder
(recorded in its ``describe()`` as ``adapter_checksum``), the head after it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from condsearch.atomic import replacing_dir
from condsearch.errors import ModelError
from condsearch.finetune.adapter_files import (  # noqa: F401 - re-exported: the adapter's files, without torch
    ADAPTER_CONFIG,
    ADAPTER_FILE,
    ADAPTER_FORMAT_VERSION,
    adapter_checksum,
    check_adapter,
    encoder_settings,
    has_adapter,
    read_adapter_config,
)
from condsearch.finetune.lora import LoraConfig, add_lora, load_lora_state, lora_state, merge_lora
from condsearch.finetune.lowrank import DELTA_KIND, apply_deltas
from condsearch.head import ProjectionHead, write_head_files

if TYPE_CHECKING:
    from condsearch.encoders.bert import BertStyleEncoder
    from condsearch.encoders.decoder import PromptEncoder

log = logging.getLogger(__name__)


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
        meta = _adapter_meta(encoder, {"kind": "lora", **asdict(config)}, extra)
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
        if head is not None:
            write_head_files(head, tmp, extra)
    return adapter_checksum(directory)


def _adapter_meta(
    encoder: BertStyleEncoder | PromptEncoder, kind: dict[str, object], extra: dict[str, object] | None
) -> dict[str, object]:
    """Return adapter.json: the format, the adapter's kind and settings, the encoder it was made for."""
    return {
        "format_version": ADAPTER_FORMAT_VERSION,
        **kind,
        "model_id": encoder.model_id,
        "model_revision": encoder.revision,
        "encoder_pooling": encoder.pooling,
        "max_length": encoder.max_length,
        **({"encoder": encoder_settings(encoder)} if encoder_settings(encoder) else {}),
        **(extra or {}),
    }


def save_delta_adapter(
    encoder: BertStyleEncoder,
    state: dict[str, torch.Tensor],
    directory: Path,
    *,
    rank: int | None,
    head: ProjectionHead | None = None,
    extra: dict[str, object] | None = None,
    dtype: torch.dtype = torch.float16,
) -> str:
    """Write weight changes (from lowrank.weight_deltas) as an adapter folder; return its checksum.

    encoder is the base model the changes apply to; rank is what the matrices were cut to (None: full).
    """
    directory = Path(directory)
    with replacing_dir(directory) as tmp:
        tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
        save_file(tensors, str(tmp / ADAPTER_FILE), metadata={"format": "pt"})
        meta = _adapter_meta(encoder, {"kind": DELTA_KIND, "rank": rank}, extra)
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
        if head is not None:
            write_head_files(head, tmp, extra)
    return adapter_checksum(directory)


def apply_adapter(encoder: BertStyleEncoder | PromptEncoder, folder: Path) -> None:
    """Wrap the encoder's projections with the folder's adapter and load its weights (in place)."""
    folder = Path(folder)
    meta = check_adapter(encoder, folder)
    try:
        state = load_file(str(folder / ADAPTER_FILE))
    except Exception as exc:  # safetensors raises several types for damaged files
        raise ModelError(f"{folder}: adapter weights unreadable ({type(exc).__name__})") from exc
    try:
        if meta.get("kind") == DELTA_KIND:
            apply_deltas(encoder.model, state)
        else:
            add_lora(encoder.model, lora_config_of(meta))
            load_lora_state(encoder.model, state)
            merge_lora(encoder.model)  # loaded adapters only serve inference: no extra cost per layer
    except ValueError as exc:
        raise ModelError(f"{folder}: {exc}") from exc
    encoder.model.to(encoder.device, encoder.dtype).eval()
    encoder.adapter_checksum = adapter_checksum(folder)
