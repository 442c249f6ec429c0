"""One-shot queries without torch: the model an index was built with, run by onnxruntime from its checked export.

For a few texts on the CPU, ``import torch`` alone costs more than their forward pass. This
applies to router (csr) indexes whose condition's code is in the query cache and whose router
export is cached and checked (:mod:`condsearch.model.csr.one_shot`; a query under one condition only),
and to CASE indexes of a BERT-style model (condition-mean pooling) whose ONNX export an
earlier query wrote and checked against torch (:func:`cache_onnx_export`; int8 indexes use their
int8 export), and only when the model revision, adapter and head are those the index records.
:func:`condsearch.model.policy.vectorizer_for` tries it first when asked (``one_shot``), and loads
torch otherwise. The same test, on what an index records (a manifest) or would record (a
:class:`ModelIdentity` of a vectorizer about to build one), decides where the server and bulk
indexing run onnxruntime (:mod:`condsearch.model.policy`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from condsearch.base.cpu_kind import AUTO_DTYPE_KEY
from condsearch.base.model_sources import ModelSource, resolve_model
from condsearch.errors import CondsearchError, first_line
from condsearch.model.artifacts.heads import head_checksum
from condsearch.model.artifacts.profiles import MODE_CASE, MODE_CSR, Profile
from condsearch.model.head_files import load_numpy_head
from condsearch.model.identity import ModelIdentity
from condsearch.model.vectorizer import Vectorizer, record_adapter

if TYPE_CHECKING:
    from condsearch.model.encoders.onnx.cache import Precision
    from condsearch.store.manifest import Manifest

log = logging.getLogger(__name__)

#: onnxruntime's threads for a one-shot query: waking more for a few short inputs costs more than they save
ONE_SHOT_THREADS = 1


def _record(source: Manifest | ModelIdentity) -> ModelIdentity:
    return source if isinstance(source, ModelIdentity) else ModelIdentity.of_manifest(source)


@dataclass(frozen=True)
class _OneShot:
    """What a torch-free one-shot query of an index runs: its model and profile (adapter, head), as recorded."""

    source: ModelSource
    precision: Precision
    profile: Profile
    max_length: int | None

    @property
    def adapter(self) -> Path | None:
        return self.profile.adapter


def _one_shot(record: ModelIdentity) -> _OneShot | None:
    described = record.encoder
    if record.mode != MODE_CASE or described.get("pooling") != "condition-mean" or "dtype" in described:
        return None
    source = resolve_model(record.model_id)
    if source.revision != record.model_revision:
        return None
    profile = record.encoder_spec.resolve_profile()
    max_length = described.get("max_length")
    precision: Precision = "int8" if described.get("quantize") == "int8" else "float32"
    return _OneShot(source, precision, profile, max_length if isinstance(max_length, int) else None)


def load_one_shot(
    manifest: Manifest | ModelIdentity,
    *,
    threads: int | None = None,
    condition: str | None = None,
    plain: bool = False,
) -> Vectorizer | None:
    """Return the model and head an index was built with, run by onnxruntime, or None where that cannot be.

    ``threads``: onnxruntime's intra-op threads [default: one, as a few short inputs need no more];
    ``condition``: the one condition it will encode under, which a router index needs (its code cached);
    ``plain``: a router index built in bfloat16 on its router's plain copy instead, torch without
    transformers (:mod:`condsearch.model.csr.plain_copy`; a re-index).
    """
    from condsearch.model.encoders.onnx.bert import load_cached_export

    try:
        record = _record(manifest)
        if record.mode == MODE_CSR:
            if condition is None:
                return None
            return _load_router(record, condition, threads or ONE_SHOT_THREADS, plain=plain)
        target = _one_shot(record)
        if target is None:
            return None
        encoder = load_cached_export(
            target.source,
            target.precision,
            max_length=target.max_length,
            adapter=target.adapter,
            threads=threads or ONE_SHOT_THREADS,
        )
        if encoder is None:
            return None
        record_adapter(encoder, target.profile.separate_adapter)
        # the same model, adapter and token limit; an index built in the dtype --dtype auto chose for its
        # CPU (bfloat16 on AMX or AVX-512 BF16) is answered in float32 here, within the bound measured
        # (docs/indexing.md)
        if encoder.describe() != {k: v for k, v in record.encoder.items() if k != AUTO_DTYPE_KEY}:
            return None
        head, checksum = None, ""
        if target.profile.head is not None:
            head, checksum = load_numpy_head(target.profile.head), head_checksum(target.profile.head)
            if head.config.input_dim != encoder.dim:
                return None
    except (CondsearchError, OSError):
        return None
    if checksum != record.head_checksum:
        return None
    return Vectorizer(encoder, head, target.profile.name, checksum, profile=target.profile, backend="onnxruntime")


def _load_router(record: ModelIdentity, condition: str, threads: int, *, plain: bool) -> Vectorizer | None:
    from condsearch.model.csr.one_shot import load_one_shot_router

    encoder = load_one_shot_router(
        record.model_id,
        record.model_revision,
        record.encoder,
        record.encoder_spec,
        condition,
        threads=threads,
        plain=plain,
    )
    if encoder is None:
        return None
    profile = record.encoder_spec.resolve_profile()
    backend: Literal["torch", "onnxruntime"] = "torch" if plain else "onnxruntime"
    return Vectorizer(encoder, None, profile.name, "", mode=MODE_CSR, profile=profile, backend=backend)


def _cache_router_export(manifest: Manifest | ModelIdentity, vectorizer: Vectorizer) -> None:
    """Write the float32 export of a trained torch router on the CPU that a one-shot query of the index would use."""
    from condsearch.model.csr.encoder import CsrEncoder
    from condsearch.model.csr.one_shot import router_record

    encoder, record = vectorizer.encoder, _record(manifest)
    if not isinstance(encoder, CsrEncoder) or encoder.backend != "torch" or encoder.device.type != "cpu":
        return
    try:
        if router_record(record.model_id, record.model_revision, record.encoder, record.encoder_spec) is None:
            return
        from condsearch.model.csr.onnx import load_onnx_router

        _, refused = load_onnx_router(encoder, "float32", threads=ONE_SHOT_THREADS)
    except (CondsearchError, OSError) as exc:
        log.warning("one-shot queries of this index will load torch: %s", first_line(exc))
        return
    if refused is not None:
        log.warning("one-shot queries of this index will load torch: its router's ONNX export differs (%s)", refused)


def cache_onnx_export(manifest: Manifest | ModelIdentity, vectorizer: Vectorizer) -> None:
    """Write the float32 ONNX export of the torch encoder an index was just queried with, for the next query.

    For a router index, the router's float32 export (:mod:`condsearch.model.csr.onnx`; the query put the
    condition's code in the query cache). Checked against that encoder before it is marked usable (see
    :mod:`condsearch.model.encoders.onnx.bert`);
    nothing is written where :func:`load_one_shot` would not use it, where it is cached
    already, or where it was refused before. A failure is a warning: the query has its answers.
    """
    from condsearch.model.encoders.bert import BertStyleEncoder

    if _record(manifest).mode == MODE_CSR:
        _cache_router_export(manifest, vectorizer)
        return
    encoder = vectorizer.encoder
    try:
        target = _one_shot(_record(manifest))
        if target is None or target.precision != "float32" or not isinstance(encoder, BertStyleEncoder):
            return
        from condsearch.model.encoders.onnx.bert import cached_refusal, export_folder, read_export, write_export

        folder = export_folder(target.source, target.adapter, "float32")
        if folder is None or cached_refusal(folder) is not None:
            return
        if read_export(folder, target.source, max_length=target.max_length, threads=ONE_SHOT_THREADS) is not None:
            return
        _, refused = write_export(
            encoder, target.source, folder, "float32", max_length=target.max_length, threads=ONE_SHOT_THREADS
        )
    except (CondsearchError, OSError) as exc:
        log.warning("one-shot queries of this index will load torch: %s", first_line(exc))
        return
    if refused is not None:
        log.warning("one-shot queries of this index will load torch: its ONNX export differs (%s)", refused)


def load_onnx_twin(manifest: Manifest | ModelIdentity, vectorizer: Vectorizer, *, threads: int) -> Vectorizer | None:
    """Return the onnxruntime twin of a torch vectorizer of an index's model, or None where a one-shot query has none.

    The export is written and checked first where none is cached (:func:`cache_onnx_export`), as a
    first one-shot query does; ``threads``: onnxruntime's intra-op threads (bulk work takes every core).
    """
    light = load_one_shot(manifest, threads=threads)
    if light is None:
        cache_onnx_export(manifest, vectorizer)
        light = load_one_shot(manifest, threads=threads)
    return light
