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

from condsearch.base.model_sources import model_lowercases
from condsearch.errors import AmbiguousCondition, CaseVariant, UnknownCondition, first_line
from condsearch.store.conditions import (
    check_condition,
    new_condition_problem,
    normalize_condition,
    shown_condition,
)
from condsearch.store.manifest import MODES, Manifest, Mode

#: a store's indexes: (name, manifest, or the error that stops it from loading)
Listing = Sequence[tuple[str, Manifest | Exception]]
#: conditions a refusal names at most (of the corpus asked for): a store of thousands is not listed whole
MAX_LISTED = 10

__all__ = [
    "Listing",
    "case_variant",
    "case_variant_refusal",
    "check_condition",
    "condition_key",
    "find_index",
    "known_note",
    "refuse_case_variants",
    "same_condition",
]


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


def case_variant(listing: Listing, corpus: str, condition: str) -> str | None:
    """Return the corpus's indexed condition that differs from condition only in case, where condition itself is
    not indexed for it, else None (issue 59).

    Both are compared in their normal form (NFC, whitespace folded), then case-folded. Only a cased model's
    conditions can be such variants: an uncased model's are lower-cased into one index already
    (:func:`condition_key`). A second index under a case-only variant is what a typo builds; front ends ask
    before building one (the CLI's confirmation, the server's 409).
    """
    text = normalize_condition(condition)
    mine = [m for _, m in listing if isinstance(m, Manifest) and m.corpus_name == corpus]
    if not text or any(same_condition(m, text) for m in mine):
        return None
    folded = text.casefold()
    variants = sorted({m.condition for m in mine if normalize_condition(m.condition).casefold() == folded})
    return variants[0] if variants else None


def case_variant_refusal(corpus: str, condition: str, existing: str) -> CaseVariant:
    """Return the refusal of a build under condition, which differs from corpus's indexed existing only in case."""
    text = normalize_condition(condition)
    return CaseVariant(
        f"corpus {corpus!r} is indexed under {shown_condition(existing)}, which differs from "
        f"{shown_condition(text)} only in case",
        existing,
        text,
    )


def refuse_case_variants(listing: Listing, corpus: str, conditions: Sequence[str]) -> None:
    """Raise :class:`CaseVariant` for the first of conditions that differs from an indexed one of corpus only in
    case (:func:`case_variant`); return where none does."""
    for condition in conditions:
        if (existing := case_variant(listing, corpus, condition)) is not None:
            raise case_variant_refusal(corpus, condition, existing)


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


def kept_index(listing: Listing, corpus: str, condition: str) -> Manifest | None:
    """Return the manifest of the corpus's index under condition in a listing, or None where there is none."""
    for _, m in listing:
        if isinstance(m, Manifest) and m.corpus_name == corpus and same_condition(m, condition):
            return m
    return None


def damaged_note(listing: Listing, root: str = "") -> str:
    """Return "; 1 index is damaged: …" naming the entries of a listing that failed to load, or ""."""
    damaged = [(name, exc) for name, exc in listing if not isinstance(exc, Manifest)]
    if not damaged:
        return ""
    name, exc = damaged[0]
    reason = first_line(exc).removeprefix(f"{root}{os.sep}" if root else "")  # "<name>/manifest.json: corrupt …"
    count = "1 index is damaged" if len(damaged) == 1 else f"{len(damaged)} indexes are damaged, first"
    return f"; {count}: {reason if reason.startswith(name) else f'{name}: {reason}'} (run condsearch verify)"
