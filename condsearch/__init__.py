"""condsearch: conditional semantic search with condition-aware sentence embeddings (CASE).

From Python::

    import condsearch

    store = condsearch.open("indexes")
    store.index(texts, conditions=["color of the dress"], name="corpus")
    hits = store.search("a girl in an orange dress", condition="color of the dress", k=5)

The API (:mod:`condsearch.api`) is imported on first use, so ``import condsearch`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from condsearch.version import __version__

if TYPE_CHECKING:
    from condsearch.api import Model, Store, load_model, open
    from condsearch.query import Hit, Hits

#: public name -> the module it is imported from, when first asked for
_LAZY = {
    "open": "condsearch.api",
    "load_model": "condsearch.api",
    "Store": "condsearch.api",
    "Model": "condsearch.api",
    "Hit": "condsearch.query",
    "Hits": "condsearch.query",
}

__all__ = ["Hit", "Hits", "Model", "Store", "__version__", "load_model", "open"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # found without this hook from now on
        return value
    raise AttributeError(f"module 'condsearch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
