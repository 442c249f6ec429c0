"""Which of a folder's indexes a server built on demand, and what they weigh: what its cap counts (issue 58).

A server that builds a condition on demand (:mod:`condsearch.serve.builds`) marks the index with an empty
``<root>/.versions/<name>.on-demand`` file beside its versions. The marks outlive the server, so a restart
does not reset what the cap counts; an index deleted by hand (``rm -r <root>/<name>``) no longer counts,
whatever marks it left. Indexes written by `condsearch index` carry no mark.
"""

from __future__ import annotations

from pathlib import Path

from condsearch.store.folder import VERSIONS, IndexStore
from condsearch.store.listing import Listing
from condsearch.store.manifest import Manifest

MARK = ".on-demand"


def _mark(store: IndexStore, name: str) -> Path:
    return store.root / VERSIONS / f"{name}{MARK}"


def mark_built_on_demand(store: IndexStore, name: str) -> None:
    """Record that the index named name was built on demand."""
    path = _mark(store, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def on_demand_sizes(store: IndexStore, listing: Listing) -> dict[str, int]:
    """Return the bytes on disk of each listed index that was built on demand (by its manifest's file sizes)."""
    folder = store.root / VERSIONS
    marked = {p.name.removesuffix(MARK) for p in folder.glob(f"*{MARK}")} if folder.is_dir() else set()
    return {name: _size(m) if isinstance(m, Manifest) else 0 for name, m in listing if name in marked}


def _size(m: Manifest) -> int:
    recorded = [r.get("size") for r in m.files.values()]
    sizes = [s for s in recorded if isinstance(s, int)]
    return sum(sizes) if sizes else m.index_size
