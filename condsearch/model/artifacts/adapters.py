"""Adapter folders without torch: PEFT's LoRA format and condsearch's own format (``delta`` adapters, older LoRA).

A LoRA adapter is written as PEFT writes one, so that PEFT (``PeftModel.from_pretrained``), TEI
and vLLM load it: ``adapter_config.json`` (PEFT's keys) and ``adapter_model.safetensors``
(``base_model.model.<module>.lora_A.weight`` (rank, in) / ``lora_B.weight`` (out, rank)), with
condsearch's own settings beside them in ``condsearch_adapter.json`` (format version, the encoder
it was trained on, its pooling and prompts, the target kinds, the weights' sha256, how it was
trained). Format 1 (``adapter.json`` + ``adapter.safetensors`` keyed ``<module>.lora_a`` /
``.lora_b``) is still read, and still written for ``delta`` adapters (a full fine-tune's weight
changes, :mod:`condsearch.model.encoders.lowrank`), which PEFT has no format for.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from condsearch.base.artifact_files import (
    ADAPTER_FORMAT_VERSION,
    ADAPTER_SIDECAR,
    NATIVE_ADAPTER_CONFIG,
    NATIVE_ADAPTER_FORMAT_VERSION,
    NATIVE_ADAPTER_WEIGHTS,
    PEFT_CONFIG,
    PEFT_WEIGHTS,
    file_checksum,
    read_json,
    write_json,
)
from condsearch.errors import ModelError

log = logging.getLogger(__name__)

LORA_KIND = "lora"
DELTA_KIND = "delta"
#: PEFT's prefix of a wrapped model's module names, and the suffixes of a LoRA layer's two factors
PEFT_PREFIX = "base_model.model."
_PEFT_SUFFIX = {"a": ".lora_A.weight", "b": ".lora_B.weight"}
_NATIVE_SUFFIX = {"a": ".lora_a", "b": ".lora_b"}
# What else a decoder's adapter depends on besides pooling: its prompts and attention (bidirectional layers).
ENCODER_SETTINGS = ("prompt_template", "unconditional_template", "bidirectional_layers")
_UNSET = {"bidirectional_layers": 0}  # absent means causal

T = TypeVar("T")


class _Described(Protocol):
    """An encoder as an adapter's checks see it (read-only)."""

    @property
    def model_id(self) -> str: ...

    @property
    def revision(self) -> str: ...

    @property
    def pooling(self) -> str: ...

    def describe(self) -> dict[str, object]: ...


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA adapter's shape: update = (alpha / rank) · B A (√rank under rsLoRA) on each named module."""

    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = ()  # condsearch's target kinds (query, key, ...); () when not known
    rslora: bool = False

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


@dataclass(frozen=True)
class Adapter:
    """An adapter folder, read and checked: where its weights are, its kind and what it was trained on."""

    folder: Path
    format_version: int
    kind: str  # LORA_KIND or DELTA_KIND
    weights: Path
    lora: LoraSettings | None
    #: provenance: model_id, model_revision, encoder_pooling, max_length, encoder (decoder settings), training
    meta: Mapping[str, object] = field(default_factory=dict)

    @property
    def checksum(self) -> str:
        """Return the adapter's identity: its weights' sha256 (or, for a converted one, its source's)."""
        digest = file_checksum(self.weights, "adapter weights")
        converted = self.meta.get("converted_from")
        if isinstance(converted, dict) and converted.get("weights_sha256") == digest:
            # the same tensors under PEFT's names: indexes built with the old folder still match
            return str(converted["adapter_checksum"])
        return digest

    @property
    def key(self) -> str:
        """Return what identifies the adapter's merged effect (cache keys): its checksum and shape."""
        shape = json.dumps([self.kind, asdict(self.lora) if self.lora else None], sort_keys=True)
        return f"{self.checksum}:{hashlib.sha256(shape.encode()).hexdigest()}"

    def trained_settings(self) -> dict[str, Any]:
        """Return the encoder settings it was trained with (pooling, prompts, bidirectional layers)."""
        recorded = self.meta.get("encoder")
        settings = dict(recorded) if isinstance(recorded, dict) else {}
        if isinstance(self.meta.get("encoder_pooling"), str):
            settings.setdefault("pooling", self.meta["encoder_pooling"])
        return settings


def has_adapter(folder: Path) -> bool:
    """Return whether folder holds an adapter (PEFT's format or condsearch's first)."""
    return (Path(folder) / PEFT_CONFIG).is_file() or (Path(folder) / NATIVE_ADAPTER_CONFIG).is_file()


def read_adapter(folder: Path) -> Adapter:
    """Read an adapter folder in either format; a one-line ModelError when it is not one condsearch can use."""
    folder = Path(folder)
    if (folder / PEFT_CONFIG).is_file():
        return _read_peft(folder)
    meta = read_json(folder / NATIVE_ADAPTER_CONFIG, "adapter")
    if meta.get("format_version") != NATIVE_ADAPTER_FORMAT_VERSION:
        raise ModelError(f"{folder}: unsupported adapter format")
    kind = meta.get("kind", LORA_KIND)
    if kind == DELTA_KIND:
        return Adapter(folder, NATIVE_ADAPTER_FORMAT_VERSION, DELTA_KIND, folder / NATIVE_ADAPTER_WEIGHTS, None, meta)
    try:
        targets = meta["targets"]
        lora = LoraSettings(
            int(meta["rank"]),  # type: ignore[call-overload]
            float(meta["alpha"]),  # type: ignore[arg-type]
            float(meta["dropout"]),  # type: ignore[arg-type]
            tuple(targets),  # type: ignore[arg-type]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"adapter config incomplete or invalid ({exc})") from exc
    return Adapter(folder, NATIVE_ADAPTER_FORMAT_VERSION, LORA_KIND, folder / NATIVE_ADAPTER_WEIGHTS, lora, meta)


def _read_peft(folder: Path) -> Adapter:
    config = read_json(folder / PEFT_CONFIG, "adapter")
    meta = read_json(folder / ADAPTER_SIDECAR, "adapter") if (folder / ADAPTER_SIDECAR).is_file() else {}
    if meta and meta.get("format_version") != ADAPTER_FORMAT_VERSION:
        raise ModelError(f"{folder}: unsupported adapter format {meta.get('format_version')!r}")
    if config.get("peft_type") != "LORA":
        raise ModelError(f"{folder}: a PEFT {config.get('peft_type')} adapter; only LoRA is supported")
    unsupported = [k for k in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save") if config.get(k)]
    if config.get("bias", "none") != "none":
        unsupported.append("bias")
    if unsupported:
        raise ModelError(f"{folder}: PEFT adapter settings not supported: {', '.join(unsupported)}")
    try:
        lora = LoraSettings(
            int(config["r"]),  # type: ignore[call-overload]
            float(config["lora_alpha"]),  # type: ignore[arg-type]
            float(config.get("lora_dropout") or 0.0),  # type: ignore[arg-type]
            tuple(meta.get("targets") or ()),  # type: ignore[arg-type]
            bool(config.get("use_rslora")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"{folder}: {PEFT_CONFIG} incomplete or invalid ({exc})") from exc
    if not meta and isinstance(config.get("base_model_name_or_path"), str):
        meta = {"model_id": config["base_model_name_or_path"]}
    return Adapter(folder, ADAPTER_FORMAT_VERSION, LORA_KIND, folder / PEFT_WEIGHTS, lora, meta)


def adapter_checksum(folder: Path) -> str:
    """Return the identity an index records for the adapter in folder (see :attr:`Adapter.checksum`)."""
    return read_adapter(folder).checksum


def encoder_settings(encoder: _Described) -> dict[str, object]:
    """Return the settings of encoder's describe() that an adapter trained on it depends on ({} for BERT-style)."""
    described = encoder.describe()
    return {key: described[key] for key in ENCODER_SETTINGS if key in described}


def check_adapter(adapter: Adapter, encoder: _Described) -> None:
    """Raise ModelError unless the adapter was trained on this encoder (model, pooling, prompts, attention)."""
    meta, folder = adapter.meta, adapter.folder
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
    trained, now = adapter.trained_settings(), encoder_settings(encoder)
    for key in ENCODER_SETTINGS:
        was, is_ = trained.get(key, _UNSET.get(key)), now.get(key, _UNSET.get(key))
        if was != is_:
            raise ModelError(f"adapter {folder} was trained with {key.replace('_', ' ')} {was!r}, not {is_!r}")


def checked_checksum(folder: Path, encoder: _Described) -> str:
    """Return the checksum of the adapter in folder after checking that it was trained on this encoder."""
    adapter = read_adapter(folder)
    check_adapter(adapter, encoder)
    return adapter.checksum


def lora_factors(adapter: Adapter, state: Mapping[str, T]) -> dict[str, tuple[T, T]]:
    """Return a LoRA adapter's tensors as {module name: (A (rank, in), B (out, rank))}, in either format."""
    prefix, suffix = (
        (PEFT_PREFIX, _PEFT_SUFFIX) if adapter.format_version == ADAPTER_FORMAT_VERSION else ("", _NATIVE_SUFFIX)
    )
    halves: dict[str, dict[str, T]] = {}
    for key, tensor in state.items():
        part = next((p for p, s in suffix.items() if key.endswith(s) and key.startswith(prefix)), None)
        if part is None:
            raise ModelError(f"{adapter.folder}: unexpected adapter tensor {key!r}")
        halves.setdefault(key[len(prefix) : -len(suffix[part])], {})[part] = tensor
    incomplete = sorted(m for m, h in halves.items() if set(h) != {"a", "b"})
    if incomplete:
        raise ModelError(f"{adapter.folder}: adapter tensor {incomplete[0]}: one of its two factors is missing")
    return {m: (h["a"], h["b"]) for m, h in halves.items()}


def peft_names(factors: Mapping[str, tuple[T, T]]) -> dict[str, T]:
    """Return {module: (A, B)} under PEFT's tensor names (what ``adapter_model.safetensors`` holds)."""
    out: dict[str, T] = {}
    for module, (a, b) in factors.items():
        out[f"{PEFT_PREFIX}{module}{_PEFT_SUFFIX['a']}"] = a
        out[f"{PEFT_PREFIX}{module}{_PEFT_SUFFIX['b']}"] = b
    return out


def peft_config(lora: LoraSettings, modules: list[str], model_id: str) -> dict[str, object]:
    """Return PEFT's ``adapter_config.json`` for a LoRA adapter on the named modules of ``model_id``."""
    return {
        "peft_type": "LORA",
        "task_type": "FEATURE_EXTRACTION",
        "base_model_name_or_path": model_id,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "use_rslora": lora.rslora,
        "target_modules": sorted(modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
    }


def write_lora_meta(
    folder: Path, lora: LoraSettings, modules: list[str], provenance: Mapping[str, object]
) -> dict[str, object]:
    """Write PEFT's config and condsearch's sidecar beside ``adapter_model.safetensors``; return the sidecar.

    ``provenance``: model_id, model_revision, encoder_pooling, max_length, encoder, training, ...
    """
    folder = Path(folder)
    write_json(folder / PEFT_CONFIG, peft_config(lora, modules, str(provenance.get("model_id", ""))))
    meta: dict[str, object] = {
        "format_version": ADAPTER_FORMAT_VERSION,
        "kind": LORA_KIND,
        "targets": list(lora.targets),
        **provenance,
        "weights_sha256": file_checksum(folder / PEFT_WEIGHTS, "adapter weights"),
    }
    write_json(folder / ADAPTER_SIDECAR, meta)
    return meta


def native_meta(kind: Mapping[str, object], provenance: Mapping[str, object]) -> dict[str, object]:
    """Return format 1's ``adapter.json``, the config of a ``delta`` adapter."""
    return {"format_version": NATIVE_ADAPTER_FORMAT_VERSION, **kind, **provenance}
