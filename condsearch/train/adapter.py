"""Saving trained adapters: LoRA in PEFT's format, a full fine-tune's low-rank changes as a ``delta`` adapter.

A folder written by ``condsearch train --finetune lora`` holds PEFT's ``adapter_config.json`` and
``adapter_model.safetensors`` with condsearch's ``condsearch_adapter.json`` beside them, plus
``head.safetensors`` and ``head.json`` when the head was trained on top (see
:mod:`condsearch.model.artifacts.adapters`). Loading one onto an encoder is :mod:`condsearch.model.encoders.lora`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from condsearch.base.artifact_files import (
    NATIVE_ADAPTER_CONFIG,
    NATIVE_ADAPTER_WEIGHTS,
    PEFT_WEIGHTS,
    check_own_artifact,
    write_json,
)
from condsearch.base.atomic import replacing_dir
from condsearch.model.artifacts.adapters import (  # noqa: F401 - encoder_settings, has_adapter: re-exported for training
    DELTA_KIND,
    LoraSettings,
    adapter_checksum,
    encoder_settings,
    has_adapter,
    native_meta,
    peft_names,
    write_lora_meta,
)
from condsearch.model.artifacts.weights import check_finite, save_weights
from condsearch.model.head import ProjectionHead, write_head_files
from condsearch.train.lora import LoraConfig, lora_state

if TYPE_CHECKING:
    from condsearch.model.encoders.bert import BertStyleEncoder
    from condsearch.model.encoders.decoder import PromptEncoder


def provenance(encoder: BertStyleEncoder | PromptEncoder, extra: dict[str, object] | None) -> dict[str, object]:
    """Return what an adapter records about the encoder it was made for (and ``extra``: how it was trained)."""
    settings = encoder_settings(encoder)
    return {
        "model_id": encoder.model_id,
        "model_revision": encoder.revision,
        "encoder_pooling": encoder.pooling,
        "max_length": encoder.max_length,
        **({"encoder": settings} if settings else {}),
        **(extra or {}),
    }


def save_adapter(
    encoder: BertStyleEncoder | PromptEncoder,
    config: LoraConfig,
    directory: Path,
    *,
    head: ProjectionHead | None = None,
    extra: dict[str, object] | None = None,
    dtype: torch.dtype = torch.float16,
) -> str:
    """Write the encoder's LoRA adapter in PEFT's format (and the head, if any) atomically; return the checksum.

    The adapter is stored as ``dtype`` (half the bytes of float32). The encoder's own adapter
    is rounded to that precision first, so that it gives exactly the vectors the file will.
    """
    directory = Path(directory)
    params = lora_state(encoder.model)
    check_own_artifact(directory, "adapter")
    check_finite(params, f"{directory}: adapter weights")  # before rounding them in the encoder
    with torch.no_grad():
        for p in params.values():
            p.copy_(p.to(dtype).to(p.dtype))
    modules = sorted({key.rsplit(".", 1)[0] for key in params})
    factors = {m: (params[f"{m}.lora_a"], params[f"{m}.lora_b"]) for m in modules}
    settings = LoraSettings(config.rank, config.alpha, config.dropout, config.targets)
    with replacing_dir(directory) as tmp:
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in peft_names(factors).items()}
        save_weights(state, tmp / PEFT_WEIGHTS, f"{directory}: adapter weights")  # float16 can overflow to inf
        write_lora_meta(tmp, settings, modules, provenance(encoder, extra))
        if head is not None:
            write_head_files(head, tmp, extra, shown=directory)
    return adapter_checksum(directory)


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
    """Write weight changes (from lowrank.weight_deltas) as an adapter folder (format 1); return its checksum.

    encoder is the base model the changes apply to; rank is what the matrices were cut to (None: full).
    """
    directory = Path(directory)
    check_own_artifact(directory, "adapter")
    with replacing_dir(directory) as tmp:
        tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
        save_weights(tensors, tmp / NATIVE_ADAPTER_WEIGHTS, f"{directory}: adapter weights")
        write_json(
            tmp / NATIVE_ADAPTER_CONFIG, native_meta({"kind": DELTA_KIND, "rank": rank}, provenance(encoder, extra))
        )
        if head is not None:
            write_head_files(head, tmp, extra, shown=directory)
    return adapter_checksum(directory)
