"""What runs a model for bulk work, the server's and `condsearch index`'s: onnxruntime or torch.

The implementation of :func:`condsearch.model.loader.load_model_for`'s purposes ``bulk``
(:func:`load_bulk_vectorizer`), ``resident`` (:func:`load_index_model`) and, with ``one_shot``
and ``plain`` given a manifest, :func:`vectorizer_for`; callers outside this package go through the loader.

``auto`` (:data:`condsearch.model.encoders.cpu.Backend`) on the CPU runs the model on onnxruntime from
its checked float32 ONNX export wherever a one-shot query of the index runs it (see
:mod:`condsearch.model.one_shot`: BERT-style, condition-mean pooling, the recorded adapter and head), with
every core, except on a CPU kind where torch measured faster, for bulk work or for serving (in the
bfloat16 that ``--dtype auto`` chooses there: :mod:`condsearch.base.cpu_kind`); the router (CSR) runs its two
passes on its checked float32 export where that measured faster than torch
(:data:`condsearch.model.csr.onnx.FASTER_ON_ONNX`), but in torch bfloat16 for bulk work on a CPU kind
where that measured faster still. Otherwise (``torch``, CUDA, another kind of model or
pooling, a ``dtype``, a refused export) transformers (torch) runs it. An int8
encoder is its int8 export either way.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from condsearch.base.model_sources import resolve_model
from condsearch.errors import CondsearchError, StoreError
from condsearch.model.artifacts.profiles import MODE_CASE, MODE_CSR, recorded_profile
from condsearch.model.encoders.cpu import Backend, CpuConfig, available_cores
from condsearch.model.encoders.spec import EncoderSpec, Runtime

if TYPE_CHECKING:
    from condsearch.model.vectorizer import Vectorizer
    from condsearch.store.manifest import Manifest

log = logging.getLogger(__name__)


def runs_on_cpu(device: str | None) -> bool:
    """Return whether models asked for on device run on the CPU (None: CUDA when present, as everywhere else)."""
    if device is not None:
        return device == "cpu"
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return True
    import torch

    return not torch.cuda.is_available()


def onnx_allowed(backend: Backend, device: str | None) -> bool:
    """Return whether ``backend`` lets onnxruntime run a float32 model asked for on ``device``."""
    return backend == "auto" and runs_on_cpu(device)


def case_onnx_allowed(backend: Backend, device: str | None, *, serving: bool = False) -> bool:
    """Return whether ``backend`` runs a float32 CASE model on onnxruntime on ``device``: ``auto`` on the CPU, where
    the CPU kind's measured path is onnxruntime, for bulk encoding or ``serving``
    (:data:`condsearch.base.cpu_kind.PATHS`: torch bfloat16 indexes on AMX and AVX-512 BF16 CPUs, and
    serves on AMX).
    """
    from condsearch.base.cpu_kind import auto_case_runner

    return onnx_allowed(backend, device) and auto_case_runner(serving=serving) == "onnxruntime"


def backend_of(vec: Vectorizer) -> str:
    """Return what runs a vectorizer's encoder: onnxruntime or torch (an int8 index's encoder is onnxruntime)."""
    from condsearch.model.encoders.onnx.bert import OnnxBertEncoder

    if vec.backend == "onnxruntime" or isinstance(vec.encoder, OnnxBertEncoder):
        return "onnxruntime"
    return "onnxruntime" if getattr(vec.encoder, "backend", "torch") == "onnxruntime" else "torch"  # the router's


def _router_path(
    vec: Vectorizer, backend: Backend, device: str | None, threads: int | None, *, serving: bool = False
) -> Vectorizer:
    """Run a float32 torch router's passes as ``auto`` measured fastest on this CPU, where ``backend`` allows it.

    Its checked float32 export where that is faster than torch (the export is written even where bulk
    work then runs in bfloat16, so that one-shot queries find it); for bulk work, on a CPU kind whose
    measured router path is bfloat16, torch under bfloat16 autocast
    (:data:`condsearch.base.cpu_kind.PATHS`), its plain copy written and checked for later re-indexes
    (:mod:`condsearch.model.csr.plain_copy`). A long-running reader (``serving``) keeps the export.
    """
    from condsearch.base.cpu_kind import auto_router_dtype
    from condsearch.model.csr.encoder import CsrEncoder
    from condsearch.model.csr.onnx import FASTER_ON_ONNX

    encoder = vec.encoder
    if not isinstance(encoder, CsrEncoder) or encoder.backend != "torch" or not onnx_allowed(backend, device):
        return vec
    exported = encoder.variant in FASTER_ON_ONNX and encoder.use_onnx("float32", threads=threads or available_cores())
    if not serving and auto_router_dtype() == "bfloat16" and encoder.use_bfloat16():
        from condsearch.model.csr.plain_copy import cache_plain_copy

        cache_plain_copy(encoder)  # so that a re-index of what this builds runs the same path without transformers
        log.info("routing in torch bfloat16, this CPU kind's measured path")
    elif exported:
        log.info("routing on onnxruntime, from the router's checked float32 export")
    return vec


def resolve_quantize(quantize: str, mode: str, device: str | None) -> str:
    """Return ``index --quantize``'s value as the index will record it: ``auto`` is int8 where this CPU kind
    measured int8 faster than its float path for ``mode`` (:func:`condsearch.base.cpu_kind.auto_quantize`) and the
    model runs on the CPU, else none; any other value as given."""
    from condsearch.base.cpu_kind import auto_quantize
    from condsearch.model.encoders.cpu import QUANTIZE_AUTO

    if quantize != QUANTIZE_AUTO:
        return quantize
    return auto_quantize(mode) if runs_on_cpu(device) else "none"


#: where the NVIDIA driver lists the GPUs it drives: read instead of importing torch to ask for CUDA
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def load_light_reindex(
    spec: EncoderSpec, manifest: Manifest, condition: str, *, backend: Backend = CpuConfig.backend
) -> Vectorizer | None:
    """Return the model of ``manifest``'s index run by onnxruntime without torch, to re-index it, or None.

    A re-index that changes a few rows paid for importing torch and transformers and loading the model
    (5-8 s on 2 cores) before its first row, more than the rows cost (issue 61). Where what it would
    encode with is what the index records and runs on that export anyway, the index's own model is
    loaded as a one-shot query loads it (:func:`condsearch.model.one_shot.load_one_shot`), on
    ``spec.runtime.threads`` or every core. That is: ``backend`` auto on the CPU (no NVIDIA GPU that
    torch would take); the index in float32 and in the spec's mode; this CPU kind's bulk path for that
    mode the float32 export (:data:`condsearch.base.cpu_kind.PATHS`: onnxruntime for CASE, float32 for the
    router); the spec asking for nothing but the model and profile (or router) the index records, the
    model at the revision recorded; its checked export (and a router's code of ``condition``) cached.
    Where the kind routes in bfloat16 instead (AMX), a router index built so (its precision bfloat16) is
    re-indexed on the router's checked plain copy (:mod:`condsearch.model.csr.plain_copy`): the same bfloat16
    passes in torch, without transformers.
    The vectors' fingerprint is the index's, so its rows are kept as a torch build of the same path keeps
    them. Anything else is None: the caller loads torch.
    """
    from condsearch.base.cpu_kind import auto_case_runner, auto_router_dtype
    from condsearch.model.identity import ModelIdentity
    from condsearch.model.one_shot import load_one_shot

    device = spec.runtime.device
    if backend != "auto" or device not in (None, "cpu") or (device is None and NVIDIA_GPUS.is_dir()):
        return None
    plain = spec.mode == MODE_CSR and auto_router_dtype() == "bfloat16"  # the same passes, on the plain copy
    on_export = auto_router_dtype() == "float32" if spec.mode == MODE_CSR else auto_case_runner() == "onnxruntime"
    if not on_export and not plain:  # this kind builds CASE in torch bfloat16: a re-index must too
        return None
    if manifest.precision != ("bfloat16" if plain else "float32") or manifest.mode != spec.mode:
        return None
    asked = replace(
        EncoderSpec(),
        model=spec.model,
        mode=spec.mode,
        profile=spec.profile,
        head=spec.head,
        adapter=spec.adapter,
        router=spec.router,
        runtime=spec.runtime,
    )
    if spec != asked:  # any other setting: torch resolves what it means
        return None
    record = ModelIdentity.of_manifest(manifest)
    try:
        source = resolve_model(spec.model)
        if (source.model_id, source.revision) != (manifest.model_id, manifest.model_revision):
            return None
        if spec.resolve_profile() != record.encoder_spec.resolve_profile():
            return None
    except CondsearchError:
        return None
    threads = spec.runtime.threads or available_cores()
    light = load_one_shot(manifest, threads=threads, condition=condition, plain=plain)
    if light is None or ModelIdentity.of_vectorizer(light).fingerprint != record.fingerprint:
        return None
    if plain:
        log.info("re-indexing in torch bfloat16 without transformers, from the router's checked plain copy")
    else:
        log.info("re-indexing on onnxruntime without torch, from the index's checked float32 export")
    return light


def load_bulk_vectorizer(spec: EncoderSpec, *, backend: Backend = CpuConfig.backend) -> Vectorizer:
    """Load the spec's vectorizer to encode a corpus with (`condsearch index`), run as ``backend`` asks
    (``load_model_for("bulk", spec)``).

    The spec loads through torch first (:func:`condsearch.model.vectorizer.load_vectorizer`), which
    resolves everything left to ``auto``. Under ``auto`` on the CPU, a CASE model that a one-shot
    query of the index it builds would run on onnxruntime is run so here as well, with
    ``spec.runtime.threads`` or every core (its export written and checked against torch first
    where none is cached), but on a CPU kind whose measured bulk path is torch (AMX and AVX-512 BF16,
    in ``--dtype auto``'s bfloat16, which the encoder record names as ``auto_dtype``); the index
    records the same manifest either way, so the result is the same index up to float32 rounding.
    The router (CSR) runs on its float32 export likewise where that is faster
    (:func:`_router_path`), or in bfloat16 where the CPU kind's measured path says so. Anything else keeps torch.
    """
    from condsearch.model.artifacts.profiles import MODE_CASE, MODE_CSR
    from condsearch.model.vectorizer import load_vectorizer

    vec = load_vectorizer(spec)
    if vec.mode == MODE_CSR:
        return _router_path(vec, backend, spec.runtime.device, spec.runtime.threads)
    if vec.mode != MODE_CASE or backend_of(vec) == "onnxruntime" or not case_onnx_allowed(backend, spec.runtime.device):
        return vec
    from condsearch.model.identity import ModelIdentity
    from condsearch.model.one_shot import load_onnx_twin

    threads = spec.runtime.threads or available_cores()
    identity = ModelIdentity.of_vectorizer(vec)
    light = load_onnx_twin(identity, vec, threads=threads)
    if light is None or ModelIdentity.of_vectorizer(light) != identity:  # never another manifest
        return vec
    log.info("encoding on onnxruntime (%d threads), from the checked float32 export", threads)
    return light


def load_index_model(
    manifest: Manifest, *, runtime: Runtime, backend: Backend = CpuConfig.backend, quantize: str | None = None
) -> Vectorizer:
    """Load the model an index was built with, for a long-running reader: the server and the Python API.

    ``load_model_for("resident", manifest)``: both load an index's model here, so the Python API answers
    exactly as `condsearch serve` does (a one-shot `condsearch query` of a CASE index loads it here too,
    and of a router index takes :func:`vectorizer_for` with ``one_shot``: ``load_model_for("one_shot")``).

    ``auto`` on the CPU: onnxruntime from the model's checked ONNX export where the index allows it
    (:mod:`condsearch.model.one_shot`: BERT-style, condition-mean pooling, the recorded adapter and head) and
    the CPU kind's measured serving path is onnxruntime; on AMX torch in ``--dtype auto``'s bfloat16;
    an export not yet cached is written now from the torch model and checked against it, as a
    first one-shot query does. Otherwise (``torch``, a GPU, another kind of model, a refused
    export) transformers runs it; an int8 index runs its int8 export either way.
    """
    onnx = onnx_allowed(backend, runtime.device)
    if onnx and runtime.threads is None:  # a one-shot query's single thread is no default for a server
        runtime = replace(runtime, threads=available_cores())
    case_onnx = case_onnx_allowed(backend, runtime.device, serving=True)
    vec = vectorizer_for(manifest, quantize=quantize, runtime=runtime, one_shot=case_onnx)
    from condsearch.model.artifacts.profiles import MODE_CSR

    if vec.mode == MODE_CSR:
        return _router_path(vec, backend, runtime.device, runtime.threads, serving=True).serving()
    if case_onnx and vec.backend == "torch":
        from condsearch.model.one_shot import load_onnx_twin

        light = load_onnx_twin(manifest, vec, threads=runtime.threads or available_cores())
        if light is not None:
            return light.serving()
    return vec.serving()


def vectorizer_for(
    manifest: Manifest,
    *,
    model: str | None = None,
    profile: str | None = None,
    quantize: str | None = None,
    runtime: Runtime = Runtime(),  # noqa: B008 - frozen
    one_shot: bool = False,
    one_condition: bool = False,
) -> Vectorizer:
    """Load the model and profile an index was built with, refusing any other.

    ``model`` and ``profile`` (its --head spelling too), given, must be those the index records;
    ``quantize``: None loads the quantisation the index records, another value than the recorded
    one is refused (int8 query vectors against a float32 index, or the reverse, are never mixed).
    ``one_shot``: run the index's model by onnxruntime on the CPU where its checked export allows it
    (:mod:`condsearch.model.one_shot`), without importing torch: a few one-shot queries, and the server.
    ``one_condition``: the vectorizer encodes under the index's condition alone (a one-shot query), so
    that a router index's cached condition code lets it skip torch too (:mod:`condsearch.model.csr.one_shot`).
    """
    if one_shot and model is None and profile is None:
        if quantize is not None:  # the export follows the index; another quantisation is refused first
            _check_model(manifest, model, quantize)
        from condsearch.model.one_shot import load_one_shot

        light = load_one_shot(
            manifest, threads=runtime.threads, condition=manifest.condition if one_condition else None
        )
        if light is not None:
            return light
    _check_model(manifest, model, quantize)
    spec = EncoderSpec.of_manifest(manifest, runtime=runtime)
    if model:
        spec = replace(spec, model=model)
    if profile is not None:  # the adapter named apart stays, as the index recorded it
        spec = replace(spec, profile=None, head=profile)
    from condsearch.model.vectorizer import load_vectorizer

    vec = load_vectorizer(spec)
    _check_loaded(manifest, vec)
    return vec


def _check_model(manifest: Manifest, model: str | None, quantize: str | None) -> None:
    """Refuse, before loading, another quantisation, model or revision than the index's."""
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
    if manifest.mode not in (MODE_CASE, MODE_CSR):
        raise StoreError(f"index for {manifest.condition!r} has unknown mode {manifest.mode!r}")


def _check_loaded(manifest: Manifest, vec: Vectorizer) -> None:
    """Refuse a loaded vectorizer whose router, bidirectional layers, adapter or head differ from the index's."""
    recorded, described = manifest.encoder, vec.encoder.describe()
    if manifest.mode == MODE_CSR:
        if described.get("router_checksum") != recorded.get("router_checksum"):
            raise StoreError(
                f"index for {manifest.condition!r} was built with router {recorded.get('router')} "
                f"(sha256 {str(recorded.get('router_checksum'))[:12] or '-'}), which has changed since; re-index"
            )
        return
    # An is_causal: false config attends both ways whatever is asked, so an index built before that
    # was honoured (recording no bidirectional layers) cannot be rebuilt: refuse, never mix spaces.
    built, rebuilt = recorded.get("bidirectional_layers", 0), described.get("bidirectional_layers", 0)
    if built != rebuilt:
        raise StoreError(
            f"index for {manifest.condition!r} was built with {built} bidirectional top layer(s), but "
            f"{manifest.model_id} now loads with {rebuilt}; re-index"
        )
    recorded_adapter, loaded = recorded.get("adapter_checksum"), described.get("adapter_checksum")
    if recorded_adapter != loaded:
        raise StoreError(
            f"index for {manifest.condition!r} was built with adapter sha256 {str(recorded_adapter or '-')[:12]}, "
            f"but head {vec.profile_name} gives {str(loaded or '-')[:12]}; re-index or drop --head"
        )
    built_with = recorded_profile(manifest.head)
    if vec.profile_name != built_with or vec.head_checksum != manifest.head_checksum:
        raise StoreError(
            f"index for {manifest.condition!r} was built with head {built_with} "
            f"(sha256 {manifest.head_checksum[:12] or '-'}), not {vec.profile_name} "
            f"(sha256 {vec.head_checksum[:12] or '-'}); re-index or drop --head"
        )
