"""The encoder spec: every setting that makes a vector, built once by a front end and saved with each index.

The CLI (or the Python API) builds one :class:`EncoderSpec` from its flags;
:func:`condsearch.model.vectorizer.load_vectorizer` loads it, Ray ships it to its actors, and an index's
manifest stores the spec of what was loaded (:meth:`EncoderSpec.recorded`: every ``auto`` resolved)
as ``spec.to_dict()``, which :func:`condsearch.model.policy.vectorizer_for` loads again. Indexes
written before the manifest held a spec give the same spec from their encoder record
(:meth:`EncoderSpec.of_manifest`). :class:`Runtime` says where and how the spec runs here; it
changes no vector and is never saved.

Free of imports beyond the standard library and the config modules, so that the CLI builds a spec
without loading torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Protocol

from condsearch.errors import StoreError
from condsearch.model.artifacts.profiles import ADAPTER_KEY, MODE_CASE, MODE_CSR, PROFILE_NONE, Mode, recorded_profile
from condsearch.model.encoders.cpu import QUANTIZE_CHOICES, CpuConfig, Quantize
from condsearch.model.encoders.family import DTYPES, POOLINGS, DecoderAttention

if TYPE_CHECKING:
    from condsearch.model.artifacts.profiles import Profile


class Recorded(Protocol):
    """What an index records of its model: a manifest (:class:`condsearch.store.manifest.Manifest`) or its identity."""

    @property
    def spec(self) -> dict[str, object]: ...

    @property
    def encoder(self) -> dict[str, object]: ...

    @property
    def mode(self) -> str: ...

    @property
    def head(self) -> str: ...

    @property
    def model_id(self) -> str: ...

    @property
    def model_revision(self) -> str: ...


@dataclass(frozen=True)
class Runtime:
    """Where and how a spec runs here: the same vectors on any of these (up to float rounding); never saved."""

    #: torch device, e.g. cpu or cuda:0; several (cuda:0,cuda:1) split each batch [default: CUDA when present]
    device: str | None = None
    #: intra-op threads on the CPU
    threads: int | None = CpuConfig.threads
    #: let the model folder's own Python code run
    trust_remote_code: bool = False


@dataclass(frozen=True)
class EncoderSpec:
    """What turns (condition, text) into a vector: model, profile or router, pooling, prompts, limits, dtype.

    ``None`` and ``"auto"`` leave a setting to the model, the preset or the adapter. ``profile``,
    ``head`` and ``adapter`` are the --profile, --head and --adapter flags, resolved together by
    :func:`condsearch.model.artifacts.profiles.resolve_profile`; ``router``, ``router_layer`` and
    ``router_variant`` apply to ``mode="csr"``, the others (but ``max_length``) to ``mode="case"``.
    """

    model: str | None = None  # a model id or folder [default: the default model]
    revision: str | None = None  # set (as a manifest records it): a model that resolves to another is refused
    mode: Mode = MODE_CASE
    profile: str | None = None
    head: str | None = None
    adapter: str | None = None
    pooling: str = "auto"
    prompt_template: str | None = None
    unconditional_template: str | None = None
    max_length: int | None = None
    # auto: bfloat16 for LLM embedders on CUDA, and for BERT-style CASE encoders on a CPU kind where it measured
    # faster, AMX or an AMD EPYC's AVX-512 BF16 (recorded as the encoder's auto_dtype, while the spec keeps auto:
    # condsearch.base.cpu_kind), else float32
    dtype: str = "auto"
    bidirectional_layers: int | None = None
    preset: str | None = None
    quantize: Quantize = CpuConfig.quantize
    router: str | None = None
    router_layer: int | None = None
    router_variant: str | None = None
    runtime: Runtime = field(default_factory=Runtime, compare=False)

    def to_dict(self) -> dict[str, object]:
        """Return the spec as a manifest stores it (JSON-ready; the runtime left out)."""
        saved = asdict(self)
        del saved["runtime"]
        return saved

    @classmethod
    def from_dict(cls, saved: Mapping[str, object], *, runtime: Runtime | None = None) -> EncoderSpec:
        """Return the spec :meth:`to_dict` gave; a key this version does not know is a one-line StoreError."""
        known = {f.name for f in fields(cls)} - {"runtime"}
        unknown = sorted(saved.keys() - known)
        if unknown:
            raise StoreError(
                f"the index's encoder spec has a field this condsearch does not know ({unknown[0]!r}); re-index"
            )
        return cls(**saved, runtime=runtime or Runtime())  # type: ignore[arg-type]

    def with_runtime(self, runtime: Runtime) -> EncoderSpec:
        return replace(self, runtime=runtime)

    def resolve_profile(self) -> Profile:
        """Return the adapter, head or router folders that the spec's profile flags name (checked together)."""
        from condsearch.model.artifacts.profiles import resolve_profile

        return resolve_profile(
            self.model,
            profile=self.profile,
            head=self.head,
            adapter=self.adapter,
            router=self.router,
            mode=self.mode,
        )

    @classmethod
    def recorded(cls, described: Mapping[str, object], mode: str, profile_name: str) -> EncoderSpec:
        """Return the spec that loads an encoder again: from its ``describe()``, its mode and its profile's name.

        This is what a manifest stores, and what an index written before the manifest held a spec
        is read as (its ``head`` field is ``profile_name``).
        """
        model, revision = described.get("model_id"), described.get("revision")
        max_length = _int(described.get("max_length"))
        common = {
            "model": model if isinstance(model, str) else None,
            "revision": revision if isinstance(revision, str) else None,
            "max_length": max_length,
        }
        if mode == MODE_CSR:
            return cls(
                **common,  # type: ignore[arg-type]
                mode=MODE_CSR,
                router=str(described.get("router") or PROFILE_NONE),
                router_layer=_int(described.get("router_layer")),
                router_variant=_str(described.get("router_variant")),
                quantize="int8" if described.get("quantize") == "int8" else "none",
            )
        if mode != MODE_CASE:
            raise StoreError(f"unknown index mode {mode!r}")
        # an adapter named apart from the profile goes back with --head, as it was given
        adapter = _str(described.get(ADAPTER_KEY))
        name = recorded_profile(profile_name)
        pooling = described.get("pooling")
        dtype = described.get("dtype")
        quantize = described.get("quantize")
        # absent from records of causal decoders (and of everything before it existed): 0
        layers = described.get("bidirectional_layers", DecoderAttention.bidirectional_layers)
        return cls(
            **common,  # type: ignore[arg-type]
            profile=None if adapter else name,
            head=name if adapter else None,
            adapter=adapter,
            pooling=pooling if isinstance(pooling, str) and pooling in POOLINGS else "auto",  # NV-Embed's is its auto
            prompt_template=_str(described.get("prompt_template")),
            unconditional_template=_str(described.get("unconditional_template")),
            dtype=dtype if isinstance(dtype, str) and dtype in DTYPES else "auto",
            # absent: float32, as every record before int8
            quantize=quantize if isinstance(quantize, str) and quantize in QUANTIZE_CHOICES else "none",  # type: ignore[arg-type]
            bidirectional_layers=layers if described.get("family") == "decoder" and isinstance(layers, int) else None,
        )

    @classmethod
    def of_manifest(cls, manifest: Recorded, *, runtime: Runtime | None = None) -> EncoderSpec:
        """Return the spec an index was built with: its manifest's, else read from its encoder record (before 5)."""
        if manifest.spec:
            return cls.from_dict(manifest.spec, runtime=runtime)
        spec = cls.recorded(manifest.encoder, manifest.mode, manifest.head)
        return replace(spec, model=manifest.model_id, revision=manifest.model_revision, runtime=runtime or Runtime())


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
