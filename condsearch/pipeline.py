"""The main job: corpus -> condition-aware vectors -> stored indexes -> ranked results."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from condsearch.ann import AUTO, check_factory
from condsearch.artifacts.adapters import adapter_checksum
from condsearch.artifacts.heads import check_head, head_checksum
from condsearch.artifacts.profiles import (
    MODE_CASE,
    MODE_CSR,
    PROFILE_AUTO,
    PROFILE_DEFAULT,
    PROFILE_FROZEN,
    PROFILE_NONE,
    SHIPPED_PROFILES,
    Profile,
    profile_of_index,
    recorded_profile,
    resolve_profile,
)
from condsearch.encoders import Encoder, encoder_options, load_encoder
from condsearch.encoders.base import ENCODE_BATCH_SIZE, ConditionalEncoder
from condsearch.encoders.cpu import CpuConfig
from condsearch.errors import CondsearchError, ModelError, StoreError, first_line
from condsearch.head_files import NumpyHead, load_numpy_head
from condsearch.index import DEFAULT_FACTORY, SearchResult, normalize
from condsearch.ingest import BuildReport, CorpusSource, build_condition_index
from condsearch.models import ModelSource, resolve_model
from condsearch.search import check_condition  # re-exported: index and query check conditions alike
from condsearch.store import IndexStore, Manifest, StoredIndex

if TYPE_CHECKING:
    from condsearch.encoders.onnx_files import Precision
    from condsearch.head import ProjectionHead

log = logging.getLogger(__name__)

#: the --head names of before --profile, kept as aliases (benchmarks use them)
HEAD_AUTO, HEAD_NONE, HEAD_DEFAULT, HEAD_FROZEN = PROFILE_AUTO, PROFILE_NONE, PROFILE_DEFAULT, PROFILE_FROZEN
SHIPPED_HEADS = SHIPPED_PROFILES


@dataclass(frozen=True)
class Vectorizer:
    """An encoder and an optional head: text under a condition -> unit vector."""

    encoder: ConditionalEncoder
    head: ProjectionHead | NumpyHead | None
    #: the profile, as the manifest records it (its ``head`` field): "none", a shipped profile's name or a
    #: folder's absolute path
    profile_name: str
    head_checksum: str
    mode: str = MODE_CASE
    profile: Profile | None = None  # the adapter, head or router folders it was loaded from

    @property
    def dim(self) -> int:
        return self.head.config.dim if self.head is not None else self.encoder.dim

    def vectors(
        self, texts: Sequence[str], condition: str, *, batch_size: int = ENCODE_BATCH_SIZE, progress: bool = False
    ) -> np.ndarray:
        """Return condition-aware vectors of texts: (n, dim) float32, unit length."""
        raw = self.encoder.encode_conditional(texts, condition, batch_size=batch_size, progress=progress)
        notice = self.encoder.report_truncation()
        if notice:
            log.warning(notice)
        projected = self.head.project(raw) if self.head is not None else raw
        return normalize(projected)


def head_folder(spec: str | None, model_id: str) -> Path | None:
    """Return the folder a --head value names for a model (None for 'none'), as before --profile."""
    profile = resolve_profile(model_id, head=spec)
    return profile.head or profile.adapter


def _record_adapter(encoder: Encoder, path: str | None) -> None:
    """Record an adapter named apart from the profile in the encoder's describe(), so the manifest holds it."""
    for e in (encoder, *getattr(encoder, "replicas", ())):
        e.adapter_path = path or ""


def load_profile_head(profile: Profile, encoder: Encoder) -> tuple[ProjectionHead | None, str]:
    """Return (head, checksum) of a profile after checking that it fits the encoder and the encoder its adapter.

    The encoder must have been loaded with the profile's adapter (:func:`load_vectorizer` does so).
    A profile without a head gives none: the (adapted) encoder's raw CASE vectors are used.
    """
    head, checksum, described = None, "", encoder.describe()
    if profile.head is not None:
        from condsearch.head import load_head

        head, checksum = load_head(profile.head), head_checksum(profile.head)
        check_head(head.config, profile.name, described)
    carried = described.get("adapter_checksum")
    if profile.adapter is not None and carried != adapter_checksum(profile.adapter):
        raise ModelError(f"head {profile.name!r} carries an adapter that the encoder was not loaded with")
    if carried and profile.adapter is None:
        raise ModelError(f"head {profile.name!r} was trained without the adapter this encoder carries")
    return head, checksum


def resolve_head(spec: str | None, encoder: Encoder) -> tuple[ProjectionHead | None, str, str]:
    """Return (head, name, checksum) for a --head value, checked against the encoder (:func:`load_profile_head`)."""
    profile = resolve_profile(encoder.model_id, head=spec)
    head, checksum = load_profile_head(profile, encoder)
    return head, profile.name, checksum


def load_vectorizer(
    model: str | None = None,
    head: str | None = None,
    *,
    adapter: str | Path | None = None,
    profile: str | Profile | None = None,
    device: str | None = None,
    max_length: int | None = None,
    trust_remote_code: bool = False,
    pooling: str = "auto",
    prompt_template: str | None = None,
    unconditional_template: str | None = None,
    dtype: str = "auto",
    bidirectional_layers: int | None = None,
    preset: str | None = None,
    inference: bool = False,
    quantize: str = CpuConfig.quantize,
    threads: int | None = CpuConfig.threads,
) -> Vectorizer:
    """Load the encoder with the profile's adapter, and its head: --model with --profile, or --head and --adapter.

    ``profile`` is a name, a folder or a resolved :class:`Profile`; ``bidirectional_layers``,
    ``preset``, ``inference``, ``quantize`` and ``threads`` are :func:`condsearch.encoders.load_encoder`'s.
    """
    chosen = (
        profile if isinstance(profile, Profile) else resolve_profile(model, profile=profile, head=head, adapter=adapter)
    )
    encoder = load_encoder(
        model,
        device=device,
        max_length=max_length,
        trust_remote_code=trust_remote_code,
        pooling=pooling,
        prompt_template=prompt_template,
        unconditional_template=unconditional_template,
        dtype=dtype,
        adapter=chosen.adapter,
        bidirectional_layers=bidirectional_layers,
        preset=preset,
        inference=inference,
        quantize=quantize,
        threads=threads,
    )
    _record_adapter(encoder, chosen.separate_adapter)
    h, checksum = load_profile_head(chosen, encoder)
    return Vectorizer(encoder, h, chosen.name, checksum, profile=chosen)


def load_csr_vectorizer(
    model: str | None = None,
    head: str | None = None,
    *,
    adapter: str | Path | None = None,
    profile: str | None = None,
    router: str | None = None,
    router_layer: int | None = None,
    router_variant: str | None = None,
    device: str | None = None,
    max_length: int | None = None,
    trust_remote_code: bool = False,
) -> Vectorizer:
    """Load the router tri-encoder (--mode csr); its vectors are used without a head or adapter."""
    chosen = resolve_profile(model, head=head, adapter=adapter, profile=profile, router=router, mode=MODE_CSR)
    from condsearch.csr import load_csr_encoder

    encoder = load_csr_encoder(
        model,
        router=str(chosen.router) if chosen.router is not None else "none",
        layer=router_layer,
        variant=router_variant,
        device=device,
        max_length=max_length,
        trust_remote_code=trust_remote_code,
    )
    return Vectorizer(encoder, None, HEAD_NONE, "", mode=MODE_CSR, profile=chosen)


def load_mode_vectorizer(mode: str, **options: Any) -> Vectorizer:
    """Load the vectorizer of an index mode: :func:`load_csr_vectorizer` for csr, else :func:`load_vectorizer`."""
    loader = load_csr_vectorizer if mode == MODE_CSR else load_vectorizer
    return loader(**options)  # type: ignore[operator]


def index_corpus(
    corpus: CorpusSource,
    conditions: Sequence[str],
    vectorizer: Vectorizer,
    store: IndexStore,
    *,
    corpus_name: str,
    factory: str = DEFAULT_FACTORY,
    batch_size: int = ENCODE_BATCH_SIZE,
    progress: bool = False,
    **build: Any,
) -> list[str]:
    """Encode the corpus under each condition and write one index each; return their names.

    ``build`` takes :func:`condsearch.ingest.build_condition_index`'s options (search_params,
    max_index_memory, full, chunk_rows).
    """
    reports = index_conditions(
        corpus,
        conditions,
        vectorizer,
        store,
        corpus_name=corpus_name,
        factory=factory,
        batch_size=batch_size,
        progress=progress,
        **build,
    )
    return [r.name for r in reports]


def index_conditions(
    corpus: CorpusSource, conditions: Sequence[str], vectorizer: Vectorizer, store: IndexStore, **build: Any
) -> list[BuildReport]:
    """Index the corpus under each distinct condition (streamed, incremental, resumable); return what each did."""
    conditions = list(dict.fromkeys(check_condition(c) for c in conditions))
    factory = build.get("factory", DEFAULT_FACTORY)
    if factory != AUTO:  # before FAISS sees it: some factory strings end the process inside FAISS
        try:
            check_factory(factory, len(corpus), vectorizer.dim)
        except ValueError as exc:
            raise CondsearchError(str(exc)) from exc
    return [build_condition_index(corpus, c, vectorizer, store, **build) for c in conditions]


def vectorizer_for(
    manifest: Manifest,
    model: str | None = None,
    head: str | None = None,
    *,
    device: str | None = None,
    trust_remote_code: bool = False,
    quantize: str | None = None,
    threads: int | None = CpuConfig.threads,
) -> Vectorizer:
    """Load the model and head an index was built with, refusing any other.

    ``quantize``: None loads the quantisation the index records; another value than the recorded one
    is refused (int8 query vectors against a float32 index, or the reverse, are never mixed).
    """
    built_with = str(manifest.encoder.get("quantize", "none"))  # absent: float32, as before int8 existed
    if quantize is not None and quantize != built_with:
        raise StoreError(
            f"index for {manifest.condition!r} was built with --quantize {built_with}, not {quantize}; "
            "re-index or drop --quantize"
        )
    wanted = resolve_model(model or manifest.model_id)
    if wanted.model_id != manifest.model_id:
        raise StoreError(
            f"index for {manifest.condition!r} was built with model {manifest.model_id}, "
            f"not {wanted.model_id}; re-index or drop --model"
        )
    if wanted.revision != manifest.model_revision:
        raise StoreError(
            f"index for {manifest.condition!r} was built with {manifest.model_id} at "
            f"{manifest.model_revision}, but it now resolves to {wanted.revision}; re-index"
        )
    if manifest.mode == MODE_CSR:
        return _csr_vectorizer_for(manifest, model, head, device=device, trust_remote_code=trust_remote_code)
    if manifest.mode != MODE_CASE:
        raise StoreError(f"index for {manifest.condition!r} has unknown mode {manifest.mode!r}")
    # Pooling, prompts, max_length and dtype as recorded by the encoder's describe().
    profile = profile_of_index(manifest.model_id, manifest.head, manifest.encoder, manifest.mode, asked=head)
    vec = load_vectorizer(
        model or manifest.model_id,
        profile=profile,
        device=device,
        trust_remote_code=trust_remote_code,
        inference=True,
        threads=threads,
        **encoder_options(manifest.encoder),
    )
    described = vec.encoder.describe()
    # An is_causal: false config attends both ways whatever is asked, so an index built before that
    # was honoured (recording no bidirectional layers) cannot be rebuilt: refuse, never mix spaces.
    built, rebuilt = manifest.encoder.get("bidirectional_layers", 0), described.get("bidirectional_layers", 0)
    if built != rebuilt:
        raise StoreError(
            f"index for {manifest.condition!r} was built with {built} bidirectional top layer(s), but "
            f"{manifest.model_id} now loads with {rebuilt}; re-index"
        )
    recorded, loaded = manifest.encoder.get("adapter_checksum"), described.get("adapter_checksum")
    if recorded != loaded:
        raise StoreError(
            f"index for {manifest.condition!r} was built with adapter sha256 {str(recorded or '-')[:12]}, "
            f"but head {vec.profile_name} gives {str(loaded or '-')[:12]}; re-index or drop --head"
        )
    built_with = recorded_profile(manifest.head)
    if vec.profile_name != built_with or vec.head_checksum != manifest.head_checksum:
        raise StoreError(
            f"index for {manifest.condition!r} was built with head {built_with} "
            f"(sha256 {manifest.head_checksum[:12] or '-'}), not {vec.profile_name} "
            f"(sha256 {vec.head_checksum[:12] or '-'}); re-index or drop --head"
        )
    return vec


def _csr_vectorizer_for(
    manifest: Manifest, model: str | None, head: str | None, *, device: str | None, trust_remote_code: bool
) -> Vectorizer:
    recorded = manifest.encoder
    layer, max_length = recorded.get("router_layer"), recorded.get("max_length")
    variant = recorded.get("router_variant")
    vec = load_csr_vectorizer(
        model or manifest.model_id,
        head,
        router=str(recorded.get("router") or PROFILE_NONE),
        router_layer=layer if isinstance(layer, int) else None,
        router_variant=variant if isinstance(variant, str) else None,
        device=device,
        max_length=max_length if isinstance(max_length, int) else None,
        trust_remote_code=trust_remote_code,
    )
    if vec.encoder.describe().get("router_checksum") != recorded.get("router_checksum"):
        raise StoreError(
            f"index for {manifest.condition!r} was built with router {recorded.get('router')} "
            f"(sha256 {str(recorded.get('router_checksum'))[:12] or '-'}), which has changed since; re-index"
        )
    return vec


#: onnxruntime's threads for a one-shot query: waking more for a few short inputs costs more than they save
ONE_SHOT_THREADS = 1


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


def _one_shot(manifest: Manifest) -> _OneShot | None:
    described = manifest.encoder
    if manifest.mode != MODE_CASE or described.get("pooling") != "condition-mean" or "dtype" in described:
        return None
    source = resolve_model(manifest.model_id)
    if source.revision != manifest.model_revision:
        return None
    profile = profile_of_index(manifest.model_id, manifest.head, described, manifest.mode)
    max_length = described.get("max_length")
    precision: Precision = "int8" if described.get("quantize") == "int8" else "float32"
    return _OneShot(source, precision, profile, max_length if isinstance(max_length, int) else None)


def onnx_vectorizer_for(manifest: Manifest, *, threads: int | None = None) -> Vectorizer | None:
    """Return the model and head an index was built with, run by onnxruntime, or None where that cannot be.

    For a one-shot query of a few texts on the CPU: ``import torch`` alone costs more than their
    forward pass. It applies to CASE indexes of a BERT-style model (condition-mean pooling)
    whose ONNX export an earlier query wrote and checked against torch (see
    :func:`cache_onnx_export`; int8 indexes use their int8 export), and only when the model
    revision, adapter and head are those the index records. Otherwise it returns None, and
    :func:`vectorizer_for` loads the model with torch (or says why the index cannot be queried).
    ``threads``: onnxruntime's intra-op threads [default: one, as a few short inputs need no more].
    """
    from condsearch.encoders.onnx_files import load_cached_export

    try:
        target = _one_shot(manifest)
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
        _record_adapter(encoder, target.profile.separate_adapter)
        if encoder.describe() != manifest.encoder:  # the same model, adapter and token limit
            return None
        head, checksum = None, ""
        if target.profile.head is not None:
            head, checksum = load_numpy_head(target.profile.head), head_checksum(target.profile.head)
            if head.config.input_dim != encoder.dim:
                return None
    except (CondsearchError, OSError):
        return None
    if checksum != manifest.head_checksum:
        return None
    return Vectorizer(encoder, head, target.profile.name, checksum, profile=target.profile)


def cache_onnx_export(manifest: Manifest, vectorizer: Vectorizer) -> None:
    """Write the float32 ONNX export of the torch encoder an index was just queried with, for the next query.

    Checked against that encoder before it is marked usable (see :mod:`condsearch.encoders.onnx_export`);
    nothing is written where :func:`onnx_vectorizer_for` would not use it, where it is cached
    already, or where it was refused before. A failure is a warning: the query has its answers.
    """
    from condsearch.encoders.bert import BertStyleEncoder

    encoder = vectorizer.encoder
    try:
        target = _one_shot(manifest)
        if target is None or target.precision != "float32" or not isinstance(encoder, BertStyleEncoder):
            return
        from condsearch.encoders.onnx_export import write_export
        from condsearch.encoders.onnx_files import export_folder, read_export, refusal

        folder = export_folder(target.source, target.adapter, "float32")
        if folder is None or refusal(folder) is not None:
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


def query_index(
    stored: StoredIndex,
    vectorizer: Vectorizer,
    queries: Sequence[str],
    k: int,
    *,
    on_device: bool = True,
) -> SearchResult:
    """Rank the stored rows for each query under the index's condition, as :func:`condsearch.search.answer` does.

    Returns the batched arrays: scores, ids (n_queries, min(k, rows)), ids being row numbers. A k
    larger than the index returns every row. ``on_device``: search on the GPU where there is one;
    False searches the index where it is (the CPU), without importing torch to ask.
    """
    from condsearch.search import FaissIndex, answer

    return answer(FaissIndex.of(stored, on_device=on_device), vectorizer, queries, k).result
