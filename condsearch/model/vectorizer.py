"""The vectorizer: an encoder and its head, loaded from an encoder spec or an index.

The spec is :class:`~condsearch.model.encoders.spec.EncoderSpec`.

:func:`load_vectorizer` loads a spec (the CLI's flags, the Python API's arguments, Ray's actors);
:func:`condsearch.model.policy.vectorizer_for` loads what an index was built with and refuses anything
else (another model, revision, quantisation, adapter, head or router). They are the only two ways to
one, and both are the implementation of :func:`condsearch.model.loader.load_model_for`, which every
caller outside this package goes through (``"plain"``; its other purposes build on them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from condsearch.base.faiss_indexes import normalize
from condsearch.base.model_sources import resolve_model
from condsearch.errors import ModelError
from condsearch.model.artifacts.adapters import adapter_checksum
from condsearch.model.artifacts.heads import check_head, head_checksum
from condsearch.model.artifacts.profiles import MODE_CASE, MODE_CSR, Profile, resolve_profile
from condsearch.model.encoders.base import ENCODE_BATCH_SIZE, ConditionalEncoder, Encoder
from condsearch.model.encoders.spec import EncoderSpec

if TYPE_CHECKING:
    from condsearch.model.head import ProjectionHead
    from condsearch.model.head_files import NumpyHead

log = logging.getLogger(__name__)


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
    #: what runs the encoder: torch, or onnxruntime from a checked export (see :mod:`condsearch.model.one_shot`)
    backend: Literal["torch", "onnxruntime"] = "torch"

    @property
    def dim(self) -> int:
        return self.head.config.dim if self.head is not None else self.encoder.dim

    @property
    def spec(self) -> EncoderSpec:
        """Return the spec that loads this vectorizer again (every ``auto`` resolved): what a manifest stores."""
        return EncoderSpec.recorded(self.encoder.describe(), self.mode, self.profile_name)

    def serving(self) -> Vectorizer:
        """Return this vectorizer, its encoder now keeping recent conditions' own vectors (CASE's second pass),
        or (a router) keeping what requests make in memory only (:meth:`condsearch.model.csr.encoder.CsrEncoder.serve`).

        For a model that answers queries with fixed weights (the server, a Python API store).
        """
        if isinstance(self.encoder, Encoder):
            self.encoder.remember_conditions()
        serve = getattr(self.encoder, "serve", None)
        if callable(serve):
            serve()
        return self

    def encode(
        self, texts: Sequence[str], condition: str, *, batch_size: int = ENCODE_BATCH_SIZE, progress: bool = False
    ) -> np.ndarray:
        """Return condition-aware vectors of texts: (n, dim) float32, unit length."""
        raw = self.encoder.encode(texts, condition, batch_size=batch_size, progress=progress)
        notice = self.encoder.report_truncation()
        if notice:
            log.warning(notice)
        projected = self.head.project(raw) if self.head is not None else raw
        return normalize(projected)


def head_folder(spec: str | None, model_id: str) -> Path | None:
    """Return the folder a --head value names for a model (None for 'none'), as before --profile."""
    profile = resolve_profile(model_id, head=spec)
    return profile.head or profile.adapter


def record_adapter(encoder: Encoder, path: str | None) -> None:
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
        from condsearch.model.head import load_head

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


def load_vectorizer(spec: EncoderSpec | None = None) -> Vectorizer:
    """Load the spec's encoder with its profile's adapter and head (case), or its router (csr)."""
    spec = spec or EncoderSpec()
    chosen = spec.resolve_profile()  # before any model loads: conflicting flags are refused first
    if spec.revision is not None and resolve_model(spec.model).revision != spec.revision:
        raise ModelError(f"{spec.model} no longer resolves to revision {spec.revision}")
    run = spec.runtime
    if spec.mode == MODE_CSR:
        from condsearch.model.csr import load_csr_encoder
        from condsearch.model.encoders.cpu import apply_threads

        apply_threads(run.threads)
        router = load_csr_encoder(
            spec.model,
            router=str(chosen.router) if chosen.router is not None else "none",
            layer=spec.router_layer,
            variant=spec.router_variant,
            device=run.device,
            max_length=spec.max_length,
            trust_remote_code=run.trust_remote_code,
            quantize=spec.quantize,
            threads=run.threads,
        )
        return Vectorizer(router, None, chosen.name, "", mode=MODE_CSR, profile=chosen)
    from condsearch.model.encoders import load_encoder

    encoder = load_encoder(spec, profile=chosen)
    record_adapter(encoder, chosen.separate_adapter)
    head, checksum = load_profile_head(chosen, encoder)
    return Vectorizer(encoder, head, chosen.name, checksum, profile=chosen)
