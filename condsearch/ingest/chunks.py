"""Building one condition's index in chunks: reuse kept vectors, encode the rest, resume after an interruption.

A corpus is read ``chunk_rows`` rows at a time. A row whose id and text hash match a row of the
published index, built with the same vector fingerprint (encoder, adapter, head, router), takes
that row's kept vector; every other row is encoded. Each finished chunk's vectors and rows are
written to the store's staging folder with a record of progress, so an interrupted build starts
again after its last finished chunk. The index is then built from the vectors file alone, and
published in one step: until then the previous version keeps answering. Since every vector is
what a full rebuild would compute, and the index is rebuilt from all of them in corpus order,
the result is the full rebuild's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from condsearch.base.ann import (
    AUTO,
    IndexConfig,
    apply_search_params,
    check_factory,
    choose_index,
    format_search_params,
    ivf_lists,
    parse_memory,
    parse_search_params,
)
from condsearch.base.atomic import open_regular, read_capped, replacing_file
from condsearch.base.faiss_indexes import build_index
from condsearch.errors import CondsearchError, first_line
from condsearch.model.encoders.base import ENCODE_BATCH_SIZE
from condsearch.model.identity import ModelIdentity
from condsearch.progress import progress_bar
from condsearch.store.folder import ROWS_FILE, Draft, IndexStore, Manifest
from condsearch.store.listing import check_condition, condition_key, refuse_case_variants
from condsearch.store.manifest import encoder_precision
from condsearch.store.rows import KeptVectors, rows_table
from condsearch.store.vectors import VECTORS_FILE, VectorFile, VectorWriter, text_hash

if TYPE_CHECKING:
    from condsearch.model.vectorizer import Vectorizer

log = logging.getLogger(__name__)

#: rows encoded and written between two resumable checkpoints
CHUNK_ROWS = 8192
_PROGRESS = "progress.json"
_PROGRESS_MAX_BYTES = 64 << 10
_CHUNKS = "rows"


class CorpusSource(Protocol):
    """A corpus as ingestion reads it.

    A :class:`condsearch.corpus.reader.Corpus` or a :class:`~condsearch.corpus.reader.CorpusFile`.
    """

    @property
    def path(self) -> str: ...
    @property
    def checksum(self) -> str: ...
    @property
    def n_skipped(self) -> int: ...

    def __len__(self) -> int: ...

    def batches(self, rows: int) -> Iterator[tuple[list[str | int], list[str]]]: ...


def corpus_chunks(corpus: CorpusSource, rows: int) -> Iterator[tuple[list[str | int], list[str], pa.Table | None]]:
    """Yield (ids, texts, kept columns) ``rows`` at a time: a source's ``chunks``, else its batches with no columns."""
    chunks = getattr(corpus, "chunks", None)
    if chunks is not None:
        yield from chunks(rows)
        return
    for ids, texts in corpus.batches(rows):
        yield ids, texts, None


def kept_schema(corpus: CorpusSource) -> pa.Schema | None:
    """Return the columns a source keeps beside its rows (issue 59) and their types, None where it keeps none."""
    return getattr(corpus, "metadata_schema", None)


@dataclass(frozen=True)
class BuildReport:
    """What one build did: rows indexed, encoded, reused from the last index, and resumed from staging."""

    name: str
    n_rows: int
    n_encoded: int
    n_reused: int
    n_resumed: int
    factory: str
    search_params: str


def plan_index(n: int, dim: int, factory: str, search_params: str, max_index_memory: str) -> tuple[str, str]:
    """Return the (factory, canonical search params) to build, checked before any encoding; raise CondsearchError."""
    try:
        if factory == AUTO:
            plan = choose_index(n, dim, parse_memory(max_index_memory))
            factory, search_params = plan.factory, search_params or plan.search_params
        check_factory(factory, n, dim)  # some factory strings end the process inside FAISS: none reaches it unchecked
        try:
            probe = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as exc:
            raise ValueError(f"FAISS rejects index factory {factory!r}") from exc
        apply_search_params(probe, search_params)
    except ValueError as exc:
        raise CondsearchError(str(exc)) from exc
    if ivf_lists(factory) > n:
        raise CondsearchError(f"cannot train {factory!r} on {n} vectors: too few for this index")
    return factory, format_search_params(parse_search_params(search_params))


def index_staged_vectors(staging: Path, factory: str, search_params: str) -> faiss.Index:
    """Build the FAISS index from a staging folder's complete vectors file; a bad factory is one line."""
    vectors = VectorFile(staging / VECTORS_FILE)
    try:
        return build_index(vectors, factory, search_params=search_params)
    except ValueError as exc:
        raise CondsearchError(str(exc)) from exc
    finally:
        vectors.close()


def publish_staged(
    draft: Draft, corpus: CorpusSource, corpus_name: str, info: ModelIdentity, *, factory: str, search_params: str
) -> None:
    """Index the draft's complete staged vectors, publish the index with its manifest, and clear the staging."""
    index = index_staged_vectors(draft.staging, factory, search_params)
    manifest = Manifest(
        condition=draft.condition,
        corpus_name=corpus_name,
        corpus_path=corpus.path,
        corpus_checksum=corpus.checksum,
        model_id=info.model_id,
        model_revision=info.model_revision,
        encoder=info.encoder,
        mode=info.mode,
        head=info.head,
        head_checksum=info.head_checksum,
        dim=info.dim,
        metric="inner_product",
        factory=factory,
        n_vectors=len(corpus),
        n_skipped=corpus.n_skipped,
        search_params=search_params,
        fingerprint=info.fingerprint,
        spec=info.spec,
    )
    draft.publish(manifest, index)
    draft.discard_staging()


def build_condition_index(
    corpus: CorpusSource,
    condition: str,
    vectorizer: Vectorizer,
    store: IndexStore,
    *,
    corpus_name: str,
    factory: str = IndexConfig.factory,
    search_params: str = IndexConfig.search_params,
    max_index_memory: str = IndexConfig.max_index_memory,
    full: bool = False,
    batch_size: int = ENCODE_BATCH_SIZE,
    chunk_rows: int = CHUNK_ROWS,
    progress: bool = False,
) -> BuildReport:
    """Index corpus under one condition, encoding only rows the published index does not hold (all with full).

    The index is written under the condition's normal form for the model
    (:func:`condsearch.store.listing.condition_key`).
    """
    start = time.perf_counter()
    n, info = len(corpus), ModelIdentity.of_vectorizer(vectorizer)
    condition = condition_key(check_condition(condition), info.model_id)
    factory, search_params = plan_index(n, info.dim, factory, search_params, max_index_memory)
    with store.writing(corpus_name, condition) as draft:
        kept = None if full else _usable(store.kept_vectors(draft.name), info)
        try:
            counts = _encode_chunks(
                corpus, condition, vectorizer, draft, kept, info, batch_size, chunk_rows, full, progress
            )
        finally:
            if kept is not None:
                kept.vectors.close()
        publish_staged(draft, corpus, corpus_name, info, factory=factory, search_params=search_params)
    log.info(  # every build is logged: what, how many rows, how long (issue 59)
        "built index %s (corpus %r, condition %r): %d rows, %d encoded, in %.1f s",
        draft.name,
        corpus_name,
        condition,
        n,
        counts[0],
        time.perf_counter() - start,
    )
    return BuildReport(draft.name, n, *counts, factory, search_params)


def index_conditions(
    corpus: CorpusSource,
    conditions: Sequence[str],
    vectorizer: Vectorizer,
    store: IndexStore,
    *,
    case_variants: bool = True,
    **build: Any,
) -> list[BuildReport]:
    """Index the corpus under each distinct condition (streamed, incremental, resumable); return what each did.

    ``build`` takes :func:`build_condition_index`'s options (corpus_name, factory, search_params,
    max_index_memory, full, batch_size, chunk_rows, progress). With ``case_variants`` False, a condition that
    differs from one the corpus is indexed under only in case is refused before anything is encoded
    (:class:`~condsearch.errors.CaseVariant`, issue 59): the CLI asks first.
    """
    model_id = vectorizer.encoder.model_id
    conditions = list(dict.fromkeys(condition_key(check_condition(c), model_id) for c in conditions))
    if not case_variants:
        refuse_case_variants(store.manifests(), build["corpus_name"], conditions)
    factory = build.get("factory", IndexConfig.factory)
    if factory != AUTO:  # before FAISS sees it: some factory strings end the process inside FAISS
        try:
            check_factory(factory, len(corpus), vectorizer.dim)
        except ValueError as exc:
            raise CondsearchError(str(exc)) from exc
    return [build_condition_index(corpus, c, vectorizer, store, **build) for c in conditions]


def index_corpus(
    corpus: CorpusSource, conditions: Sequence[str], vectorizer: Vectorizer, store: IndexStore, **build: Any
) -> list[str]:
    """Index the corpus under each condition and return the indexes' names (see :func:`index_conditions`)."""
    return [r.name for r in index_conditions(corpus, conditions, vectorizer, store, **build)]


def _usable(kept: KeptVectors | None, info: ModelIdentity) -> KeptVectors | None:
    """Return the last index's vectors where this build may keep them: same fingerprint, same precision.

    The fingerprint leaves out the dtype that ``--dtype auto`` chose for the CPU kind, so that it
    names the model alone; but an index's vectors are all in the precision its manifest records, so
    bfloat16 vectors built on an AVX-512 BF16 or AMX CPU are encoded again by a float32 re-index on
    another kind (and the reverse), rather than kept under a manifest that says float32 (issue 58, item 10).
    """
    if kept is None:
        return None
    if kept.manifest.fingerprint != info.fingerprint:
        log.info("the encoder, adapter, head or router changed since the last build: encoding every row")
    elif kept.manifest.precision != encoder_precision(info.encoder):
        log.info(
            "the last build encoded in %s, this one in %s (another CPU kind): encoding every row",
            kept.manifest.precision,
            encoder_precision(info.encoder),
        )
    else:
        return kept
    kept.vectors.close()
    return None


@dataclass
class _Progress:
    key: str
    chunks_done: int = 0
    rows_done: int = 0
    n_encoded: int = 0
    n_reused: int = 0


def _load_progress(staging: Path, key: str) -> _Progress | None:
    path = staging / _PROGRESS
    try:
        with open_regular(path) as fh:
            raw = json.loads(read_capped(fh, _PROGRESS_MAX_BYTES, path).decode("utf-8"))
        state = _Progress(**raw)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, CondsearchError) as exc:  # damaged or not a file: start afresh
        log.warning("%s; starting this build from its first row", first_line(exc))
        return None
    counts = (state.chunks_done, state.rows_done, state.n_encoded, state.n_reused)
    if not isinstance(state.key, str) or not all(type(c) is int and c >= 0 for c in counts):
        return None
    return state if state.key == key and (staging / VECTORS_FILE).is_file() else None


def _save_progress(staging: Path, state: _Progress) -> None:
    with replacing_file(staging / _PROGRESS) as tmp:
        tmp.write_text(json.dumps(asdict(state)), encoding="utf-8")


def _encode_chunks(
    corpus: CorpusSource,
    condition: str,
    vectorizer: Vectorizer,
    draft: Draft,
    kept: KeptVectors | None,
    info: ModelIdentity,
    batch_size: int,
    chunk_rows: int,
    full: bool,
    progress: bool,
) -> tuple[int, int, int]:
    """Fill the staging folder's vectors.npy and rows.parquet; return (encoded, reused, resumed) row counts."""
    n, dim = len(corpus), vectorizer.dim
    staging = draft.staging
    # the precision too: a build cut off on one CPU kind is not resumed in another's dtype
    # a build that kept other columns is not resumed into this one's rows
    fields = [
        corpus.checksum,
        corpus.path,
        condition,
        info.fingerprint,
        chunk_rows,
        n,
        dim,
        str(kept_schema(corpus) or ""),
    ]
    key = hashlib.sha256(json.dumps([*fields, encoder_precision(info.encoder)]).encode()).hexdigest()
    state = None if full else _load_progress(staging, key)
    if state is None:
        draft.discard_staging()
        (staging / _CHUNKS).mkdir(parents=True)
        state = _Progress(key)
        _save_progress(staging, state)
    resumed = state.rows_done
    if resumed:
        log.info("resuming %r after %d finished rows", condition, resumed)
    previous = {i: (pos, h) for pos, (i, h) in enumerate(zip(kept.ids, kept.hashes, strict=True))} if kept else {}
    writer = VectorWriter(staging / VECTORS_FILE, (n, dim), resume=resumed > 0)
    if resumed and not writer.resumed:  # the staged vectors are gone or damaged: what they held is lost
        log.warning(
            "the staged vectors of %r do not match their progress record; starting from the first row", condition
        )
        state, resumed = _Progress(key), 0
        _save_progress(staging, state)
    bar = progress_bar(total=n, initial=resumed, unit="row", desc=f"indexing {condition[:30]!r}", enabled=progress)
    try:
        for k, (ids, texts, columns) in enumerate(corpus_chunks(corpus, chunk_rows)):
            if k < state.chunks_done:
                continue
            hashes = [text_hash(t) for t in texts]
            out, n_encoded = _chunk_vectors(ids, texts, hashes, previous, kept, condition, vectorizer, batch_size)
            writer.write(state.rows_done, out)
            writer.sync()
            chunk = rows_table(ids, texts, columns, hashes)
            with replacing_file(staging / _CHUNKS / f"{k:08d}.parquet") as tmp:
                pq.write_table(chunk, tmp)
            state.chunks_done, state.rows_done = k + 1, state.rows_done + len(ids)
            state.n_encoded += n_encoded
            state.n_reused += len(ids) - n_encoded
            _save_progress(staging, state)
            bar.update(len(ids))
            bar.set_postfix(encoded=state.n_encoded, reused=state.n_reused, refresh=False)
    finally:
        bar.close()
        writer.close()
    if state.rows_done != n:
        raise CondsearchError(f"{corpus.path}: read {state.rows_done} rows where {n} were counted; did it change?")
    _merge_rows(staging)
    return state.n_encoded, state.n_reused, resumed


def _chunk_vectors(
    ids: list[str | int],
    texts: list[str],
    hashes: list[bytes],
    previous: dict[str | int, tuple[int, bytes]],
    kept: KeptVectors | None,
    condition: str,
    vectorizer: Vectorizer,
    batch_size: int,
) -> tuple[np.ndarray, int]:
    """Return one chunk's vectors, kept ones copied and the rest encoded, and how many were encoded."""
    reuse_at, reuse_from, encode_at = [], [], []
    for j, (i, h) in enumerate(zip(ids, hashes, strict=True)):
        hit = previous.get(i)
        if hit is not None and hit[1] == h:
            reuse_at.append(j)
            reuse_from.append(hit[0])
        else:
            encode_at.append(j)
    out = np.empty((len(ids), vectorizer.dim), dtype=np.float32)
    if reuse_at and kept is not None:
        out[reuse_at] = kept.vectors.take(reuse_from)
    if encode_at:
        out[encode_at] = vectorizer.encode([texts[j] for j in encode_at], condition, batch_size=batch_size)
    return out, len(encode_at)


def _merge_rows(staging: Path) -> None:
    """Join the chunks' rows files into one rows.parquet, a chunk at a time.

    The new file replaces the old one whole: a published version may share the old one (a hard link).
    """

    def read(part: Path) -> pa.Table:
        with open_regular(part) as fh:
            return pq.ParquetFile(fh).read()

    parts = sorted((staging / _CHUNKS).glob("*.parquet"))
    with replacing_file(staging / ROWS_FILE) as tmp:
        write_tables(tmp, (read(part) for part in parts))


def write_tables(path: Path, tables: Iterable[pa.Table]) -> None:
    """Write tables one after another into one parquet file, each cast to the first one's schema."""
    writer: pq.ParquetWriter | None = None
    try:
        for table in tables:
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table.cast(writer.schema))
    finally:
        if writer is not None:
            writer.close()
