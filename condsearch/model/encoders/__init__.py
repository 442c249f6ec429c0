"""Encoders turn (condition, sentence) pairs into vectors: BERT-style models, decoder LLMs and NV-Embed.

The protocol and its shared batching are ``base``; each family's CASE inputs are ``bert``, ``decoder``
(with ``bidirectional``, BeLLM's backward dependency) and ``nvembed``; ``family`` tells which family a
folder holds, how it pools and its presets. ``backbone`` is the one transformers loader (CSR's too),
``pooling`` pools token states, ``lora`` folds adapters in at inference, ``parallel`` splits batches
over several GPUs, ``runtime`` picks devices, dtype and attention, and ``cpu`` holds the CPU settings
(int8, ``--backend``, threads). ``onnx/`` is the one ONNX backend (one-shot queries without torch,
bulk CPU encoding, int8), CASE's and the router's, with CASE's own graph and encoder in ``onnx/bert``;
``bert_inputs`` gives CASE's inputs to torch and onnxruntime alike. ``spec`` is the one spec object
every loader takes (:class:`~condsearch.model.encoders.spec.EncoderSpec`), and ``lowrank`` ships a full
fine-tune as a low-rank delta adapter.
Front door: the names in ``__all__`` (:func:`load_encoder` and :class:`EncoderSpec` first); those not
defined or imported here are loaded on first use, so that importing this package loads no torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from condsearch.base.front_door import lazy_names
from condsearch.base.model_sources import ModelSource, read_config, resolve_model
from condsearch.errors import ModelError
from condsearch.model.encoders.base import Encoder, EncodeStats, Pair
from condsearch.model.encoders.cpu import apply_threads, check_quantize
from condsearch.model.encoders.family import (
    DTYPES,
    POOLINGS,
    PRESETS,
    DecoderAttention,
    PromptTemplates,
    default_pooling,
    detect_family,
    templates_with,
)

if TYPE_CHECKING:
    import torch

    from condsearch.model.artifacts.profiles import Profile
    from condsearch.model.encoders.base import ENCODE_BATCH_SIZE
    from condsearch.model.encoders.bert import BertStyleEncoder
    from condsearch.model.encoders.cpu import (
        BACKEND_CHOICES,
        QUANTIZE_AUTO,
        QUANTIZE_CHOICES,
        Backend,
        CpuConfig,
        Quantize,
        available_cores,
        passive_waits,
    )
    from condsearch.model.encoders.spec import EncoderSpec, Runtime

#: public name -> the module of this package it is imported from, when first asked for: torch loads only when
#: an encoder is built, so that importing the choices stays fast (CLI --help)
_HOMES = {
    "BACKEND_CHOICES": "cpu",
    "Backend": "cpu",
    "BertStyleEncoder": "bert",
    "CpuConfig": "cpu",
    "ENCODE_BATCH_SIZE": "base",
    "EncoderSpec": "spec",
    "QUANTIZE_AUTO": "cpu",
    "QUANTIZE_CHOICES": "cpu",
    "Quantize": "cpu",
    "Runtime": "spec",
    "available_cores": "cpu",
    "passive_waits": "cpu",
}

__getattr__ = lazy_names(__name__, _HOMES)


def model_config(source: ModelSource) -> dict[str, object]:
    """Return the model's config.json: read from its folder, or from the hub cache ({} if absent)."""
    if source.local:
        return read_config(source)
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(source.location, "config.json")).read_text())
    except Exception:  # noqa: BLE001 - loading the model itself reports the real problem
        return {}


def model_family(model: str | None) -> str | None:
    """Return the family of a model (id or folder) from its config; None where it cannot be read here.

    Loading the model says why it cannot be read; this only answers which flags apply to it.
    """
    from condsearch.errors import CondsearchError

    try:
        return detect_family(model_config(resolve_model(model)))
    except CondsearchError:
        return None


def _adapter_settings(folder: Path) -> dict[str, Any]:
    """Return the encoder settings a LoRA adapter was trained with (pooling, prompts, bidirectional layers)."""
    from condsearch.model.artifacts.adapters import read_adapter

    return read_adapter(folder).trained_settings()


def load_encoder(spec: EncoderSpec | None = None, *, profile: Profile | None = None) -> Encoder:
    """Return the encoder of a spec's model, as :func:`_load_encoder` says, one load at a time per process.

    Two threads loading through transformers at once in a fresh process fail (its lazy modules):
    :func:`condsearch.model.encoders.first_use.loading` makes them take turns, and makes an ImportError one line.
    """
    from condsearch.model.encoders.first_use import loading

    with loading(spec.model if spec is not None else None):
        return _load_encoder(spec, profile=profile)


def _load_encoder(spec: EncoderSpec | None = None, *, profile: Profile | None = None) -> Encoder:
    """Return the encoder of a spec's model, family and settings, with its profile's adapter merged.

    ``profile``: the spec's profile resolved already (:func:`condsearch.model.vectorizer.load_vectorizer`
    does, to load its head too); else it is resolved here, so that a spec of the default model
    without ``profile="none"`` loads its shipped adapter. The spec's runtime ``device`` may list
    several devices (``cuda:0,cuda:1``): each gets a replica and every batch is split between them.
    An adapter applies to BERT-style encoders with condition-mean pooling, or to decoder embedders;
    ``bidirectional_layers`` (decoders) defaults to the preset's, the adapter's, else
    :class:`DecoderAttention`'s; a ``preset`` supplies the pooling, prompts and bidirectional layers
    left unset. ``quantize="int8"`` (BERT-style, condition-mean pooling, CPU): the adapter merged,
    the model runs as onnxruntime's dynamic int8 export (see :mod:`.onnx.bert`); otherwise
    transformers runs it.
    """
    import torch

    from condsearch.model.encoders.bert import BertStyleEncoder
    from condsearch.model.encoders.runtime import parse_devices, resolve_dtype
    from condsearch.model.encoders.spec import EncoderSpec

    spec = spec or EncoderSpec()
    adapter = (profile or spec.resolve_profile()).adapter
    max_length, dtype, preset = spec.max_length, spec.dtype, spec.preset
    # the preset and the adapter fill what the spec leaves unset
    pooling, prompt_template, unconditional_template = spec.pooling, spec.prompt_template, spec.unconditional_template
    bidirectional_layers = spec.bidirectional_layers
    device, threads, trust_remote_code = spec.runtime.device, spec.runtime.threads, spec.runtime.trust_remote_code

    if preset is not None or adapter is not None:
        if preset is not None and preset not in PRESETS:
            raise ModelError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
        # what is left unset comes from the preset, else from what the adapter was trained with
        given: dict[str, Any] = {}
        if preset is not None:
            chosen_preset = PRESETS[preset]
            given = {
                "pooling": chosen_preset.pooling,
                "prompt_template": chosen_preset.templates.conditional,
                "unconditional_template": chosen_preset.templates.unconditional,
                "bidirectional_layers": chosen_preset.attention.bidirectional_layers,
            }
        trained = _adapter_settings(adapter) if adapter is not None else {}
        if pooling == "auto":
            pooling = given.get("pooling") or trained.get("pooling") or "auto"
        prompt_template = prompt_template or given.get("prompt_template") or trained.get("prompt_template")
        unconditional_template = (
            unconditional_template or given.get("unconditional_template") or trained.get("unconditional_template")
        )
        if bidirectional_layers is None:
            bidirectional_layers = given.get("bidirectional_layers", trained.get("bidirectional_layers"))
    n_bidirectional = DecoderAttention(
        DecoderAttention.bidirectional_layers if bidirectional_layers is None else bidirectional_layers
    ).bidirectional_layers
    if pooling not in POOLINGS:
        raise ModelError(f"unknown pooling {pooling!r} (choose from {', '.join(POOLINGS)})")
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r} (choose from {', '.join(DTYPES)})")
    quantize = check_quantize(spec.quantize)
    apply_threads(threads)
    source = resolve_model(spec.model)
    config = model_config(source)
    family = detect_family(config)
    chosen = default_pooling(family, config) if pooling == "auto" else pooling
    devices = parse_devices("cpu" if quantize == "int8" and device is None else device)
    if quantize == "int8":
        if family != "bert" or chosen != "condition-mean":
            raise ModelError("--quantize int8 applies to BERT-style encoders with condition-mean pooling")
        if dtype not in ("auto", "float32") or any(d.type != "cpu" for d in devices):
            raise ModelError("--quantize int8 runs on the CPU from float32 weights; drop --device and --dtype")
    custom = prompt_template is not None or unconditional_template is not None
    if adapter is not None and (family == "nvembed" or (family == "bert" and chosen != "condition-mean")):
        raise ModelError("LoRA adapters apply to BERT-style encoders with condition-mean pooling, or to decoders")
    if n_bidirectional and family != "decoder":
        raise ModelError("--bidirectional-layers applies to decoder embedders; this model attends both ways already")
    build: Callable[[torch.device], Encoder]
    if family == "nvembed":
        if pooling != "auto":
            raise ModelError("NV-Embed pools with its own latent attention; leave --pooling at auto")
        templates = templates_with(family, prompt_template, unconditional_template)

        def build(dev: torch.device) -> Encoder:
            from condsearch.model.encoders.nvembed import NVEmbedEncoder

            return NVEmbedEncoder(
                source,
                config,
                templates=templates,
                device=dev,
                dtype=resolve_dtype(dtype, dev),
                max_length=max_length,
                trust_remote_code=trust_remote_code,
            )

    elif chosen == "condition-mean":
        if family != "bert":
            raise ModelError(f"condition-mean pooling needs a BERT-style encoder; {source.model_id} takes last or mean")
        if custom:
            raise ModelError("prompt templates need --pooling last or mean; condition-mean encodes the text pair")

        def build(dev: torch.device) -> Encoder:
            if quantize == "int8":
                from condsearch.model.encoders.onnx.bert import load_int8_encoder

                return load_int8_encoder(source, max_length=max_length, adapter=adapter, threads=threads)
            encoder = BertStyleEncoder(
                source,
                device=str(dev),
                max_length=max_length,
                trust_remote_code=trust_remote_code,
                dtype="auto" if dtype == "auto" else resolve_dtype(dtype, dev),
            )
            if adapter is not None:
                from condsearch.model.encoders.lora import apply_adapter

                apply_adapter(encoder, adapter)
            return encoder

    else:
        templates = templates_with(family, prompt_template, unconditional_template)

        def build(dev: torch.device) -> Encoder:
            from condsearch.model.encoders.decoder import PromptEncoder

            # BERT-style models stay in float32 under auto, as they always were.
            resolved = torch.float32 if family == "bert" and dtype == "auto" else resolve_dtype(dtype, dev)
            encoder = PromptEncoder(
                source,
                config,
                family=family,
                pooling="last" if chosen == "last" else "prompt-last" if chosen == "prompt-last" else "mean",
                templates=templates,
                device=dev,
                dtype=resolved,
                max_length=max_length,
                trust_remote_code=trust_remote_code,
                bidirectional_layers=n_bidirectional,
            )
            if adapter is not None:
                from condsearch.model.encoders.lora import apply_adapter

                apply_adapter(encoder, adapter)
            return encoder

    replicas = [build(dev) for dev in devices]
    if len(replicas) == 1:
        return replicas[0]
    from condsearch.model.encoders.parallel import ReplicatedEncoder

    return ReplicatedEncoder(replicas)


__all__ = [
    "BACKEND_CHOICES",
    "DTYPES",
    "ENCODE_BATCH_SIZE",
    "POOLINGS",
    "PRESETS",
    "QUANTIZE_AUTO",
    "QUANTIZE_CHOICES",
    "Backend",
    "BertStyleEncoder",
    "CpuConfig",
    "DecoderAttention",
    "EncodeStats",
    "Encoder",
    "EncoderSpec",
    "Pair",
    "PromptTemplates",
    "Quantize",
    "Runtime",
    "available_cores",
    "check_quantize",
    "load_encoder",
    "model_config",
    "model_family",
    "passive_waits",
]
