"""The Python API: ``condsearch.open`` a store of indexes, ``index`` texts or tables into it, ``search`` it.

``condsearch.load_model`` loads an encoder in either mode, CASE (with its profile: adapter, head)
or the router tri-encoder (with its router), to encode texts under a condition or to index with;
the mode when none is named is `condsearch index`'s
(:data:`~condsearch.model.artifacts.profiles.DEFAULT_MODE`). A store keeps what it loads: each index
once (again when `condsearch index` replaces it) and one model per model key, shared by every
index built with the same model (the server's :class:`~condsearch.query.resident.Resident`).
Searches answer through :func:`condsearch.query.search.answer`, as the CLI and the server do.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from condsearch.api.arguments import (
    _condition,
    _conditions,
    _ids,
    _k,
    _metadata,
    _mode,
    _router,
    _strings,
)
from condsearch.api.model import Model, load_model
from condsearch.base import IndexConfig
from condsearch.corpus import CorpusConfig
from condsearch.errors import CondsearchError, ModelError, UnknownCondition
from condsearch.model.artifacts import MODE_AUTO, MODE_CSR, ROUTER_AUTO, Mode, resolve_router
from condsearch.model.encoders import CpuConfig
from condsearch.query import QueryConfig, is_milvus

if TYPE_CHECKING:
    from condsearch.ingest import ChangeReport
    from condsearch.model import Vectorizer
    from condsearch.query import Hits, LoadedIndex, Resident
    from condsearch.store import CorpusInfo, IndexStore, Manifest

#: the corpus name of data given in memory, where a file's would be its stem
MEMORY_NAME = "corpus"
#: how the API's errors tell the caller to name a corpus
CORPUS_KEYWORD = "corpus="


class Store:
    """A folder of indexes (or a Milvus database, searched only): index into it, search it.

    ``model`` is what :meth:`index` encodes with, in its own mode [default: :func:`load_model`'s in
    the mode and router :meth:`index` names, each loaded on first use]. A search uses the model each
    index records (CASE or router), loaded once per model key; ``device``, ``threads`` and
    ``trust_remote_code`` apply to those loads.
    """

    def __init__(
        self,
        location: str | Path | None = None,
        *,
        model: Model | None = None,
        device: str | None = None,
        threads: int | None = CpuConfig.threads,
        trust_remote_code: bool = False,
    ) -> None:
        from condsearch.defaults import default_index_dir
        from condsearch.query import Resident
        from condsearch.store import IndexStore

        self.location = str(location if location is not None else default_index_dir())
        self.milvus = is_milvus(self.location)
        self._model = model  # given: index() encodes with it, and a mode or router it is not is refused
        self._loaded: dict[tuple[Mode, str | None], Model] = {}  # loaded for index(), by mode and router
        self.device, self.threads, self.trust_remote_code = device, threads, trust_remote_code
        self._models: dict[str, Vectorizer] = {}  # by model key: those loaded for searches and those indexed with
        self._store: IndexStore | None = None
        self._resident: Resident | None = None
        if not self.milvus:
            self._store = IndexStore(self.location)
            self._resident = Resident(
                self._store, self._vectorizer, reload_interval_s=0.0, corpus_option=CORPUS_KEYWORD
            )

    def __repr__(self) -> str:
        return f"condsearch.Store({self.location!r})"

    def _vectorizer(self, manifest: Manifest) -> Vectorizer:
        """Return the model an index needs: one this store holds under its key, else loaded as the server loads it.

        ``load_model_for("resident")`` (:mod:`condsearch.model.loader`) is the server's too (onnxruntime on
        the CPU where the index allows it), so a search here answers exactly as `condsearch serve` does.
        """
        from condsearch.model import load_model_for
        from condsearch.model.encoders import Runtime, available_cores
        from condsearch.query import vectorizer_key

        key = vectorizer_key(manifest)
        if key not in self._models:
            threads = self.threads or available_cores()  # as the server's ServeConfig.encode_threads
            runtime = Runtime(device=self.device, threads=threads, trust_remote_code=self.trust_remote_code)
            self._models[key] = load_model_for("resident", manifest, runtime=runtime)
        return self._models[key]

    def index(
        self,
        data: Sequence[str] | Any,
        conditions: str | Sequence[str],
        *,
        ids: Sequence[str | int] | None = None,
        name: str | None = None,
        text_column: str = CorpusConfig.text_column,
        id_column: str | None = CorpusConfig.id_column,
        format: str | None = CorpusConfig.format,
        keep_columns: Sequence[str] | None = CorpusConfig.keep_columns,
        factory: str = IndexConfig.factory,
        search_params: str = IndexConfig.search_params,
        full: bool = False,
        progress: bool = False,
        mode: str | None = None,
        router: str | Path | None = None,
    ) -> list[str]:
        """Index data under each condition, as `condsearch index` does; return the indexes' names.

        ``data``: a list of texts (``ids``: one each [default: row numbers]), a pandas DataFrame, a
        pyarrow Table, or the path of a .parquet, .csv or .jsonl/.ndjson file (``format`` names
        another's). ``keep_columns``: the table's or file's other columns kept beside each row, in their types, for
        :meth:`search`'s ``where`` filters and each hit's ``metadata`` [default: all; ``[]``: none] (as
        `condsearch index --keep-columns`). ``name``: the corpus [default: the file's stem, else "corpus"]. Re-indexing
        encodes only new or changed rows (``full``: all). ``mode`` and ``router`` are
        :func:`load_model`'s (as `condsearch index --mode --router`): the store's model, when it was
        opened with one, must be that mode and router (else a one-line CondsearchError); without
        one, the default model is loaded so [default: :func:`load_model`'s].
        """
        from condsearch.corpus import memory_corpus, scan_corpus
        from condsearch.ingest import index_conditions
        from condsearch.query import vectorizer_key
        from condsearch.store import kept_mode

        if self._store is None:
            raise CondsearchError(
                f"{self.location}: a Milvus store is searched here; index into a folder and publish it with "
                "`condsearch export` or `condsearch index --store`"
            )
        wanted = _conditions(conditions)
        named = name or (Path(data).stem if isinstance(data, str | Path) else MEMORY_NAME)
        kept = kept_mode(self._store.manifests(), named, wanted) if mode in (None, MODE_AUTO) else None
        model = self._indexing_model(mode, router, kept)  # bad or conflicting keywords are refused before any reading
        if isinstance(data, str | Path):
            if ids is not None:
                raise CondsearchError("ids= goes with a list of texts; a file's ids are its id column")
            corpus: Any = scan_corpus(data, text_column, id_column, format=format, keep=keep_columns)
            name = named
        else:
            if format is not None:
                raise CondsearchError("format= names a file's format; data in memory has none")
            corpus = memory_corpus(data, ids=ids, text_column=text_column, id_column=id_column, keep=keep_columns)
            name = named
        vec = model.vectorizer
        store = self._store
        build: dict[str, Any] = {"factory": factory, "search_params": search_params, "full": full, "progress": progress}
        reports = index_conditions(corpus, wanted, vec, store, corpus_name=name, **build)
        for report in reports:  # searches of these indexes reuse the model that built them
            self._models.setdefault(vectorizer_key(store.read_manifest(report.name)), vec)
        return [r.name for r in reports]

    def _indexing_model(self, mode: object, router: object, kept: Mode | None = None) -> Model:
        """Return what index() encodes with: the store's model, checked against mode and router, else one loaded.

        ``kept``: the mode of the corpus's indexes already here, which mode 'auto' (or None) keeps.
        """
        folder = _router(router)
        routed = folder not in (None, ROUTER_AUTO)
        if self._model is not None:  # the store's model: a mode named must be its own ('auto' names none)
            named = None if mode in (None, MODE_AUTO) else _mode(mode, None, profile=False, router=routed)
            _check_agrees(self._model, named, folder)
            return self._model
        key = (_mode(mode, None, profile=False, router=routed, kept=kept), None if folder == ROUTER_AUTO else folder)
        if key not in self._loaded:
            self._loaded[key] = load_model(
                mode=key[0],
                router=folder,
                device=self.device,
                threads=self.threads,
                trust_remote_code=self.trust_remote_code,
            )
        return self._loaded[key]

    @overload
    def search(  # type: ignore[overload-overlap]  # a str is a Sequence[str] too: one query, one Hits
        self,
        queries: str,
        *,
        condition: str,
        k: int = ...,
        corpus: str | None = ...,
        calibrated: bool = ...,
        build: bool = ...,
        where: str | None = ...,
    ) -> Hits: ...
    @overload
    def search(
        self,
        queries: Sequence[str],
        *,
        condition: str,
        k: int = ...,
        corpus: str | None = ...,
        calibrated: bool = ...,
        build: bool = ...,
        where: str | None = ...,
    ) -> builtins.list[Hits]: ...
    def search(
        self,
        queries: str | Sequence[str],
        *,
        condition: str,
        k: int = QueryConfig.k,
        corpus: str | None = None,
        calibrated: bool = False,
        build: bool = True,
        where: str | None = None,
    ) -> Hits | list[Hits]:
        """Return the k best rows of condition's index for a query (Hits), or for each of a list (a list of Hits).

        A k larger than the index returns every row. ``corpus`` picks among corpora indexed under
        the same condition. ``calibrated`` also sets each hit's ``z``, its score's standard score
        against the index's background (:mod:`condsearch.query.calibration`); an index that records none
        raises CondsearchError naming the fix. ``build``: a condition not yet indexed for a corpus
        indexed with mode='csr' is indexed first, from the router's cached sentence states, as
        `condsearch query` does (:func:`condsearch.query.on_demand.build_on_demand`); False raises
        :class:`~condsearch.errors.UnknownCondition` instead, as does a Milvus store, which cannot build.
        ``where``: a SQL condition on the index's kept columns (``"lang = 'en' AND year >= 2020"``,
        :mod:`condsearch.query.filters`): only the rows it keeps are ranked, and each hit's ``metadata`` holds
        its kept columns; a bad one raises :class:`~condsearch.errors.FilterError` in one line, and one that
        keeps no row finds nothing.
        """
        from condsearch.query import answer

        texts = _strings([queries] if isinstance(queries, str) else queries, "queries", "query")
        condition, k = _condition(condition), _k(k)
        if not isinstance(build, bool):
            raise CondsearchError(f"build must be True or False, not {type(build).__name__}")
        if self._resident is not None:
            loaded = self._loaded_index(self._resident, condition, corpus, build=build)
            vec = self._resident.vectorizer(loaded.model_key)
            found = answer(loaded, vec, texts, k, calibrated=calibrated, where=where)
        else:
            from condsearch.query import open_index

            try:
                with open_index(self.location, condition, corpus, corpus_option=CORPUS_KEYWORD) as index:
                    vec = self._vectorizer(index.manifest)
                    found = answer(index, vec, texts, k, calibrated=calibrated, where=where)
            except UnknownCondition as exc:
                if not build:
                    raise
                cannot = "; a Milvus store cannot build one on demand: index it into a folder"
                raise UnknownCondition(str(exc) + cannot, exc.conditions) from exc
        hits = found.hits
        return hits[0] if isinstance(queries, str) else hits

    def _loaded_index(self, resident: Resident, condition: str, corpus: str | None, *, build: bool) -> LoadedIndex:
        """Return condition's resident index; where there is none, build it on demand first (with ``build``)."""
        from condsearch.model.encoders import Runtime
        from condsearch.query import build_on_demand

        try:
            return resident.get(condition, corpus)
        except UnknownCondition as exc:
            if not build or self._store is None:
                raise
            unknown = exc
        runtime = Runtime(device=self.device, threads=self.threads, trust_remote_code=self.trust_remote_code)
        made = build_on_demand(
            self._store, condition, corpus, runtime=runtime, corpus_option=CORPUS_KEYWORD, unknown=unknown
        )
        # answered as any search of that index is (the builder may route on onnxruntime, as `index` does)
        return resident.get(condition, made.corpus_name)

    # ------------------------------------------------------------------ change by id, lifecycle (issue 59)

    def _folder_store(self, what: str) -> IndexStore:
        if self._store is None:
            raise CondsearchError(f"{self.location}: a Milvus store is searched here; {what} in a folder store")
        return self._store

    def list(self) -> builtins.list[CorpusInfo]:
        """Return the store's corpora: each one's name, row count and conditions (with their index names)."""
        from condsearch.store import corpora

        return corpora(self._folder_store("list corpora"))

    def count(self, corpus: str | None = None) -> int:
        """Return the rows of a corpus [default: the store's only one]."""
        from condsearch.store import corpus_indexes

        return max(m.n_vectors for _, m in corpus_indexes(self._folder_store("count rows"), corpus)[1])

    def get(self, ids: Sequence[str | int], *, corpus: str | None = None) -> builtins.list[dict[str, Any]]:
        """Return ``{"id", "text"}`` of each id, in the order given (and ``metadata``, its kept columns, where the
        corpus keeps any); ids not in the corpus raise one line."""
        from condsearch.store import corpus_indexes, match_ids, read_kept_columns, read_rows

        store = self._folder_store("read rows")
        name, mine = corpus_indexes(store, corpus)
        stored, texts = read_rows(store, mine[0][0])
        at = match_ids(_ids(ids), stored, name)
        rows: builtins.list[dict[str, Any]] = [{"id": stored[p], "text": texts[p]} for p in at]
        kept = read_kept_columns(store, mine[0][0])
        if kept.num_columns:
            for row, values in zip(rows, kept.take(at).to_pylist(), strict=True):
                row["metadata"] = values
        return rows

    def delete(self, ids: Sequence[str | int], *, corpus: str | None = None) -> ChangeReport:
        """Delete rows by id from every index of a corpus at once, encoding nothing (atomic per index, all or none)."""
        from condsearch.ingest import change_corpus

        return change_corpus(self._folder_store("delete rows"), corpus, delete=_ids(ids))

    def upsert(
        self,
        texts: Sequence[str],
        *,
        ids: Sequence[str | int],
        corpus: str | None = None,
        metadata: Sequence[dict[str, Any] | None] | Any | None = None,
    ) -> ChangeReport:
        """Insert or replace rows by id in every index of a corpus at once, encoding only new or changed texts.

        ``metadata``: the kept columns' values of each row (issue 59), one dict per text (or a pandas DataFrame or
        pyarrow Table, a row per text): an upserted row takes the values given and keeps its other columns' (a new
        row: null). A column the corpus does not keep, or a value not of its type, raises one line, changing nothing.
        """
        from condsearch.ingest import change_corpus

        texts, given = _strings(texts, "texts", "text"), _ids(ids)
        if len(texts) != len(given):
            raise CondsearchError(f"{len(texts)} texts and {len(given)} ids: give one id per text")
        pairs = list(zip(given, texts, strict=True))
        values = _metadata(metadata, len(texts))
        store = self._folder_store("upsert rows")
        return change_corpus(store, corpus, upsert=pairs, vectorizer=self._changer, metadata=values)

    def drop(self, corpus: str | None = None, condition: str | None = None) -> builtins.list[str]:
        """Remove a corpus's indexes (or only condition's) and their files; return the names removed.

        Refused in one line while a build or change of the corpus is under way. Queries under way finish.
        """
        from condsearch.store import drop

        return drop(self._folder_store("drop indexes"), corpus, None if condition is None else _condition(condition))

    def _changer(self, manifest: Manifest) -> Vectorizer:
        """Return the model that encodes an upsert into an index: the store's when it made the index, else its own."""
        from condsearch.model import ModelIdentity

        if self._model is not None and ModelIdentity.of_vectorizer(self._model.vectorizer).fingerprint == (
            manifest.fingerprint
        ):
            return self._model.vectorizer
        return self._vectorizer(manifest)


def _check_agrees(model: Model, mode: Mode | None, router: str | None) -> None:
    """Refuse, in one line, a mode or router named beside a model that is not in that mode or with that router."""
    if mode is not None and mode != model.mode:
        raise CondsearchError(
            f"mode={mode!r} conflicts with the store's model (mode {model.mode!r}); open the store without "
            "model= to index in another mode"
        )
    if router is None:
        return
    if model.mode != MODE_CSR:
        raise ModelError("router= applies to mode='csr'")
    named = resolve_router(router, model.model_id)
    profile = model.vectorizer.profile
    loaded = profile.router if profile is not None else None
    if (named and named.resolve()) != (loaded and Path(loaded).resolve()):
        raise CondsearchError(
            f"router={router!r} conflicts with the store's model (router {model.router!r}); open the store "
            "without model= to index with another router"
        )


def open(
    location: str | Path | None = None,
    *,
    model: Model | None = None,
    device: str | None = None,
    threads: int | None = CpuConfig.threads,
    trust_remote_code: bool = False,
) -> Store:
    """Return the store at location: a folder of indexes (made when first indexed into), or a Milvus URI.

    ``location`` defaults to the CLI's: ``$CONDSEARCH_INDEX_DIR``, else ``./indexes``.
    ``milvus-lite:PATH.db`` and ``milvus://HOST:PORT`` open Milvus (condsearch[milvus]) for search.
    See :class:`Store` for the keywords.
    """
    return Store(location, model=model, device=device, threads=threads, trust_remote_code=trust_remote_code)
