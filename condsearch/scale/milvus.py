"""Indexes in Milvus: one collection per (corpus, model and head), every condition's vectors in it.

``--store milvus-lite:PATH`` opens Milvus Lite (embedded, in this process; PATH ends in ``.db``),
``--store milvus://HOST:PORT`` a Milvus server (env ``MILVUS_TOKEN``: ``user:password`` or an
API key, when it asks for one).

A collection is named by the corpus and the vector fingerprint (model, revision, pooling,
prompts, adapter, head, router, dimension), so indexes that share an encoder share one. Its
rows carry the condition (as the index name's key: a slug and a hash, never the raw text), a
version tag, the row's position, id (JSON, so ints stay ints) and text, and the vector. The
condition field is the collection's partition key (Milvus Lite 3.2 accepts one too; where a
version refuses, it is a plain field and every search filters on it all the same).

A catalog collection maps each (corpus, condition) key to its current collection, version
tag and manifest (the FAISS store's :class:`~condsearch.store.folder.Manifest`, so the same model,
head, adapter and router checks apply on query). Replacing a condition's vectors inserts them
under a new tag, checks that all arrived, upserts the catalog row (the flip) and only then
deletes the old tag's rows. A reader takes the tag from the catalog, searches only that tag,
and searches again if the tag moved meanwhile (old rows are deleted only after the flip), so
it never sees half an update. Milvus Lite opens a database in one process at a time.

A server (`serve --store`) connects once, at its start (:func:`open_store`), and reads the catalog
as a folder's manifests (:meth:`MilvusStore.manifests`, :meth:`MilvusStore.load_searchable`), so it
finds and reloads Milvus indexes as it does FAISS ones (:class:`condsearch.store.searchable.IndexSource`).

A database opened afresh has its collections released (milvus-lite 3 on every open, a server
after a restart), so each collection is loaded before it is first searched or queried. Errors of
pymilvus and gRPC become one-line StoreErrors; their own error logs (and those of
Milvus Lite's in-process gRPC server, milvus-lite 3) are silenced unless condsearch runs with -v.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from condsearch.base.ann import parse_search_params
from condsearch.base.faiss_indexes import SearchResult
from condsearch.errors import CondsearchError, StoreError, first_line
from condsearch.model.identity import ModelIdentity
from condsearch.scale.extras import MILVUS_LITE, MILVUS_SERVER, missing_extra
from condsearch.scale.lite import check_lite_path
from condsearch.store.folder import Manifest, index_name, manifest_from_dict
from condsearch.store.listing import check_condition, find_index
from condsearch.store.searchable import Found
from condsearch.version import __version__

LITE, SERVER = MILVUS_LITE, MILVUS_SERVER
TOKEN_ENV = "MILVUS_TOKEN"
CATALOG = "condsearch_catalog"
_KEY_LEN = 64
_TEXT_BYTES = 65535  # Milvus's VARCHAR limit
_ID_BYTES = 4096
_ATTEMPTS = 5
MAX_K = 16384  # Milvus's top-k limit
# loggers that print tracebacks of errors condsearch reports itself, in one line: pymilvus's (milvus_client has
# a level of its own), and those of milvus-lite 3's server, which runs in this process (gRPC's logs a traceback
# for each call the server lacks)
ENGINE_LOGGERS = ("pymilvus", "pymilvus.milvus_client", "milvus_lite", "grpc._server")


@dataclass(frozen=True)
class MilvusTarget:
    """A --store value naming Milvus: the URI pymilvus opens and the spec as given."""

    spec: str
    uri: str
    lite: bool


def parse_store(spec: str | None) -> MilvusTarget | None:
    """Return the Milvus target a --store value names, None for the FAISS folder (no value); raise StoreError."""
    if not spec:
        return None
    if spec.startswith(LITE):
        path = spec[len(LITE) :]
        if not path.endswith(".db"):
            raise StoreError(f"--store {spec}: a Milvus Lite file ends in .db (e.g. milvus-lite:indexes/milvus.db)")
        return MilvusTarget(spec, os.path.abspath(path), True)
    if spec.startswith(SERVER):
        host, _, port = spec[len(SERVER) :].rstrip("/").rpartition(":")
        if not host or not port.isdigit():
            raise StoreError(f"--store {spec}: give milvus://HOST:PORT (e.g. milvus://localhost:19530)")
        return MilvusTarget(spec, f"http://{host}:{port}", False)
    raise StoreError(f"--store {spec!r}: give milvus-lite:PATH.db or milvus://HOST:PORT")


@dataclass(frozen=True)
class MilvusIndex:
    """One condition's index in Milvus: its manifest and where its current rows are."""

    key: str  # index_name(corpus, condition), as for the FAISS store
    manifest: Manifest
    collection: str
    tag: str
    index_type: str
    partition_key: bool


def collection_name(corpus_name: str, fingerprint: str) -> str:
    """Return the collection of a (corpus, model and head): a readable slug and a hash."""
    slug = re.sub(r"[^a-z0-9]+", "_", corpus_name.lower()).strip("_")[:40] or "corpus"
    digest = hashlib.sha256(f"{corpus_name}\x00{fingerprint}".encode()).hexdigest()[:12]
    return f"condsearch_{slug}_{digest}"


def milvus_index(factory: str, search_params: str) -> tuple[str, dict[str, int], dict[str, int]]:
    """Return (Milvus index type, build params, search params) for a FAISS factory and its search params."""
    wanted = parse_search_params(search_params)
    search = {}
    if "nprobe" in wanted:
        search["nprobe"] = int(wanted["nprobe"])
    if "efSearch" in wanted:
        search["ef"] = int(wanted["efSearch"])
    if factory == "Flat":
        return "FLAT", {}, {}
    if m := re.fullmatch(r"HNSW(\d+)(,Flat)?", factory):
        return "HNSW", {"M": int(m.group(1)), "efConstruction": 200}, search
    if m := re.fullmatch(r"IVF(\d+),Flat", factory):
        return "IVF_FLAT", {"nlist": int(m.group(1))}, search
    if m := re.fullmatch(r"IVF(\d+),PQ(\d+)(x8)?", factory):
        return "IVF_PQ", {"nlist": int(m.group(1)), "m": int(m.group(2)), "nbits": 8}, search
    return "AUTOINDEX", {}, {}


class MilvusStore:
    """Indexes in one Milvus database; writes replace a condition's vectors atomically.

    ``create=False`` (readers) refuses a Milvus Lite path where no database is yet.
    """

    def __init__(self, target: MilvusTarget, *, create: bool = True) -> None:
        self.target = target
        self.create = create
        self._client: Any = None
        self._loaded: set[str] = set()

    @property
    def client(self) -> Any:
        if self._client is None:
            if self.target.lite:
                check_lite_path(self.target.spec, self.target.uri, create=self.create)
            try:
                from pymilvus import MilvusClient
            except ImportError as exc:
                raise missing_extra("pymilvus", "milvus") from exc
            _quiet_engine_logs()
            try:
                self._client = MilvusClient(uri=self.target.uri, token=os.environ.get(TOKEN_ENV, ""))
            except Exception as exc:  # noqa: BLE001 - pymilvus raises its own and gRPC's errors
                raise StoreError(f"--store {self.target.spec}: cannot open ({_reason(exc)}){self._hint()}") from exc
        return self._client

    def _hint(self) -> str:
        if not self.target.lite:
            return ""
        if os.path.isfile(self.target.uri):  # check_lite_path let it through: milvus-lite 2's SQLite file
            return " (a Milvus Lite 2 database: milvus-lite 3 keeps one in a folder; export it again to a new path)"
        return " (Milvus Lite opens a database in one process at a time)"

    @contextmanager
    def _reporting(self, doing: str) -> Iterator[None]:
        """Turn the errors of pymilvus and gRPC into one-line StoreErrors; condsearch's own pass as they are."""
        try:
            yield
        except CondsearchError:
            raise
        except Exception as exc:  # noqa: BLE001 - MilvusException, grpc.RpcError and whatever else they raise
            raise StoreError(f"--store {self.target.spec}: cannot {doing} ({_reason(exc)})") from exc

    def _load(self, collection: str) -> str:
        """Return collection, loaded first if this store has not loaded it yet (search and query need it)."""
        if collection not in self._loaded:
            self.client.load_collection(collection)
            self._loaded.add(collection)
        return collection

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # ------------------------------------------------------------------ writing

    def write(
        self, manifest: Manifest, ids: Sequence[str | int], texts: Sequence[str], vectors: Any, *, rows: int = 1024
    ) -> MilvusIndex:
        """Replace the vectors of manifest's (corpus, condition): (n, dim) float32 ``vectors`` (array or VectorFile)."""
        n = len(ids)
        if not (n == len(texts) == vectors.shape[0] == manifest.n_vectors) or vectors.shape[1] != manifest.dim:
            raise ValueError("manifest, ids, texts and vectors differ in size")
        with self._reporting("write"):
            return self._write(manifest, ids, texts, vectors, rows)

    def _write(
        self, manifest: Manifest, ids: Sequence[str | int], texts: Sequence[str], vectors: Any, rows: int
    ) -> MilvusIndex:
        n = len(ids)
        key = index_name(manifest.corpus_name, manifest.condition)
        fingerprint = manifest.fingerprint or ModelIdentity.of_manifest(manifest).fingerprint
        collection = collection_name(manifest.corpus_name, fingerprint)
        index_type, build, _ = milvus_index(manifest.factory, manifest.search_params)
        self._ensure_catalog()
        partition_key = self._ensure_collection(collection, manifest.dim, index_type, build)
        tag = f"{time.time_ns()}-{os.getpid()}"
        try:
            for start in range(0, n, rows):
                stop = min(n, start + rows)
                block = np.ascontiguousarray(vectors[start:stop], dtype=np.float32)
                self.client.insert(
                    collection,
                    [
                        {
                            "condition": key,
                            "tag": tag,
                            "row": start + j,
                            "row_id": _checked(json.dumps(ids[start + j], ensure_ascii=False), _ID_BYTES, "an id"),
                            "text": _checked(texts[start + j], _TEXT_BYTES, "a text"),
                            "vector": block[j].tolist(),
                        }
                        for j in range(stop - start)
                    ],
                )
            self.client.flush(collection)
            arrived = self._count(collection, key, tag)
            if arrived != n:
                raise StoreError(f"--store {self.target.spec}: {arrived} of {n} vectors arrived; nothing was replaced")
        except BaseException as exc:
            self._delete(collection, key, tag)
            if isinstance(exc, StoreError) or not isinstance(exc, Exception):
                raise
            raise StoreError(f"--store {self.target.spec}: cannot write ({first_line(exc)})") from exc
        final = Manifest(
            **{**asdict(manifest), "fingerprint": fingerprint, "condsearch_version": __version__}  # type: ignore[arg-type]
        )
        entry = MilvusIndex(key, final, collection, tag, index_type, partition_key)
        before = self._entry(key)
        self.client.upsert(CATALOG, [_catalog_row(entry)])
        self.client.flush(CATALOG)
        if before is not None:  # after the flip: a reader still on the old tag sees it move and searches again
            self._delete(before.collection, key, before.tag)
        return entry

    def _ensure_catalog(self) -> None:
        if self.client.has_collection(CATALOG):
            return
        from pymilvus import DataType, MilvusClient

        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("key", DataType.VARCHAR, max_length=_KEY_LEN, is_primary=True)
        schema.add_field("entry", DataType.VARCHAR, max_length=_TEXT_BYTES)
        schema.add_field("unused", DataType.FLOAT_VECTOR, dim=2)  # Milvus wants a vector field in every collection
        params = self.client.prepare_index_params()
        params.add_index(field_name="unused", index_type="FLAT", metric_type="L2")
        self.client.create_collection(CATALOG, schema=schema, consistency_level="Strong")
        self._index_and_load(CATALOG, params)

    def _index_and_load(self, collection: str, params: Any) -> None:
        # create_collection(index_params=...) waits for the index through AllocTimestamp, which Milvus
        # Lite lacks (its server logs a traceback for it); Lite builds an index at once, so no wait there
        self.client.create_index(collection, params, sync=not self.target.lite)
        self.client.load_collection(collection)
        self._loaded.add(collection)

    def _ensure_collection(self, collection: str, dim: int, index_type: str, build: dict[str, int]) -> bool:
        """Create the collection if missing; return whether its condition field is a partition key."""
        if self.client.has_collection(collection):
            fields = self.client.describe_collection(collection)["fields"]
            return any(f.get("is_partition_key") for f in fields if f["name"] == "condition")
        from pymilvus import DataType, MilvusClient

        def schema(partition_key: bool) -> Any:
            s = MilvusClient.create_schema(auto_id=True, enable_dynamic_field=False)
            s.add_field("pk", DataType.INT64, is_primary=True)
            s.add_field("condition", DataType.VARCHAR, max_length=_KEY_LEN, is_partition_key=partition_key)
            s.add_field("tag", DataType.VARCHAR, max_length=_KEY_LEN)
            s.add_field("row", DataType.INT64)
            s.add_field("row_id", DataType.VARCHAR, max_length=_ID_BYTES)
            s.add_field("text", DataType.VARCHAR, max_length=_TEXT_BYTES)
            s.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            return s

        params = self.client.prepare_index_params()
        params.add_index(field_name="vector", index_type=index_type, metric_type="IP", params=build)
        try:
            self.client.create_collection(collection, schema=schema(True), consistency_level="Strong")
            partition_key = True
        except Exception:  # noqa: BLE001 - a Milvus without partition keys: a plain field, filtered on
            self.client.create_collection(collection, schema=schema(False), consistency_level="Strong")
            partition_key = False
        self._index_and_load(collection, params)
        return partition_key

    def _delete(self, collection: str, key: str, tag: str) -> None:
        try:
            self.client.delete(self._load(collection), filter=_where(key, tag))
            self.client.flush(collection)
        except Exception:  # noqa: BLE001, S110 - rows left under a tag no catalog row names are never read
            pass

    def _count(self, collection: str, key: str, tag: str) -> int:
        got = self.client.query(self._load(collection), filter=_where(key, tag), output_fields=["count(*)"])
        return int(got[0]["count(*)"])

    # ------------------------------------------------------------------ reading

    def _entry(self, key: str) -> MilvusIndex | None:
        if not self.client.has_collection(CATALOG):
            return None
        got = self.client.query(self._load(CATALOG), ids=[key], output_fields=["entry"])
        return _parse_entry(key, got[0]["entry"], self.target.spec) if got else None

    def _catalog(self) -> list[tuple[str, str]]:
        """Return every catalog row's (key, entry), by key."""
        with self._reporting("read the catalog"):
            if not self.client.has_collection(CATALOG):
                return []
            filter_all = 'key != ""'
            got = self.client.query(self._load(CATALOG), filter=filter_all, output_fields=["key", "entry"], limit=MAX_K)
        return sorted((r["key"], r["entry"]) for r in got)

    def entries(self) -> list[MilvusIndex]:
        """Return every index in this database."""
        return [_parse_entry(key, entry, self.target.spec) for key, entry in self._catalog()]

    # ------------------------------------------------------------------ as a server's source of indexes

    @property
    def root(self) -> str:
        """Return the --store value, as a folder store's root names where its indexes are."""
        return self.target.spec

    def manifests(self) -> list[tuple[str, Manifest | StoreError]]:
        """Return each index's (key, manifest), or the error of an unreadable catalog entry, as IndexStore does."""
        listing: list[tuple[str, Manifest | StoreError]] = []
        for key, raw in self._catalog():
            try:
                listing.append((key, _parse_entry(key, raw, self.target.spec).manifest))
            except StoreError as exc:
                listing.append((key, exc))
        return listing

    def load_searchable(self, key: str) -> MilvusSearchable:
        """Return the index under key, its rows counted against its manifest (:meth:`check`), to search."""
        with self._reporting("read the catalog"):
            index = self._entry(key)
        if index is None:
            raise StoreError(f"{key} in {self.target.spec}: no longer in the catalog")
        self.check(index)
        return MilvusSearchable(self, index)

    def find(self, condition: str, corpus_name: str | None = None) -> MilvusIndex:
        """Return the index of a condition (and corpus when several share it)."""
        with self._reporting("read the catalog"):
            return self._find(condition, corpus_name)

    def _find(self, condition: str, corpus_name: str | None) -> MilvusIndex:
        if corpus_name is not None:
            entry = self._entry(index_name(corpus_name, check_condition(condition)))
            if entry is not None:
                return entry
        entries = {e.key: e for e in self.entries()}
        listing = [(key, e.manifest) for key, e in entries.items()]
        key, _ = find_index(listing, condition, corpus_name, where=self.target.spec)
        return entries[key]

    def search(self, index: MilvusIndex, vectors: np.ndarray, k: int) -> Found:
        """Return the k best rows of index for each (n, dim) unit query vector, by inner product."""
        if k > MAX_K:
            raise StoreError(f"k={k} is more than Milvus returns ({MAX_K})")
        with self._reporting("search"):
            return self._search(index, vectors, k)

    def _search(self, index: MilvusIndex, vectors: np.ndarray, k: int) -> Found:
        for _ in range(_ATTEMPTS):
            _, _, params = milvus_index(index.manifest.factory, index.manifest.search_params)
            got = self.client.search(
                self._load(index.collection),
                data=np.asarray(vectors, dtype=np.float32).tolist(),
                filter=_where(index.key, index.tag),
                limit=k,
                output_fields=["row", "row_id", "text"],
                search_params={"metric_type": "IP", "params": params},
            )
            now = self._entry(index.key)
            if now is not None and now.tag == index.tag:
                return _hits(got, len(vectors), k)
            if now is None:
                break
            index = now  # replaced while searching: its old rows may be gone, so ask the new ones
        raise StoreError(f"{index.manifest.condition!r} in {self.target.spec}: replaced faster than it can be read")

    def check(self, index: MilvusIndex) -> None:
        """Check that the rows of index's tag are all there (a cheap count, as the FAISS store checks sizes)."""
        with self._reporting("count the rows"):
            n = self._count(index.collection, index.key, index.tag)
        if n != index.manifest.n_vectors:
            raise StoreError(
                f"{index.manifest.condition!r} in {self.target.spec}: {n} vectors where the manifest says "
                f"{index.manifest.n_vectors}; index it again"
            )


def _quiet_engine_logs() -> None:
    if not logging.getLogger().isEnabledFor(logging.INFO):  # -v shows them
        for name in ENGINE_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)


def _reason(exc: BaseException) -> str:
    """Return the gist of a pymilvus error: its message alone, not the exception's repr around it."""
    message = getattr(exc, "message", None)
    return first_line(message) if isinstance(message, str) and message.strip() else first_line(exc)


def _where(key: str, tag: str) -> str:
    return f'condition == "{key}" and tag == "{tag}"'  # both are [a-z0-9-] (index_name, a number)


def _checked(value: str, limit: int, what: str) -> str:
    if len(value.encode("utf-8")) > limit:
        raise StoreError(f"{what} is longer than Milvus stores ({limit} bytes): {value[:40]!r}…")
    return value


def _catalog_row(entry: MilvusIndex) -> dict[str, Any]:
    body = {
        "manifest": asdict(entry.manifest),
        "collection": entry.collection,
        "tag": entry.tag,
        "index_type": entry.index_type,
        "partition_key": entry.partition_key,
    }
    return {"key": entry.key, "entry": json.dumps(body, ensure_ascii=False), "unused": [0.0, 0.0]}


def _parse_entry(key: str, raw: str, spec: str) -> MilvusIndex:
    try:
        body = json.loads(raw)
        manifest = manifest_from_dict(body["manifest"], f"{key} in {spec}")  # each field checked, as on disk
        return MilvusIndex(key, manifest, body["collection"], body["tag"], body["index_type"], body["partition_key"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{key} in {spec}: unreadable catalog entry; index it again") from exc


def _hits(got: list[list[dict[str, Any]]], n_queries: int, k: int) -> Found:
    scores = np.full((n_queries, k), -np.inf, dtype=np.float32)
    rows = np.full((n_queries, k), -1, dtype=np.int64)
    ids: dict[int, str | int] = {}
    texts: dict[int, str] = {}
    for qi, hits in enumerate(got):
        for r, hit in enumerate(hits[:k]):
            entity = hit.get("entity", hit)
            row = int(entity["row"])
            scores[qi, r], rows[qi, r] = hit["distance"], row
            ids[row] = json.loads(entity["row_id"])
            texts[row] = entity["text"]
    return Found(SearchResult(scores, rows), ids, texts)


@dataclass(frozen=True)
class MilvusSearchable:
    """One Milvus index as :func:`condsearch.query.search.answer` searches it.

    See :class:`condsearch.store.searchable.Searchable`.
    """

    store: MilvusStore
    index: MilvusIndex

    @property
    def manifest(self) -> Manifest:
        return self.index.manifest

    def search(self, vectors: np.ndarray, k: int) -> Found:
        return self.store.search(self.index, vectors, k)


def open_store(spec: str) -> MilvusStore:
    """Return the Milvus that spec names, connected now for reading (StoreError when it cannot be opened).

    Connecting up front makes a long-running reader (the server) fail at its start, not on its
    first request, and leaves no lazy connection for its threads to race to.
    """
    target = parse_store(spec)
    if target is None:
        raise StoreError("no Milvus store named")
    milvus = MilvusStore(target, create=False)
    milvus.client  # noqa: B018 - connects
    return milvus
