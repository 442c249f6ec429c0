"""Conditions on demand: index a router corpus under a condition nobody indexed, from its cached sentence states.

A corpus indexed with ``--mode csr`` under some conditions (its *siblings*) holds what another
condition needs: its rows (each sibling's ``rows.parquet`` keeps ids and texts, so the corpus file
is not read) and the spec its model was loaded from (the manifest's ``spec``). :func:`build_on_demand`
loads that model as `condsearch index` does, refuses it when its router or encoder is no longer the
one the siblings were built with, and indexes the rows through the one ingest path
(:func:`condsearch.ingest.chunks.build_condition_index`: the writer lock, atomic publish, resumable
staging) with the sibling's factory and search parameters. The index is the one `condsearch index -c
CONDITION` on those rows gives. The router's state cache makes it cheap: only the per-pair
remainder runs. Where the cache lacks a row's states (another machine, a cleared cache) they are
encoded again, said in one line first.

Builders of one index take its build lock (``.versions/<name>.build.lock``) and look again once they
hold it: of two builds of one condition, the second finds the first's index and uses it. They claim the
corpus first (:mod:`condsearch.store.claims`): a drop of it is refused while they build.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from condsearch.errors import (
    AmbiguousCondition,
    CondsearchError,
    NotBuildable,
    StoreError,
    UnknownCondition,
    first_line,
)
from condsearch.model.artifacts.profiles import MODE_CASE, MODE_CSR
from condsearch.model.encoders.cpu import Backend, CpuConfig
from condsearch.model.encoders.first_use import LoadedOnce
from condsearch.model.encoders.spec import Runtime
from condsearch.progress import CACHING_SENTENCES, ROUTING, listening
from condsearch.query.search import vectorizer_key
from condsearch.store.conditions import check_new_condition
from condsearch.store.listing import (
    MAX_LISTED,
    Listing,
    case_variant,
    case_variant_refusal,
    condition_key,
    known_note,
)
from condsearch.store.manifest import Manifest

if TYPE_CHECKING:
    import pyarrow as pa

    from condsearch.model.vectorizer import Vectorizer
    from condsearch.store.folder import IndexStore

log = logging.getLogger(__name__)

BUILD_LOCK = ".build.lock"
#: seconds a build's model is kept after the last build asked for it, for the next build of a burst
BUILD_MODEL_KEEP_S = 120.0
#: the models of builds under way (and of the last two minutes), one per model key however many builds use it
_BUILD_MODELS: LoadedOnce[Vectorizer] = LoadedOnce(keep_s=BUILD_MODEL_KEEP_S)


@dataclass(frozen=True)
class OnDemand:
    """The index of a condition built on demand (``built``), or found published by another build first."""

    name: str
    corpus_name: str
    built: bool
    n_rows: int
    #: rows whose sentence states were not cached and were encoded again
    n_states_encoded: int = 0


@dataclass(frozen=True)
class Plan:
    """What a build on demand of ``condition`` would do: index ``n_rows`` rows of ``corpus_name`` like ``source``."""

    condition: str
    corpus_name: str
    source_name: str
    source: Manifest
    #: the conditions the corpus is indexed under
    indexed: tuple[str, ...]

    @property
    def n_rows(self) -> int:
        return self.source.n_vectors


@dataclass
class _IndexedRows:
    """A sibling index's rows, read as ingestion reads a corpus, under the corpus path and checksum it records."""

    path: str
    checksum: str
    n_skipped: int
    ids: list[str | int]
    texts: list[str]
    #: told (rows indexed, rows in all) as each batch is asked for, as the router encodes it (:meth:`heard`), and
    #: once all are
    on_rows: Callable[[int, int], None] | None = None
    #: the sibling's kept columns (issue 59), which the new index keeps too; None where it keeps none
    metadata: pa.Table | None = None
    #: the batch being encoded: (its first row, its rows)
    _batch: tuple[int, int] = (0, 0)
    #: whether the batch being encoded had sentence states to encode again (the first half of its work then)
    _encoding_states: bool = False

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def metadata_schema(self) -> pa.Schema | None:
        return self.metadata.schema if self.metadata is not None and self.metadata.num_columns else None

    def chunks(self, rows: int) -> Iterator[tuple[list[str | int], list[str], pa.Table | None]]:
        start = 0
        for ids, texts in self.batches(rows):
            kept = self.metadata.slice(start, len(ids)) if self.metadata is not None else None
            yield ids, texts, kept
            start += len(ids)

    def batches(self, rows: int) -> Iterator[tuple[list[str | int], list[str]]]:
        for start in range(0, len(self.ids), rows):
            self._batch, self._encoding_states = (start, min(rows, len(self.ids) - start)), False
            if self.on_rows is not None:  # the ingest asks for a batch once the previous one is written
                self.on_rows(start, len(self.ids))
            yield self.ids[start : start + rows], self.texts[start : start + rows]
        if self.on_rows is not None:
            self.on_rows(len(self.ids), len(self.ids))

    def heard(self, bar: str, done: int, total: int) -> None:
        """Tell on_rows how far the batch's encoding is, from the router's bars (:func:`condsearch.progress.listening`).

        A batch of 8,192 rows took 12.8 s with its progress at its first row throughout (issue 59); its rows
        are told as they are routed, in steps of an encoding batch. Sentence states encoded again (a cleared
        cache) count as the first half of the batch's work.
        """
        if self.on_rows is None or total <= 0 or bar not in (CACHING_SENTENCES, ROUTING):
            return
        share = min(done / total, 1.0)
        if bar == CACHING_SENTENCES:
            self._encoding_states, share = True, share / 2
        elif self._encoding_states:
            share = 0.5 + share / 2
        start, size = self._batch
        self.on_rows(start + int(size * share), len(self.ids))


def build_on_demand(
    store: IndexStore,
    condition: str,
    corpus: str | None = None,
    *,
    runtime: Runtime = Runtime(),  # noqa: B008 - frozen
    backend: Backend = CpuConfig.backend,
    progress: bool = False,
    notice: Callable[[str], None] = log.warning,
    announce: Callable[[str], None] = log.info,
    corpus_option: str = "--corpus",
    unknown: UnknownCondition | None = None,
    on_rows: Callable[[int, int], None] | None = None,
    name_paths: bool = True,
    case_variants: bool = True,
) -> OnDemand:
    """Index corpus's rows under condition with the model of its router indexes, unless another build did first.

    ``corpus`` names the corpus among several; ``backend`` runs the model as `condsearch index
    --backend` does; ``announce`` is told, in one line, that a build starts, and ``notice`` when
    sentence states are encoded again; ``corpus_option`` is how the front end names the corpus in
    errors; ``unknown``, the front end's refusal of the unindexed condition, leads any refusal to
    build, so that its list of what is indexed stays in view (why no index can be under the condition,
    too long or holding a control character, comes before it: issue 59). Raises CondsearchError in one line,
    before anything is written: a condition that is empty, too long or has control characters
    (:func:`condsearch.store.conditions.check_new_condition`), no index of the corpus, several corpora and
    none named, a corpus indexed with --mode case or with several models, or a router or encoder that
    changed since the corpus was indexed. ``on_rows`` is told (rows indexed, rows in all) as the build
    goes, within each chunk of the ingest (:data:`condsearch.ingest.chunks.CHUNK_ROWS` rows) as the router
    encodes it. With ``name_paths`` False (a server), refusals name no path of this machine: the store, corpus
    file or router folder. With ``case_variants`` False, a condition that differs from one the corpus has an
    index under only in case is refused (:class:`~condsearch.errors.CaseVariant`, naming that one), before
    anything loads: the CLI asks first, the server answers 409 unless forced.
    """
    from filelock import FileLock

    from condsearch.store.claims import claim
    from condsearch.store.folder import VERSIONS, index_name

    plan = plan_on_demand(
        store,
        condition,
        corpus,
        corpus_option=corpus_option,
        unknown=unknown,
        name_paths=name_paths,
        case_variants=case_variants,
    )
    condition, corpus_name, source_name, source = plan.condition, plan.corpus_name, plan.source_name, plan.source
    try:  # every refusal comes before anything is written
        if (found := _published(store, condition, corpus_name)) is not None:
            return found
        indexed = known_note(plan.indexed)
        announce(
            f"{condition!r} is not indexed for corpus {corpus_name!r} (indexed: {indexed}); indexing it now, on "
            "demand, from the router's cached sentence states"
        )
        vectorizer = _load_model(source, corpus_name, runtime, backend, name_paths)  # a changed router is refused
    except CondsearchError as exc:
        if unknown is None:
            raise
        raise _after(unknown, exc) from exc
    name = index_name(corpus_name, condition)
    (store.root / VERSIONS).mkdir(parents=True, exist_ok=True)
    with claim(store.root, corpus_name, name), FileLock(store.root / VERSIONS / f"{name}{BUILD_LOCK}"):
        if (found := _published(store, condition, corpus_name)) is not None:  # by a build this one waited for
            return found
        if not (store.root / source_name).exists():  # dropped before this build claimed the corpus (issue 59)
            gone = NotBuildable(f"corpus {corpus_name!r} was removed before {condition!r} could be built from it")
            raise gone if unknown is None else _after(unknown, gone)
        stored = store.load(source_name, verify=True)  # every byte checked: no damaged row seeds a new index
        rows = _IndexedRows(
            source.corpus_path,
            source.corpus_checksum,
            source.n_skipped,
            stored.ids,
            stored.texts,
            on_rows,
            metadata=stored.metadata,
        )
        encoded = _uncached_states(vectorizer, rows.texts)
        if encoded:
            notice(
                f"the sentence states of {encoded} of {len(rows)} rows of corpus {corpus_name!r} are not in the "
                "cache (another machine, or a cleared cache): encoding them again"
            )
        from condsearch.ingest.chunks import build_condition_index

        with listening(rows.heard):  # the router's bars tell how far each batch is
            report = build_condition_index(
                rows,
                condition,
                vectorizer,
                store,
                corpus_name=corpus_name,
                factory=source.factory,
                search_params=source.search_params,
                progress=progress,
            )
    return OnDemand(report.name, corpus_name, True, report.n_rows, encoded)


def plan_on_demand(
    store: IndexStore,
    condition: str,
    corpus: str | None = None,
    *,
    corpus_option: str = "--corpus",
    unknown: UnknownCondition | None = None,
    name_paths: bool = True,
    listing: Listing | None = None,
    case_variants: bool = True,
) -> Plan:
    """Return what building condition on demand would index, reading only manifests; refuse as build_on_demand does.

    Refuses, in one line: a bad condition, no index of the corpus, several corpora and none named, a
    corpus indexed with --mode case or with several models. A router that changed since is found only
    when the model loads (:func:`build_on_demand`). ``listing``: the store's, where the caller has it read.
    With ``case_variants`` False, refuses a condition that differs from an indexed one of the corpus only in case
    (:class:`~condsearch.errors.CaseVariant`).
    """
    try:
        condition = check_new_condition(condition)
    except CondsearchError as exc:
        if unknown is None:
            raise
        raise _reason_first(unknown, exc) from exc
    try:
        listing = store.manifests() if listing is None else listing
        corpus_name, siblings = _siblings(store, listing, condition, corpus, corpus_option, name_paths)
        source_name, source = _one_model(corpus_name, siblings, condition, name_paths)
        condition = condition_key(condition, source.model_id)  # lower-cased for an uncased model
    except CondsearchError as exc:
        if unknown is None:
            raise
        raise _after(unknown, exc) from exc
    if not case_variants and (existing := case_variant(listing, corpus_name, condition)) is not None:
        raise case_variant_refusal(corpus_name, condition, existing)
    return Plan(condition, corpus_name, source_name, source, tuple(sorted(m.condition for _, m in siblings)))


def _reason_first(unknown: UnknownCondition, exc: CondsearchError) -> CondsearchError:
    """Return exc, of its type, its one line (why no index can be under the condition) before unknown's refusal."""
    reason, asked = first_line(exc), first_line(unknown)
    return type(exc)(asked if asked.startswith(reason) else f"{reason}; {asked}")


def _after(unknown: UnknownCondition, exc: CondsearchError) -> CondsearchError:
    """Return exc, of its type, its one line after the line of the refusal that asked for the build."""
    message = f"{first_line(unknown)}; {first_line(exc)}"
    if isinstance(exc, AmbiguousCondition):
        return AmbiguousCondition(message, exc.corpora)
    if isinstance(exc, UnknownCondition):
        return UnknownCondition(message, exc.conditions)
    return type(exc)(message)


def _published(store: IndexStore, condition: str, corpus_name: str) -> OnDemand | None:
    """Return the index of (corpus, condition) if one is published, else None."""
    try:
        name = store.find(condition, corpus_name)
    except UnknownCondition:
        return None
    return OnDemand(name, corpus_name, False, store.read_manifest(name).n_vectors)


def _siblings(
    store: IndexStore, listing: Listing, condition: str, corpus: str | None, corpus_option: str, name_paths: bool
) -> tuple[str, list[tuple[str, Manifest]]]:
    """Return the corpus to build for and its indexes; refuse no index, or several corpora and none named."""
    readable = [(n, m) for n, m in listing if isinstance(m, Manifest)]
    corpora = sorted({m.corpus_name for _, m in readable})
    if corpus is None and len(corpora) > 1:
        raise AmbiguousCondition(
            f"condition {condition!r} is not indexed; several corpora could build it ({', '.join(corpora)}): "
            f"choose one with {corpus_option}",
            corpora,
        )
    chosen = corpus if corpus is not None else (corpora[0] if corpora else None)
    siblings = [(n, m) for n, m in readable if m.corpus_name == chosen]
    if chosen is None or not siblings:
        scope = f"corpus {corpus!r}" if corpus is not None else "any corpus"
        where = f" in {store.root}" if name_paths else ""
        raise UnknownCondition(
            f"no index of {scope}{where} to build condition {condition!r} from; index the corpus first: "
            f"condsearch index CORPUS --mode csr -c {shlex.quote(condition)}",
            sorted({m.condition for _, m in readable if corpus in (None, m.corpus_name)})[:MAX_LISTED],
        )
    return chosen, siblings


def _one_model(
    corpus_name: str, siblings: list[tuple[str, Manifest]], condition: str, name_paths: bool
) -> tuple[str, Manifest]:
    """Return the newest sibling, once every sibling was built by one router model; refuse CASE and mixed corpora."""
    models: dict[str, list[tuple[str, Manifest]]] = {}
    for name, m in siblings:
        models.setdefault(vectorizer_key(m), []).append((name, m))
    if len(models) > 1:
        built = "; ".join(
            f"{_model_of(group[0][1], name_paths)}: {known_note(sorted(m.condition for _, m in group), 3)}"
            for group in models.values()
        )
        raise StoreError(
            f"corpus {corpus_name!r} is indexed with several models ({built}); a condition is built on demand with "
            f"one: re-index the corpus with one, or index {condition!r} with condsearch index"
        )
    newest = max(siblings, key=lambda s: s[1].created_at)
    m = newest[1]
    corpus_file = shlex.quote(m.corpus_path) if name_paths else "FILE"
    if m.mode != MODE_CSR:
        mode = m.mode if m.mode == MODE_CASE else repr(m.mode)
        raise NotBuildable(
            f"corpus {corpus_name!r} was indexed with --mode {mode}; a condition can be built on demand only for "
            f"--mode csr corpora: run condsearch index {corpus_file} --name {shlex.quote(corpus_name)} "
            f"-c {shlex.quote(condition)} (with the flags it was indexed with)"
        )
    return newest


def _model_of(m: Manifest, name_paths: bool) -> str:
    """Return a few words naming the model an index was built with: mode, model, router or profile."""
    if m.mode == MODE_CSR:
        checksum = str(m.encoder.get("router_checksum") or "")
        return f"csr {m.model_id} router {_router(m, name_paths)}" + (f" ({checksum[:12]})" if checksum else "")
    return f"{m.mode} {m.model_id} profile {m.head}"


def _router(m: Manifest, name_paths: bool) -> str:
    """Return the router an index records: as recorded, or without its folder where paths are not named."""
    router = str(m.encoder.get("router"))
    return router if name_paths else os.path.basename(router.rstrip("/\\")) or router


def _load_model(source: Manifest, corpus_name: str, runtime: Runtime, backend: Backend, name_paths: bool) -> Vectorizer:
    """Return the model the corpus's indexes record, loaded as `condsearch index` does; refuse one that changed since.

    Builds under way at once share one copy per model (:data:`_BUILD_MODELS`): the first loads it and
    the others wait, rather than each loading its own at the same moment (issue 58, item 4).
    """
    from condsearch.base.cpu_kind import cpu_kind
    from condsearch.base.output_cache import default_cache_dir

    # the CPU kind picks auto's path; the cache folder is the router's sentence states (a kept model reads its own)
    key = (vectorizer_key(source), runtime, backend, cpu_kind(), default_cache_dir())
    return _BUILD_MODELS.get(key, lambda: _checked_model(source, corpus_name, runtime, backend, name_paths))


def _checked_model(
    source: Manifest, corpus_name: str, runtime: Runtime, backend: Backend, name_paths: bool
) -> Vectorizer:
    """Load the model the corpus's indexes record, as `condsearch index` does; refuse one that changed since."""
    from condsearch.model.encoders.spec import EncoderSpec
    from condsearch.model.identity import ModelIdentity
    from condsearch.model.loader import load_model_for

    vectorizer = load_model_for("bulk", EncoderSpec.of_manifest(source, runtime=runtime), backend=backend)
    info = ModelIdentity.of_vectorizer(vectorizer)
    recorded, loaded = source.encoder.get("router_checksum"), info.encoder.get("router_checksum")
    if recorded != loaded:
        raise StoreError(
            f"corpus {corpus_name!r} was indexed with router {_router(source, name_paths)} "
            f"(sha256 {str(recorded or '-')[:12]}), which has changed since (now {str(loaded or '-')[:12]}); "
            "re-index the corpus, or restore the router it was built with"
        )
    if source.fingerprint and info.fingerprint != source.fingerprint:
        differ = sorted(k for k in {*source.encoder, *info.encoder} if source.encoder.get(k) != info.encoder.get(k))
        raise StoreError(
            f"corpus {corpus_name!r} was indexed with another encoder than {source.model_id} loads now "
            f"({', '.join(differ) or 'its settings'} differ); re-index the corpus"
        )
    return vectorizer


def _uncached_states(vectorizer: Vectorizer, texts: list[str]) -> int:
    """Return how many distinct texts' sentence states the router's cache lacks (0 for a model with no such cache).

    The router names each sentence's cache entry by its state identity and the text
    (:func:`condsearch.model.csr.cache.text_key`); a damaged entry counts as missing, as it does when routing.
    """
    from condsearch.model.csr.cache import StateCache, text_key

    encoder = vectorizer.encoder
    ident, states = getattr(encoder, "_state_ident", None), getattr(encoder, "states", None)
    if not isinstance(ident, str) or not isinstance(states, StateCache):
        return 0
    return len(states.missing([text_key(ident, t) for t in dict.fromkeys(texts)]))
