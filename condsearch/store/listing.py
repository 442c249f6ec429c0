"""Finding an index in a store's listing: by condition (and corpus), with what is indexed and what is damaged named.

One way for every store and front end: a folder (:class:`condsearch.store.folder.IndexStore`), a Milvus
database (:class:`condsearch.scale.milvus.MilvusStore`), the server's and the Python API's loaded
indexes (:class:`condsearch.query.resident.Resident`) all list (name, manifest) pairs and pick from
them with :func:`find_index`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from condsearch.artifacts.profiles import MODES, Mode
from condsearch.errors import AmbiguousCondition, CondsearchError, UnknownCondition, first_line
from condsearch.store.manifest import Manifest

#: a store's indexes: (name, manifest, or the error that stops it from loading)
Listing = Sequence[tuple[str, Manifest | Exception]]


def check_condition(condition: str) -> str:
    """Return a condition stripped of surrounding space, refusing empty ones."""
    text = condition.strip()
    if not text:
        raise CondsearchError("the condition is empty")
    return text


def find_index(
    listing: Listing,
    condition: str,
    corpus: str | None = None,
    *,
    where: str = "",
    root: str = "",
    corpus_option: str = "--corpus",
) -> tuple[str, Manifest]:
    """Return the (name, manifest) of the one index of condition (and corpus) in a listing.

    Raises :class:`UnknownCondition` (listing what is indexed, and naming damaged entries) or
    :class:`AmbiguousCondition` (several corpora, no ``corpus``). ``where`` names the store in the
    message ("in indexes"); ``root`` is stripped from the damaged entries' errors; ``corpus_option``
    is how the front end names the corpus ("--corpus", '"corpus"', "corpus=").
    """
    condition = check_condition(condition)
    manifests = [(name, m) for name, m in listing if isinstance(m, Manifest)]
    matches = [(n, m) for n, m in manifests if m.condition == condition and corpus in (None, m.corpus_name)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        corpora = sorted(m.corpus_name for _, m in matches)
        raise AmbiguousCondition(
            f"condition {condition!r} is indexed for several corpora ({', '.join(corpora)}); "
            f"choose one with {corpus_option}",
            corpora,
        )
    known = sorted({m.condition for _, m in manifests})
    listed = "; ".join(repr(c) for c in known) if known else "none"
    scope = (f" for corpus {corpus!r}" if corpus is not None else "") + (f" in {where}" if where else "")
    message = f"no index for condition {condition!r}{scope}; indexed: {listed}{damaged_note(listing, root)}"
    raise UnknownCondition(message, known)


def kept_mode(listing: Listing, corpus: str, conditions: Sequence[str]) -> Mode | None:
    """Return the mode of a corpus's indexes under these conditions already in a listing, if they share one.

    What ``--mode auto`` keeps when re-indexing: an index built in one mode stays in it (and
    incremental), whatever the default is now. None when there are none, or they differ.
    """
    pairs = {(corpus, c.strip()) for c in conditions}
    modes = {m.mode for _, m in listing if isinstance(m, Manifest) and (m.corpus_name, m.condition) in pairs}
    return modes.pop() if len(modes) == 1 and modes <= set(MODES) else None  # type: ignore[return-value]


def damaged_note(listing: Listing, root: str = "") -> str:
    """Return "; 1 index is damaged: …" naming the entries of a listing that failed to load, or ""."""
    damaged = [(name, exc) for name, exc in listing if not isinstance(exc, Manifest)]
    if not damaged:
        return ""
    name, exc = damaged[0]
    reason = first_line(exc).removeprefix(f"{root}{os.sep}" if root else "")  # "<name>/manifest.json: corrupt …"
    count = "1 index is damaged" if len(damaged) == 1 else f"{len(damaged)} indexes are damaged, first"
    return f"; {count}: {reason if reason.startswith(name) else f'{name}: {reason}'} (run condsearch verify)"
