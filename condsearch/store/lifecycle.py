"""An index's life past its build (issue 59): the corpora a folder store holds, their rows by id, and dropping them.

:func:`drop` removes a corpus's indexes (or one condition's). It first looks at the corpus's claims
(:mod:`condsearch.store.claims`), holding its gate so that no build of it starts meanwhile, and takes,
without waiting, the writer lock and the build-on-demand lock of every index it removes: a build under
way (``condsearch index``, a server's build on demand, a change by id, of any condition of the corpus,
one not indexed yet included) holds one, and the drop is refused in one line (:class:`CorpusBusy`) with
nothing removed. It then removes each index's name (the symlink, one
``unlink``: a reader that resolves the name afterwards finds no index) and deletes its version folders
at once, with its staging folder and marks. A reader mid-query is not disturbed: a loaded index lives in
memory, and a reader that opened a version's files before the drop reads them whole, since POSIX keeps
an unlinked file's data until its last open handle closes. Disk space therefore comes back as soon as
the drop returns, or for files a reader holds open, when that reader closes them (a load closes them
within milliseconds). The empty lock files stay (they are what a waiting writer holds).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock, Timeout

from condsearch.base.atomic import fsync_dir, open_regular
from condsearch.errors import CondsearchError, StoreError, first_line
from condsearch.store.claims import claims_free
from condsearch.store.folder import PARTIAL, ROWS_FILE, VERSIONS, IndexStore
from condsearch.store.manifest import Manifest
from condsearch.store.rows import ROW_COLUMNS

log = logging.getLogger(__name__)

#: the lock a build on demand of one index takes (:data:`condsearch.query.on_demand.BUILD_LOCK`)
BUILD_LOCK = ".build.lock"
#: the mark of an index a server built on demand (:data:`condsearch.store.built_on_demand.MARK`)
ON_DEMAND_MARK = ".on-demand"
#: ids named in a refusal at most
MAX_NAMED = 5


class UnknownCorpus(StoreError):
    """No index of the store belongs to the corpus named."""


class UnknownIds(CondsearchError):
    """Ids named for a change or a read are not rows of the corpus."""


class CorpusBusy(StoreError):
    """A build or a change of the corpus is under way: it cannot be dropped now."""


@dataclass(frozen=True)
class CorpusInfo:
    """One corpus of a store: its name, its rows, and the conditions (with their index names) it is indexed under."""

    name: str
    count: int
    conditions: dict[str, str]  # condition -> index name


def corpora(store: IndexStore) -> list[CorpusInfo]:
    """Return every corpus with readable indexes, by name; a damaged index is left out (`list` shows it)."""
    found: dict[str, dict[str, str]] = {}
    counts: dict[str, int] = {}
    for name, m in store.manifests():
        if isinstance(m, Manifest):
            found.setdefault(m.corpus_name, {})[m.condition] = name
            counts[m.corpus_name] = max(counts.get(m.corpus_name, 0), m.n_vectors)
    return [CorpusInfo(c, counts[c], dict(sorted(found[c].items()))) for c in sorted(found)]


def corpus_indexes(store: IndexStore, corpus: str | None) -> tuple[str, list[tuple[str, Manifest]]]:
    """Return the corpus's name and its indexes (name, manifest); ``None`` names the store's only corpus.

    Raises :class:`UnknownCorpus` in one line, naming the corpora there are.
    """
    listing = [(n, m) for n, m in store.manifests() if isinstance(m, Manifest)]
    names = sorted({m.corpus_name for _, m in listing})
    if corpus is None:
        if len(names) != 1:
            raise UnknownCorpus(f"name a corpus: the store holds {_some(names) if names else 'none'}")
        corpus = names[0]
    mine = [(n, m) for n, m in listing if m.corpus_name == corpus]
    if not mine:
        raise UnknownCorpus(f"no corpus {corpus!r} in the store (corpora: {_some(names) if names else 'none'})")
    return corpus, mine


def read_rows(store: IndexStore, name: str) -> tuple[list[str | int], list[str]]:
    """Return one index's row ids and texts, in row order (row i is FAISS id i)."""
    path = store.root / name / ROWS_FILE
    try:
        with open_regular(path) as fh:
            rows = pq.ParquetFile(fh).read(columns=["id", "text"])
    except (OSError, ValueError, KeyError) as exc:
        raise StoreError(f"{path}: unreadable ({first_line(exc)})") from exc
    return rows.column("id").to_pylist(), rows.column("text").to_pylist()


def read_kept_columns(store: IndexStore, name: str) -> pa.Table:
    """Return one index's kept columns (issue 59), row i for row i: a table of no columns where it keeps none."""
    path = store.root / name / ROWS_FILE
    try:
        with open_regular(path) as fh:
            rows = pq.ParquetFile(fh)
            names = [c for c in rows.schema_arrow.names if c not in ROW_COLUMNS]
            return rows.read(columns=names) if names else pa.table({"": pa.nulls(rows.metadata.num_rows)}).select([])
    except (OSError, ValueError, KeyError) as exc:
        raise StoreError(f"{path}: unreadable ({first_line(exc)})") from exc


def match_ids(given: Sequence[object], stored: Sequence[str | int], corpus: str) -> list[int]:
    """Return the row positions of the given ids; raise :class:`UnknownIds` in one line for any not stored.

    An id read from a file (a string) matches a stored integer id of the same digits.
    """
    at = {_key(i): pos for pos, i in enumerate(stored)}
    missing = [g for g in given if _key(g) not in at]
    if missing:
        raise UnknownIds(f"{len(missing)} of {len(given)} ids are not in corpus {corpus!r}: {_some(missing)}")
    return [at[_key(g)] for g in given]


def _key(value: object) -> str:
    return str(value)


def _some(values: Sequence[object]) -> str:
    shown = ", ".join(repr(v) for v in values[:MAX_NAMED])
    return shown + (f" and {len(values) - MAX_NAMED} more" if len(values) > MAX_NAMED else "")


@contextmanager
def quiet_locks(store: IndexStore, names: Sequence[str], corpus: str) -> Iterator[None]:
    """Hold the writer and build locks of each index named, taken without waiting; raise :class:`CorpusBusy`."""
    folder = store.root / VERSIONS
    folder.mkdir(parents=True, exist_ok=True)
    with ExitStack() as held:
        for name in names:
            for suffix in (".lock", BUILD_LOCK):
                try:
                    held.enter_context(FileLock(folder / f"{name}{suffix}", timeout=0))
                except Timeout:
                    raise CorpusBusy(
                        f"corpus {corpus!r} is being built or changed (index {name}); try again when that ends"
                    ) from None
        yield


def drop(store: IndexStore, corpus: str | None, condition: str | None = None) -> list[str]:
    """Remove the corpus's indexes, or only condition's; return the names removed (see the module's note)."""
    corpus, mine = corpus_indexes(store, corpus)
    if condition is not None:
        name = store.find(condition, corpus)  # UnknownCondition names what the corpus holds
        mine = [(n, m) for n, m in mine if n == name]
    names = [n for n, _ in mine]
    with claims_free(store.root, corpus) as busy, quiet_locks(store, names, corpus):
        if busy is not None:  # a build of the corpus under way, of a condition not indexed yet included
            raise CorpusBusy(f"corpus {corpus!r} is being built or changed (index {busy}); try again when that ends")
        for name, m in mine:
            start = time.perf_counter()
            _remove(store, name)
            seconds = time.perf_counter() - start
            log.info(  # every deletion is logged: what, how many rows, how long (issue 59)
                "dropped index %s (corpus %r, condition %r, %d rows) in %.2f s",
                name,
                corpus,
                m.condition,
                m.n_vectors,
                seconds,
            )
    return names


def _remove(store: IndexStore, name: str) -> None:
    """Unlink name, then delete its versions, staging, marks and any folder an older layout left."""
    link = store.root / name
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():  # format 1, a real folder: renamed away first, so that the name goes in one step
        aside = store.root / f".dropped-{name}-{os.getpid()}"
        os.replace(link, aside)
        shutil.rmtree(aside, ignore_errors=True)
    fsync_dir(store.root)
    versions = store.root / VERSIONS
    for leftover in (versions / name, versions / f"{name}{PARTIAL}", *store.root.glob(f".trash-{name}-*")):
        shutil.rmtree(leftover, ignore_errors=True)
    Path(versions / f"{name}{ON_DEMAND_MARK}").unlink(missing_ok=True)
