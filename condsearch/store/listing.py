"""Finding an index in a store's listing: by condition (and corpus), with what is indexed and what is damaged named.

One way for every store and front end: a folder (:class:`condsearch.store.folder.IndexStore`), a Milvus
database (:class:`condsearch.scale.milvus.MilvusStore`), the server's and the Python API's loaded
indexes (:class:`condsearch.query.resident.Resident`) all list (name, manifest) pairs and pick from
them with :func:`find_index`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

from condsearch.artifacts.profiles import MODES, Mode
from condsearch.base.model_sources import model_lowercases
from condsearch.errors import AmbiguousCondition, UnknownCondition, first_line
from condsearch.store.conditions import (
    check_condition,
    new_condition_problem,
    normalize_condition,
    shown_condition,
)
from condsearch.store.manifest import Manifest

#: a store's indexes: (name, manifest, or the error that stops it from loading)
Listing = Sequence[tuple[str, Manifest | Exception]]
#: conditions a refusal names at most (of the corpus asked for): a store of thousands is not listed whole
MAX_LISTED = 10

__all__ = ["Listing", "check_condition", "condition_key", "find_index", "known_note", "same_condition"]


@functools.lru_cache(maxsize=1 << 16)
def _key(condition: str, model_id: str) -> str:
    """Return :func:`condition_key`, kept: a listing of thousands of indexes is matched per request."""
    return condition_key(condition, model_id)


def condition_key(condition: str, model_id: str) -> str:
    """Return the form of condition that names and finds an index built with model_id: normalised, and lower-cased
    where the model is uncased."""
    return normalize_condition(condition, lowercase=model_lowercases(model_id))


def same_condition(manifest: Manifest, condition: str) -> bool:
    """Return whether an index's condition and condition are one, once both are normalised for its model."""
    return condition_key(manifest.condition, manifest.model_id) == condition_key(condition, manifest.model_id)


def known_note(conditions: Sequence[str], limit: int = MAX_LISTED) -> str:
    """Return "'a'; 'b'" naming at most limit of conditions (sorted), "and N more" past them; "none" for none."""
    if not conditions:
        return "none"
    listed = "; ".join(repr(c) for c in conditions[:limit])
    return listed + (f"; and {len(conditions) - limit:,} more" if len(conditions) > limit else "")


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
    by_corpus: dict[str, list[tuple[str, Manifest]]] = {}
    for n, m in manifests:
        if corpus in (None, m.corpus_name) and _key(m.condition, m.model_id) == _key(condition, m.model_id):
            by_corpus.setdefault(m.corpus_name, []).append((n, m))
    if len(by_corpus) == 1:
        return _closest(next(iter(by_corpus.values())), condition)
    if by_corpus:
        corpora = sorted(by_corpus)
        raise AmbiguousCondition(
            f"condition {condition!r} is indexed for several corpora ({', '.join(corpora)}); "
            f"choose one with {corpus_option}",
            corpora,
        )
    known = sorted({m.condition for _, m in manifests if corpus in (None, m.corpus_name)})
    scope = (f" for corpus {corpus!r}" if corpus is not None else "") + (f" in {where}" if where else "")
    # why no index can be under it (too long, a control character) comes first: the list is no answer to that
    why = new_condition_problem(condition)
    message = f"{f'{why}; ' if why else ''}no index for condition {shown_condition(condition)}{scope}; "
    message += f"indexed: {known_note(known)}{damaged_note(listing, root)}"
    raise UnknownCondition(message, known[:MAX_LISTED])


def _closest(matches: list[tuple[str, Manifest]], condition: str) -> tuple[str, Manifest]:
    """Return the one of a corpus's indexes of one condition that an older condsearch may have written twice
    (under two spellings, before conditions were normalised): the one spelt as asked, else the newest."""
    if len(matches) == 1:
        return matches[0]
    exact = [e for e in matches if e[1].condition == condition]
    return max(exact or matches, key=lambda e: e[1].created_at)


def kept_mode(listing: Listing, corpus: str, conditions: Sequence[str]) -> Mode | None:
    """Return the mode of a corpus's indexes under these conditions already in a listing, if they share one.

    What ``--mode auto`` keeps when re-indexing: an index built in one mode stays in it (and
    incremental), whatever the default is now. None when there are none, or they differ.
    """
    modes = {
        m.mode
        for _, m in listing
        if isinstance(m, Manifest) and m.corpus_name == corpus and any(same_condition(m, c) for c in conditions)
    }
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
