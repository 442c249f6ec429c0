"""Profiles: what turns a base model's outputs into index vectors, resolved once from the flags or a manifest.

A CASE profile is an adapter (or none) and a head (or none); a CSR profile is a router (or an
untrained one). Named profiles ship for the default model: ``full`` (the encoder fine-tuned in
full on C-STS, shipped as a rank-64 delta; 384-d), ``lora`` (a LoRA adapter + a 256-d head),
``frozen`` (a head on the frozen encoder). ``default`` names :data:`DEFAULT_PROFILE` (``full``);
``none`` is the raw model and ``auto`` is the default profile for the default model, else
``none``. A folder written by ``train`` (adapter and/or head) is a profile too. ``--head`` names a
head only; ``--head auto|default|lora|full|frozen`` and ``--head FOLDER`` of a folder holding an
adapter are kept as aliases of ``--profile``.

An index's manifest records the profile as it always has: its ``head`` is the profile's name (a
shipped name, 'none' or a folder; never 'default', which is resolved first), and an adapter named
apart from it (``--adapter``) is recorded as the encoder's ``adapter``. Indexes written while the
LoRA profile was the default record it as 'default' (:data:`LEGACY_DEFAULT`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from condsearch.base.artifact_files import FROZEN_HEAD_DIR, FULL_PROFILE_DIR, LORA_PROFILE_DIR
from condsearch.errors import ModelError
from condsearch.model.artifacts.adapters import has_adapter
from condsearch.model.artifacts.heads import has_head
from condsearch.model.artifacts.routers import ROUTER_AUTO, resolve_router
from condsearch.store.manifest import MODE_CASE, MODE_CSR, MODES, Mode

PROFILE_AUTO = "auto"
PROFILE_NONE = "none"
PROFILE_DEFAULT = "default"
PROFILE_FULL = "full"
PROFILE_LORA = "lora"
PROFILE_FROZEN = "frozen"
#: what ships for the default model, by profile name
SHIPPED_PROFILES = {
    PROFILE_FULL: FULL_PROFILE_DIR,
    PROFILE_LORA: LORA_PROFILE_DIR,
    PROFILE_FROZEN: FROZEN_HEAD_DIR,
}
#: the profile that ``default`` (and ``auto`` for the default model) names: the best on C-STS dev
DEFAULT_PROFILE = PROFILE_FULL
#: what the 'default' of an index written while the LoRA profile was the default means
LEGACY_DEFAULT = PROFILE_LORA
PROFILE_NAMES = (PROFILE_AUTO, PROFILE_DEFAULT, *SHIPPED_PROFILES, PROFILE_NONE)
#: the manifest's encoder record of an adapter named with --adapter (apart from the profile)
ADAPTER_KEY = "adapter"
#: --mode auto: csr for a model a trained router ships for (the default model), CASE otherwise or when a
#: CASE-only setting is named (resolve_mode)
MODE_AUTO = "auto"
#: the mode a front end builds when none is named: index's --mode, condsearch.load_model and Store.index
#: (the one place to change it; :class:`condsearch.model.encoders.spec.EncoderSpec` and :class:`Profile` default to CASE
#: as data: a spec or profile that names no mode is a CASE one). auto: the router for the default model,
#: the mode that loses least out of the caption domain (issue 39; benchmarks/README.md)
DEFAULT_MODE = MODE_AUTO


def resolve_mode(
    mode: str,
    model: str | None = None,
    *,
    case_settings: bool = False,
    router: bool = False,
    kept: Mode | None = None,
) -> Mode:
    """Return the mode that ``mode`` names; ``auto`` is resolved from what else was asked.

    ``auto``: csr when a router was named (``router``), CASE when a CASE-only setting was
    (``case_settings``: a profile, adapter, head, pooling, prompt, dtype or decoder preset), else
    ``kept`` (the mode of the corpus's indexes already in the store, so re-indexing stays
    incremental), else csr for the default model (its router ships) and CASE for any other (no
    trained router for it). Router and CASE settings at once resolve to csr, whose own check then
    refuses the CASE setting in one line.
    """
    if mode in MODES:
        return mode  # type: ignore[return-value]  # one of MODES
    if mode != MODE_AUTO:
        raise ProfileError(f"mode must be 'auto', 'case' or 'csr', not {mode!r}")
    if router:
        return MODE_CSR
    if case_settings:
        return MODE_CASE
    if kept is not None:
        return kept
    from condsearch.base.model_sources import DEFAULT_MODEL

    return MODE_CSR if (model or DEFAULT_MODEL) == DEFAULT_MODEL else MODE_CASE  # by name: no hub lookup


class ProfileError(ModelError):
    """Flags that name an adapter, head, profile or router which cannot go together."""


@dataclass(frozen=True)
class Profile:
    """A resolved profile: the folders to load; ``name`` is what an index's manifest records as its head."""

    name: str = PROFILE_NONE
    adapter: Path | None = None
    head: Path | None = None
    router: Path | None = None
    mode: Mode = MODE_CASE

    @property
    def separate_adapter(self) -> str | None:
        """Return the adapter's path when it was named apart from the profile (recorded by the encoder)."""
        if self.adapter is None or self.name in SHIPPED_PROFILES or self.name == str(self.adapter):
            return None
        return str(self.adapter)


def _folder(spec: str | Path, what: str) -> Path:
    folder = Path(spec).expanduser().resolve()
    if not folder.is_dir():
        names = ", ".join(repr(n) for n in SHIPPED_PROFILES)
        raise ModelError(f"{what} {str(spec)!r}: no such folder (use a {what} folder, {names} or 'none')")
    return folder


def _name_of(folder: Path) -> str:
    return next((n for n, f in SHIPPED_PROFILES.items() if folder == f.resolve()), str(folder))


def _named(spec: str, model: str | None) -> Profile:
    """Return the profile a --profile value (or a --head alias) names."""
    if spec == PROFILE_AUTO:
        from condsearch.base.model_sources import DEFAULT_MODEL, resolve_model

        spec = DEFAULT_PROFILE if resolve_model(model).model_id == DEFAULT_MODEL else PROFILE_NONE
    spec = DEFAULT_PROFILE if spec == PROFILE_DEFAULT else spec
    if spec == PROFILE_NONE:
        return Profile()
    folder = SHIPPED_PROFILES[spec].resolve() if spec in SHIPPED_PROFILES else _folder(spec, "head")
    adapter = folder if has_adapter(folder) else None
    # a folder without an adapter is a head (reading it says so if it is not)
    head = folder if adapter is None or has_head(folder) else None
    return Profile(_name_of(folder), adapter, head)


def resolve_profile(
    model: str | None = None,
    *,
    profile: str | None = None,
    head: str | None = None,
    adapter: str | Path | None = None,
    router: str | None = None,
    mode: Mode = MODE_CASE,
) -> Profile:
    """Return the profile that the flags name, or a one-line ProfileError where they conflict.

    ``model`` (a name or folder) is resolved only for ``auto``. ``head`` None means not given.
    """
    if mode == MODE_CSR:
        if (head not in (None, PROFILE_AUTO, PROFILE_NONE)) or adapter is not None or profile is not None:
            raise ProfileError(
                "--head, --adapter and --profile apply to --mode case only; CSR vectors are indexed as they are"
            )
        from condsearch.base.model_sources import resolve_model

        folder = resolve_router(router, resolve_model(model).model_id if router in (None, ROUTER_AUTO) else "")
        return Profile(router=folder, mode=MODE_CSR)
    if router not in (None, ROUTER_AUTO):
        raise ProfileError("--router applies to --mode csr only")
    if profile is not None:
        if head is not None or adapter is not None:
            raise ProfileError("--profile names the adapter and head together; drop --head and --adapter")
        return _named(profile, model)
    if adapter is None:
        return _named(head or PROFILE_AUTO, model)  # --head auto|default|frozen and adapter folders: aliases
    if head in SHIPPED_PROFILES or head in (PROFILE_AUTO, PROFILE_DEFAULT):
        raise ProfileError(
            f"--head {head} names a profile (adapter + head); with --adapter name a head folder or 'none'"
        )
    adapter_folder = _folder(adapter, "adapter")
    if not has_adapter(adapter_folder):
        raise ModelError(f"adapter {str(adapter)!r}: no adapter there (adapter_config.json or adapter.json)")
    if head is None or head == PROFILE_NONE:
        return Profile(PROFILE_NONE, adapter_folder, None)
    head_folder = _folder(head, "head")
    if head_folder == adapter_folder:
        return _named(str(head_folder), model)
    if has_adapter(head_folder):
        raise ProfileError(f"--head {head} holds an adapter of its own; name it with --profile, or another head")
    return Profile(str(head_folder), adapter_folder, head_folder)


def recorded_profile(head: str) -> str:
    """Return the profile name a manifest's ``head`` means ('default' in an index older than the ``full`` default)."""
    return LEGACY_DEFAULT if head == PROFILE_DEFAULT else head
