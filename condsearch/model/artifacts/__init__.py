"""Trained artifacts on disk: heads, adapters, routers, checkpoints and the profiles that combine them.

The ones condsearch ships live in ``condsearch/assets/`` (each at most 10 MB; docs/training.md and
docs/csr.md hold the commands that regenerate them).

One package answers "what is this folder, may it be used with this model, and what does it
weigh?" without importing torch: :mod:`condsearch.base.artifact_files` (names, shipped folders,
file names, format versions, which artifact a folder holds; in the bottom layer, since atomic writes
check it), ``heads``, ``adapters`` (PEFT's format and the old one),
``routers``, ``profiles`` (a base model + adapter + head, or + router, resolved once) and
``convert`` (old adapter folders to PEFT's format). The weights' maths stays with what uses it:
:mod:`condsearch.model.head`, :mod:`condsearch.model.csr.router`, :mod:`condsearch.model.encoders.lora`. Front door:
the names below (the modes and :func:`resolve_mode`, the router choices and :func:`resolve_router`), each
loaded on first use, so that importing this package loads no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base.front_door import lazy_names

if TYPE_CHECKING:
    from condsearch.model.artifacts.profiles import (
        DEFAULT_MODE,
        MODE_AUTO,
        MODE_CASE,
        MODE_CSR,
        MODES,
        PROFILE_AUTO,
        Mode,
        ProfileError,
        resolve_mode,
    )
    from condsearch.model.artifacts.routers import ROUTER_AUTO, ROUTER_DEFAULT, ROUTER_NONE, resolve_router

__all__ = [
    "DEFAULT_MODE",
    "MODES",
    "MODE_AUTO",
    "MODE_CASE",
    "MODE_CSR",
    "PROFILE_AUTO",
    "ROUTER_AUTO",
    "ROUTER_DEFAULT",
    "ROUTER_NONE",
    "Mode",
    "ProfileError",
    "resolve_mode",
    "resolve_router",
]

#: public name -> the module of this package it is imported from, when first asked for (so importing stays cheap;
#: DEFAULT_MODE is read from profiles on each use, so that a test that changes it there changes the API's default)
_HOMES = {
    "DEFAULT_MODE": "profiles",
    "MODES": "profiles",
    "MODE_AUTO": "profiles",
    "MODE_CASE": "profiles",
    "MODE_CSR": "profiles",
    "PROFILE_AUTO": "profiles",
    "ROUTER_AUTO": "routers",
    "ROUTER_DEFAULT": "routers",
    "ROUTER_NONE": "routers",
    "Mode": "profiles",
    "ProfileError": "profiles",
    "resolve_mode": "profiles",
    "resolve_router": "routers",
}


__getattr__ = lazy_names(__name__, _HOMES)
