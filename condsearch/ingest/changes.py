"""Change a corpus by id (issue 59): upsert and delete rows under every condition it is indexed under at once.

Each index of the corpus gets the new row set: its rows minus those deleted, an upserted id's text
replaced where it stands, new ids appended in the order given. As in an incremental re-index
(:mod:`condsearch.ingest.chunks`), a row whose id and text hash match a kept row takes its kept vector
(checked against the manifest's sha256 first); only new or changed texts are encoded, and a delete
encodes nothing and loads no model. The FAISS index is built again from the vectors with the index's
own factory and search parameters, so the result is what ``condsearch index`` of the new row set gives.

All or nothing: the writer locks of every index of the corpus are held, every new version is prepared
(encoded and indexed) before any is published, and a refusal (an id not in the corpus, an encoder that
changed) or a failure leaves every index as it was. Each index is then published as ``index`` publishes
it, in one atomic step; readers never wait, and a query sees one index's old or new version whole.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from condsearch.base.ann import IndexConfig
from condsearch.base.faiss_indexes import build_index
from condsearch.errors import CondsearchError, StoreError, first_line
from condsearch.ingest.chunks import plan_index
from condsearch.store.folder import ROWS_FILE, Draft, IndexStore
from condsearch.store.lifecycle import UnknownIds, corpus_indexes, match_ids, read_kept_columns, read_rows
from condsearch.store.manifest import Manifest
from condsearch.store.rows import KeptVectors, write_rows
from condsearch.store.vectors import VECTORS_FILE, text_hash

if TYPE_CHECKING:
    import faiss

    from condsearch.model.vectorizer import Vectorizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChangeReport:
    """What a change did to a corpus: its rows now, rows deleted, upserted, and vectors encoded (over all indexes)."""

    corpus: str
    indexes: list[str]
    n_rows: int
    n_deleted: int
    n_upserted: int
    n_encoded: int


@dataclass
class _Prepared:
    draft: Draft
    manifest: Manifest
    index: faiss.Index
    ids: list[str | int]
    texts: list[str]
    vectors: np.ndarray
    metadata: pa.Table | None = None


def change_corpus(
    store: IndexStore,
    corpus: str | None,
    *,
    delete: Sequence[str | int] = (),
    upsert: Sequence[tuple[str | int, str]] = (),
    vectorizer: Callable[[Manifest], Vectorizer] | None = None,
    metadata: Sequence[Mapping[str, Any] | None] | None = None,
) -> ChangeReport:
    """Delete the ids in delete and upsert the (id, text) pairs, in every index of the corpus, all or none.

    ``vectorizer`` gives the model an index records (needed only where a text must be encoded).
    ``metadata``: per upserted pair, values of the columns the corpus keeps (issue 59) by name: an upserted row
    takes those, and keeps its other columns' values (a new row has none: null); None keeps them all. A column the
    corpus does not keep, or a value not of its column's type, is refused.
    Raises in one line, with nothing changed: an unknown corpus, ids to delete that are not in it,
    an id given twice, every row deleted, an index that keeps no trusted vectors.
    """
    start = time.perf_counter()
    corpus, mine = corpus_indexes(store, corpus)
    _check_unique([i for i, _ in upsert], "upsert")
    _check_unique(list(delete), "delete")
    if metadata is not None and len(metadata) != len(upsert):
        raise CondsearchError(f"{len(metadata)} metadata entries for {len(upsert)} upserted rows: give one per row")
    with ExitStack() as held:
        prepared: list[_Prepared] = []
        n_encoded = 0
        for name, listed in mine:
            draft = held.enter_context(store.writing(corpus, listed.condition))
            if draft.name != name:  # another spelling's index took the name meanwhile: not ours to guess
                raise StoreError(f"index {name} of corpus {corpus!r} changed while being read; try again")
            kept = store.kept_vectors(name)
            if kept is None:
                raise StoreError(
                    f"index {name} keeps no trusted vectors (written by an older condsearch, or damaged); "
                    f"re-index corpus {corpus!r} before changing it by id"
                )
            try:
                one, encoded = _prepare(store, draft, kept, corpus, delete, upsert, vectorizer, metadata)
            finally:
                kept.vectors.close()
            prepared.append(one)
            n_encoded += encoded
        for one in prepared:
            one.draft.publish(one.manifest, one.index, _placer(one))
            log.info(  # every change is logged: what, how many rows, how long (issue 59)
                "changed index %s (corpus %r, condition %r): %d rows now, %d deleted, %d upserted, in %.1f s",
                one.draft.name,
                corpus,
                one.manifest.condition,
                len(one.ids),
                len(delete),
                len(upsert),
                time.perf_counter() - start,
            )
    n_rows = len(prepared[0].ids) if prepared else 0
    return ChangeReport(corpus, [p.draft.name for p in prepared], n_rows, len(delete), len(upsert), n_encoded)


def _check_unique(ids: list[str | int], what: str) -> None:
    seen: set[str] = set()
    twice = [i for i in ids if str(i) in seen or seen.add(str(i))]  # type: ignore[func-returns-value]
    if twice:
        raise CondsearchError(f"ids to {what} name {twice[0]!r} more than once")


def _prepare(
    store: IndexStore,
    draft: Draft,
    kept: KeptVectors,
    corpus: str,
    delete: Sequence[str | int],
    upsert: Sequence[tuple[str | int, str]],
    vectorizer: Callable[[Manifest], Vectorizer] | None,
    metadata: Sequence[Mapping[str, Any] | None] | None = None,
) -> tuple[_Prepared, int]:
    """Return one index's next version (rows, vectors, FAISS index, manifest) and how many vectors it encoded."""
    manifest = kept.manifest
    ids, texts = read_rows(store, draft.name)
    if len(ids) != len(kept.ids):
        raise StoreError(f"index {draft.name}: rows and kept vectors disagree; re-index corpus {corpus!r}")
    gone = set(match_ids(delete, ids, corpus))
    at = {str(i): pos for pos, i in enumerate(ids)}
    new_text = {at[str(i)]: t for i, t in upsert if str(i) in at}
    unknown = [(_like(i, ids), t) for i, t in upsert if str(i) not in at]
    if gone & set(new_text):
        raise UnknownIds(f"an id is both deleted and upserted in one change of corpus {corpus!r}")
    source = [p for p in range(len(ids)) if p not in gone]
    out_ids = [ids[p] for p in source] + [i for i, _ in unknown]
    out_texts = [new_text.get(p, texts[p]) for p in source] + [t for _, t in unknown]
    if not out_ids:
        raise CondsearchError(f"that would delete every row of corpus {corpus!r}; drop it with `condsearch rm` instead")
    # a row keeps its vector when its text is the one its vector was made from
    reuse = [(j, p) for j, p in enumerate(source) if p not in new_text or text_hash(new_text[p]) == kept.hashes[p]]
    vectors = np.empty((len(out_ids), manifest.dim), dtype=np.float32)
    if reuse:
        vectors[[j for j, _ in reuse]] = kept.vectors.take([p for _, p in reuse])
    reused = {j for j, _ in reuse}
    encode_at = [j for j in range(len(out_ids)) if j not in reused]
    if encode_at:
        vectors[encode_at] = _encode([out_texts[j] for j in encode_at], manifest, vectorizer)
    factory, search_params = plan_index(
        len(out_ids), manifest.dim, manifest.factory, manifest.search_params, IndexConfig.max_index_memory
    )
    index = build_index(vectors, factory, search_params=search_params)
    rows = [(str(i), text_hash(t).hex()) for i, t in zip(out_ids, out_texts, strict=True)]
    checksum = hashlib.sha256(repr(rows).encode())
    # the rows are no longer the corpus file's: its checksum now names the row set, as changed by id
    changed = replace(manifest, n_vectors=len(out_ids), corpus_checksum=checksum.hexdigest())
    columns = _changed_columns(store, draft.name, corpus, source, upsert, metadata, at)
    return _Prepared(draft, changed, index, out_ids, out_texts, vectors, columns), len(encode_at)


def _changed_columns(
    store: IndexStore,
    name: str,
    corpus: str,
    source: list[int],
    upsert: Sequence[tuple[str | int, str]],
    metadata: Sequence[Mapping[str, Any] | None] | None,
    at: dict[str, int],
) -> pa.Table | None:
    """Return the kept columns of the new row set: the rows kept (``source``, old positions) with the values
    ``metadata`` gives an upserted one, then the new rows'; None where the index keeps no columns."""
    old = read_kept_columns(store, name)
    given = [(str(i), dict(m or {})) for (i, _), m in zip(upsert, metadata or [None] * len(upsert), strict=True)]
    named = sorted({c for _, m in given for c in m if c not in old.column_names})
    if named:
        keeps = ", ".join(old.column_names) or "none"
        raise CondsearchError(
            f"corpus {corpus!r} keeps no column {named[0]!r} (it keeps: {keeps}); re-index to add one"
        )
    if not old.num_columns:
        return None
    new_rows = [m for i, m in given if i not in at]
    changed = {at[i]: m for i, m in given if i in at and m}
    kept = old.take(pa.array(source, type=pa.int64()))
    out: dict[str, pa.Array] = {}
    for column in old.column_names:
        kind = old.schema.field(column).type
        values = kept.column(column).to_pylist()
        for j, p in enumerate(source):
            if column in changed.get(p, {}):
                values[j] = changed[p][column]
        values += [m.get(column) for m in new_rows]
        try:
            out[column] = pa.array(values, type=kind)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise CondsearchError(
                f"metadata: column {column!r} holds {kind}; a value given is not one ({first_line(exc)})"
            ) from None
    return pa.table(out)


def _like(given: str | int, ids: Sequence[str | int]) -> str | int:
    """Return a new id in the type of the corpus's ids (a file's '7' joins integer ids as 7); refuse one that cannot."""
    if not ids or not isinstance(ids[0], int) or isinstance(given, int):
        if ids and isinstance(ids[0], str) and not isinstance(given, str):
            raise CondsearchError(f"corpus ids are strings; id {given!r} is not one")
        return given
    try:
        return int(given)
    except ValueError:
        raise CondsearchError(f"corpus ids are integers; id {given!r} is not one") from None


def _encode(texts: list[str], manifest: Manifest, vectorizer: Callable[[Manifest], Vectorizer] | None) -> np.ndarray:
    """Encode texts under the index's condition with the model it records; refuse another model's vectors."""
    from condsearch.model.identity import ModelIdentity

    if vectorizer is None:
        raise CondsearchError("upserted texts need the index's model to encode them; none was given")
    model = vectorizer(manifest)
    if manifest.fingerprint and ModelIdentity.of_vectorizer(model).fingerprint != manifest.fingerprint:
        raise StoreError(
            f"corpus {manifest.corpus_name!r} was indexed with another encoder than the one given "
            f"(condition {manifest.condition!r}); re-index the corpus, or change it with the model it was built with"
        )
    return np.asarray(model.encode(texts, manifest.condition), dtype=np.float32)


def _placer(one: _Prepared) -> Callable[[Path], None]:
    def place(version: Path) -> None:
        write_rows(version / ROWS_FILE, one.ids, one.texts, one.metadata)
        np.save(version / VECTORS_FILE, np.ascontiguousarray(one.vectors, dtype="<f4"), allow_pickle=False)

    return place
