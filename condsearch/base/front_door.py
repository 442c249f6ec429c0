"""A package's front door: its public names, each imported from the module that holds it when first asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """Return a module ``__getattr__`` for package: name -> ``getattr(<package>.<homes[name]>, name)``.

    Looked up on each use, not bound once: importing the package stays cheap, and what a test
    replaces in the module that holds a name is what runs.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{home}"), name)

    return __getattr__
