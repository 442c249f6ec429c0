"""Where indexes live: one index per (corpus, condition), replaced atomically, read without locks.

Layout: ``<root>/<name>`` is a relative symlink to ``<root>/.versions/<name>/<version>/``, the
folder that holds ``manifest.json``, ``index.faiss``, ``rows.parquet`` (ids, texts, text hashes and the
corpus's kept columns)
and ``vectors.npy`` (the indexed vectors, so that a re-index encodes only changed rows and a new
index type needs no encoder). A write fills a new
version folder, then points the symlink at it with one ``os.replace`` (atomic on POSIX) and
deletes the older versions; writers of one name take a file lock. Readers never rename or
delete: they open the folder the symlink points to once and read all three files from that
one folder, so they see a whole index, old or new; should a writer delete the version under
them between opening the folder and its files, they start again from the symlink.

Folders written before versioning (``<root>/<name>`` a real directory, format 1) stay readable;
the next write of that index moves it into the versioned layout. A ``.trash-<name>-*`` folder
that an older condsearch left when killed between its two renames is read in place when
``<name>`` is missing.

A long build (:meth:`IndexStore.writing`) holds the lock and fills ``<root>/.versions/<name>.partial/``,
which survives an interruption so that the next build resumes there; the published index keeps
answering until the build's version replaces it.

Loading checks the index file cheaply (size, modification time and the first and last 64 KiB
against the manifest) and the rows file by size, and hashes the index file in full only when its
modification time has changed; :meth:`IndexStore.verify` hashes every file of the index always, and
:meth:`IndexStore.kept_vectors` hashes the rows and vectors before a re-index reuses them.

Every version's manifest records the scores between a seeded sample of its kept vectors' rows
(:func:`condsearch.store.background.score_background`), which calibrated queries measure scores against.

Every file is opened without blocking and read only if it is a regular file (a FIFO or a link to
``/dev/zero`` is refused in one line, never waited on), and a manifest only up to 1 MiB. A manifest
is checked field by field against :class:`Manifest`'s types before anything uses it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

import faiss
import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock

from condsearch.base.ann import apply_search_params
from condsearch.base.atomic import fsync_dir, link_or_copy, open_regular, read_capped, replacing_file
from condsearch.defaults import default_index_dir  # re-exported: the store's default root
from condsearch.errors import StoreError, first_line, os_reason
from condsearch.store.background import score_background
from condsearch.store.claims import claim
from condsearch.store.file_checks import (
    check_file,
    check_index_file,
    check_vectors,
    is_regular,
    parquet_columns,
    probe_of,
    sha256_of,
)
from condsearch.store.listing import check_condition, damaged_note, find_index, same_condition
from condsearch.store.manifest import (  # re-exported: the store's readers and writers name them from here
    FORMAT_VERSION,
    INDEX_FILE,
    INDEX_FILES,
    MANIFEST,
    ROWS_FILE,
    Manifest,
    manifest_from_dict,
)
from condsearch.store.rows import KeptVectors, kept_columns, write_rows
from condsearch.store.searchable import FaissIndex, StoredIndex
from condsearch.store.vectors import VECTORS_FILE, VectorFile
from condsearch.version import __version__

log = logging.getLogger(__name__)

MANIFEST_MAX_BYTES = 1 << 20  # a manifest is a few KiB; more is not one
VERSIONS = ".versions"
PARTIAL = ".partial"  # <root>/.versions/<name>.partial: a build's resumable work
_TRASH = ".trash-"
_ATTEMPTS = 20


def index_name(corpus_name: str, condition: str) -> str:
    """Return a directory name for (corpus, condition): a readable slug plus a short hash."""
    slug = re.sub(r"[^a-z0-9]+", "-", condition.lower()).strip("-")[:40].strip("-") or "condition"
    digest = hashlib.sha256(f"{corpus_name}\x00{condition}".encode()).hexdigest()[:10]
    return f"{slug}-{digest}"


class _Moved(Exception):
    """The version being read was deleted by a writer in between: read again from the symlink."""


@dataclass
class _Files:
    """The manifest and files of one index, opened from one folder so that they belong together."""

    folder: Path
    manifest: bytes = b""
    opened: dict[str, IO[bytes]] = field(default_factory=dict)  # vectors.npy only where there is one

    def close(self) -> None:
        for fh in self.opened.values():
            fh.close()


def _is_index_folder(path: Path) -> bool:
    """Return whether path is a folder, or a link to one, looking twice at a link.

    A writer flips an index's link to its new version and then deletes the old one: a reader that
    read the link just before the flip may find its old target gone. Resolving the link again reads
    the new target.
    """
    return path.is_dir() or (path.is_symlink() and path.is_dir())


class IndexStore:
    """A folder of indexes. Reads check and never modify; writes replace whole versions atomically."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_index_dir()
        self._read: dict[str, tuple[tuple[int, ...], Manifest]] = {}  # name -> (its manifest's stamp, manifest)

    # ------------------------------------------------------------------ writing

    def write(
        self,
        manifest: Manifest,
        index: faiss.Index,
        ids: list[str | int],
        texts: list[str],
        vectors: object | None = None,
        metadata: pa.Table | None = None,
    ) -> str:
        """Write one index (and the (n, d) float32 vectors it holds, and the kept columns, if given); replace any
        earlier one."""
        if index.ntotal != len(ids) or len(ids) != len(texts):
            raise ValueError("index, ids and texts differ in length")

        def place(version: Path) -> None:
            write_rows(version / ROWS_FILE, ids, texts, metadata)
            if vectors is not None:
                import numpy as np

                np.save(version / VECTORS_FILE, np.ascontiguousarray(vectors, dtype="<f4"), allow_pickle=False)

        with self.writing(manifest.corpus_name, manifest.condition) as draft:
            return draft.publish(manifest, index, place)

    @contextmanager
    def writing(self, corpus_name: str, condition: str) -> Iterator[Draft]:
        """Hold the write lock of one index and yield a :class:`Draft` to publish its next version through.

        condition is written as given (the caller normalises it:
        :func:`condsearch.store.conditions.normalize_condition`), into the index of the same condition that an
        older condsearch named after another spelling, if there is one.
        """
        name = self.name_for(corpus_name, condition)
        try:
            (self.root / VERSIONS / name).mkdir(parents=True, exist_ok=True)
            with claim(self.root, corpus_name, name), FileLock(self.root / VERSIONS / f"{name}.lock"):
                yield Draft(self, name, corpus_name, condition, self.root / VERSIONS / f"{name}{PARTIAL}")
        except OSError as exc:  # permission denied, disk full: the user's to fix, said in one line
            raise StoreError(f"{self.root}: cannot write the index of {condition!r} ({os_reason(exc)})") from exc

    def _replace(self, name: str, manifest: Manifest, index: faiss.Index, place: Callable[[Path], None]) -> None:
        """Write a new version (index and manifest here, rows and vectors by place) and publish it (lock held)."""
        version = self._write_version(name, manifest, index, place)
        self._publish(name, version)
        self._collect(name, keep=version)

    def _write_version(self, name: str, manifest: Manifest, index: faiss.Index, place: Callable[[Path], None]) -> Path:
        version = self.root / VERSIONS / name / f"{time.time_ns()}-{os.getpid()}"
        version.mkdir()
        try:
            place(version)
            with open(version / INDEX_FILE, "wb+") as fh:
                # through Python's file, so that a full disk is an OSError rather than faiss's RuntimeError
                faiss.write_index(index, faiss.PyCallbackIOWriter(fh.write))  # type: ignore[attr-defined]  # SWIG, untyped
                fh.flush()
                os.fsync(fh.fileno())
                checksum = sha256_of(fh)
                size = os.fstat(fh.fileno()).st_size
                probe = probe_of(fh, size)
            files: dict[str, dict[str, object]] = {INDEX_FILE: {"sha256": checksum, "size": size}}
            background = _background(version / VECTORS_FILE)
            for kept in (ROWS_FILE, VECTORS_FILE):
                if (version / kept).is_file():
                    with open(version / kept, "rb") as fh:
                        os.fsync(fh.fileno())
                        files[kept] = {"sha256": sha256_of(fh), "size": os.fstat(fh.fileno()).st_size}
            final = Manifest(
                **{
                    **asdict(manifest),
                    "index_checksum": checksum,
                    "index_size": size,
                    "index_mtime_ns": os.stat(version / INDEX_FILE).st_mtime_ns,
                    "index_probe": probe,
                    "files": files,
                    "score_background": background,
                    "format_version": FORMAT_VERSION,
                    "condsearch_version": __version__,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            )
            with open(version / MANIFEST, "w", encoding="utf-8") as out:
                out.write(json.dumps(asdict(final), indent=2, ensure_ascii=False) + "\n")
                out.flush()
                os.fsync(out.fileno())
            fsync_dir(version)
        except BaseException:
            shutil.rmtree(version, ignore_errors=True)
            raise
        return version

    def _publish(self, name: str, version: Path) -> None:
        """Point <root>/<name> at version in one step (a folder from before versioning is moved aside first)."""
        target = self.root / name
        if target.is_dir() and not target.is_symlink():
            # format 1: a real folder cannot be replaced by a symlink in one step (nor does replacing_file
            # replace a folder). Until the symlink is in, readers read the old folder under its .trash-
            # name, as after an old crash.
            os.rename(target, self.root / f"{_TRASH}{name}-{os.getpid()}-{time.time_ns()}")
        with replacing_file(target) as link:
            os.symlink(os.path.relpath(version, self.root), link)
        fsync_dir(self.root)

    def _collect(self, name: str, keep: Path) -> None:
        """Delete what earlier writes of name left: older versions, old-layout folders, stray links."""
        for old in (self.root / VERSIONS / name).iterdir():
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)
        for stray in (*self.root.glob(f"{_TRASH}{name}-*"), *self.root.glob(f".tmp-{name}-*")):
            if stray.is_symlink() or not stray.is_dir():
                stray.unlink(missing_ok=True)
            else:
                shutil.rmtree(stray, ignore_errors=True)

    # ------------------------------------------------------------------ reading (never renames, never deletes)

    def _folder(self, name: str) -> Path | None:
        """Return the path to read name from: <root>/<name>, or the folder a killed old-format write left."""
        target = self.root / name
        if target.is_dir():
            return target
        left = sorted(self.root.glob(f"{_TRASH}{name}-*"))
        return left[-1] if left and left[-1].is_dir() else None

    @contextmanager
    def _open(self, name: str, data: Sequence[str] = ()) -> Iterator[_Files]:
        """Open name's manifest and the data files named (vectors.npy where there is one) from one version folder."""
        for _ in range(_ATTEMPTS):
            folder = self._folder(name)
            if folder is None:
                raise StoreError(f"{self.root / name}: not an index (no {MANIFEST})")
            try:
                files = self._open_in(folder, data)
            except _Moved:
                time.sleep(0.001)
                continue
            try:
                yield files
            finally:
                files.close()
            return
        raise StoreError(f"{self.root / name}: replaced faster than it can be read; try again")

    def _open_in(self, folder: Path, data: Sequence[str]) -> _Files:
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except FileNotFoundError as exc:
            raise _Moved from exc
        except OSError as exc:
            raise StoreError(f"{folder}: unreadable ({os_reason(exc)})") from exc
        files = _Files(folder)
        try:
            try:
                with open_regular(MANIFEST, dir_fd=fd, where=folder / MANIFEST) as fh:
                    files.manifest = read_capped(fh, MANIFEST_MAX_BYTES, folder / MANIFEST)
            except FileNotFoundError as exc:
                if self._gone(folder, fd):
                    raise _Moved from exc
                raise StoreError(f"{folder}: not an index (no {MANIFEST})") from exc
            for file_name in data:
                try:
                    files.opened[file_name] = open_regular(file_name, dir_fd=fd, where=folder / file_name)
                except FileNotFoundError as exc:
                    if self._gone(folder, fd):
                        raise _Moved from exc
                    if file_name != VECTORS_FILE:  # formats 1 and 2 keep no vectors, nor does write() without any
                        raise StoreError(f"{folder}: index files unreadable (no {file_name})") from exc
        except OSError as exc:  # not FileNotFoundError, handled above: permission denied, I/O error
            files.close()
            raise StoreError(f"{folder}: index files unreadable ({os_reason(exc)})") from exc
        except BaseException:
            files.close()
            raise
        finally:
            os.close(fd)
        return files

    @staticmethod
    def _gone(folder: Path, fd: int) -> bool:
        """Return whether the folder open as fd was deleted (a writer collected it) or is no longer folder."""
        try:
            return os.fstat(fd).st_nlink == 0 or os.stat(folder).st_ino != os.fstat(fd).st_ino
        except OSError:
            return True

    def names(self) -> list[str]:
        """Return the names of the stored indexes, in order."""
        if not self.root.is_dir():
            return []
        names = {p.name for p in self.root.iterdir() if not p.name.startswith(".") and _is_index_folder(p)}
        for left in self.root.glob(f"{_TRASH}*"):
            # ".trash-<name>-<pid>-<ns>", left by an older condsearch killed mid-write, or by a format-1
            # migration in progress: it stands for <name> while <name> itself is missing
            name = left.name[len(_TRASH) :].rsplit("-", 2)[0]
            if left.is_dir() and not (self.root / name).exists():
                names.add(name)
        return sorted(names)

    def read_manifest(self, name: str) -> Manifest:
        """Read and check one manifest."""
        with self._open(name) as files:
            return self._parse_manifest(files.folder / MANIFEST, files.manifest)

    @staticmethod
    def _parse_manifest(path: Path, raw_bytes: bytes) -> Manifest:
        try:
            raw = json.loads(raw_bytes.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise StoreError(f"{path}: corrupt manifest") from exc
        return manifest_from_dict(raw, path)

    def manifests(self) -> list[tuple[str, Manifest | StoreError]]:
        """Return every index's manifest, or the error that stops it from loading.

        A manifest read before is read again only when its file changed (its inode, size or modification time):
        a store of thousands of indexes is listed with one stat each (issue 58).
        """
        out: list[tuple[str, Manifest | StoreError]] = []
        seen: dict[str, tuple[tuple[int, ...], Manifest]] = {}
        for name in self.names():
            stamp = self._manifest_stamp(name)
            known = self._read.get(name)
            if stamp is not None and known is not None and known[0] == stamp:
                out.append((name, known[1]))
                seen[name] = known
                continue
            try:
                manifest = self.read_manifest(name)
            except StoreError as exc:
                out.append((name, exc))
                continue
            out.append((name, manifest))
            if stamp is not None:
                seen[name] = (stamp, manifest)
        self._read = seen
        return out

    def _manifest_stamp(self, name: str) -> tuple[int, ...] | None:
        """Return what identifies the manifest an index's name leads to now, or None where it cannot be told."""
        try:
            st = os.stat(self.root / name / MANIFEST)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def stamp(self) -> int | None:
        """Return the store folder's modification time: it changes when an index is added, replaced or removed."""
        try:
            return os.stat(self.root).st_mtime_ns
        except OSError:
            return None

    def damaged_note(self, listing: Sequence[tuple[str, Manifest | StoreError]]) -> str:
        """Return "; 1 index is damaged: …" naming the indexes of a listing that failed to load, or ""."""
        return damaged_note(listing, str(self.root))

    def name_for(self, corpus_name: str, condition: str) -> str:
        """Return the name an index of (corpus, condition) has or gets: the one stored under another spelling of
        the condition (written before conditions were normalised, issue 58), else :func:`index_name`'s."""
        name = index_name(corpus_name, condition)
        if self._folder(name) is not None:
            return name
        for stored, m in self.manifests():
            if isinstance(m, Manifest) and m.corpus_name == corpus_name and same_condition(m, condition):
                return stored
        return name

    def find(self, condition: str, corpus_name: str | None = None) -> str:
        """Return the index name for a condition (and corpus when several share it).

        Found by :func:`condsearch.store.listing.find_index`.
        """
        if corpus_name is not None:
            name = index_name(corpus_name, check_condition(condition))
            if self._folder(name) is not None:
                return name
        root = str(self.root)
        return find_index(self.manifests(), condition, corpus_name, where=root, root=root)[0]

    def select(self, conditions: Sequence[str] = (), corpus_name: str | None = None) -> list[str]:
        """Return the names of the conditions' indexes (by :meth:`find`, each once), or of every index for none."""
        if not conditions:
            return self.names()
        return list(dict.fromkeys(self.find(c, corpus_name) for c in conditions))

    def load(self, name: str, *, verify: bool = False) -> StoredIndex:
        """Load one index, checking that its files agree with its manifest.

        The index file is checked by size, modification time and its first and last 64 KiB, and
        hashed in full only when its modification time differs from the manifest's (a copied or
        edited file) or when ``verify`` is set; the rows file is checked by size. ``verify`` also
        hashes the rows and the kept vectors and checks the vectors' shape.
        """
        with self._open(name, INDEX_FILES if verify else (INDEX_FILE, ROWS_FILE)) as files:
            manifest = self._parse_manifest(files.folder / MANIFEST, files.manifest)
            index_fh, rows_fh = files.opened[INDEX_FILE], files.opened[ROWS_FILE]
            try:
                check_index_file(files.folder / INDEX_FILE, index_fh, manifest, verify=verify)
                check_file(files.folder / ROWS_FILE, rows_fh, manifest, full=verify)
                if verify:
                    check_vectors(files.folder / VECTORS_FILE, files.opened.get(VECTORS_FILE), manifest)
                index_fh.seek(0)
                index = faiss.read_index(faiss.PyCallbackIOReader(index_fh.read))  # type: ignore[attr-defined]  # SWIG, untyped
                # ParquetFile, not read_table: that imports pyarrow.dataset and with it pandas (1 s of a one-shot query)
                # every column but the text hashes: ids, texts and the corpus's kept columns (issue 59)
                rows = pq.ParquetFile(rows_fh).read(columns=[c for c in parquet_columns(rows_fh) if c != "text_hash"])
                apply_search_params(index, manifest.search_params)
            except (OSError, RuntimeError, pa.ArrowInvalid) as exc:
                raise StoreError(f"{files.folder}: index files unreadable ({type(exc).__name__})") from exc
            except ValueError as exc:
                raise StoreError(f"{files.folder}: {first_line(exc)}; rebuild this index") from exc
        folder = self.root / name
        ids = rows.column("id").to_pylist() if "id" in rows.column_names else []
        texts = rows.column("text").to_pylist() if "text" in rows.column_names else []
        if not (index.ntotal == manifest.n_vectors == len(ids) == len(texts)) or index.d != manifest.dim:
            raise StoreError(f"{folder}: index, rows and manifest disagree; rebuild this index")
        return StoredIndex(name, manifest, index, ids, texts, kept_columns(rows))

    def load_searchable(self, name: str) -> FaissIndex:
        """Load one index (checked as :meth:`load` does) and ready it to search, on the GPU where there is one."""
        return FaissIndex.of(self.load(name))

    def close(self) -> None:
        """Release nothing: each load opens and closes its own files (a Milvus store closes its connection)."""

    def kept_vectors(self, name: str) -> KeptVectors | None:
        """Return the vectors kept beside an index with their rows' ids and text hashes, or None if it has none.

        The rows and vectors files are hashed against the manifest first: files that are damaged, or
        that carry no checksums (format 3 and older), are not trusted, and give None with a one-line
        warning. Meant for the index's writer (holding :meth:`writing`'s lock), so the version read
        stays in place.
        """
        if self._folder(name) is None:
            return None
        try:
            with self._open(name, (ROWS_FILE, VECTORS_FILE)) as files:
                manifest = self._parse_manifest(files.folder / MANIFEST, files.manifest)
                if manifest.format_version < 3 or not manifest.fingerprint:
                    return None  # kept no vectors
                return _read_kept(files, manifest)
        except StoreError as exc:
            log.warning("%s; not reusing the kept vectors", first_line(exc))
            return None

    def verify(self, name: str) -> Manifest:
        """Check one index in full (each file's sha256, the vectors' shape, the counts); return its manifest."""
        return self.load(name, verify=True).manifest


def _read_kept(files: _Files, manifest: Manifest) -> KeptVectors:
    """Check the kept rows and vectors of an open index against its manifest in full, then open them."""
    folder, vectors_fh = files.folder, files.opened.get(VECTORS_FILE)
    if ROWS_FILE not in manifest.files or VECTORS_FILE not in manifest.files:
        raise StoreError(f"{folder}: the kept vectors carry no checksums (format {manifest.format_version})")
    check_vectors(folder / VECTORS_FILE, vectors_fh, manifest)
    assert vectors_fh is not None  # check_vectors refuses a missing file that the manifest records
    check_file(folder / ROWS_FILE, files.opened[ROWS_FILE], manifest, full=True)
    try:
        rows = pq.ParquetFile(files.opened[ROWS_FILE]).read(columns=["id", "text_hash"])
    except (OSError, ValueError, KeyError) as exc:  # pyarrow's errors derive from these
        raise StoreError(f"{folder / ROWS_FILE}: unreadable ({first_line(exc)})") from exc
    ids, hashes = rows.column("id").to_pylist(), rows.column("text_hash").to_pylist()
    if len(ids) != manifest.n_vectors:
        raise StoreError(f"{folder}: rows and manifest disagree")
    return KeptVectors(manifest, ids, hashes, VectorFile(folder / VECTORS_FILE, vectors_fh))


def _background(path: Path) -> dict[str, object]:
    """Return the score background (:func:`condsearch.store.background.score_background`) of a version's kept vectors.

    A version without kept vectors (:meth:`IndexStore.write` given none) records none.
    """
    if not is_regular(path):
        return {}
    vectors = VectorFile(path)
    try:
        return score_background(vectors)
    finally:
        vectors.close()


class Draft:
    """The next version of one index, built while the published one keeps answering (the lock is held).

    ``staging`` is a folder for work that should survive an interruption (a resumable build puts its
    rows and vectors there); :meth:`publish` writes the index and manifest and swaps the version in.
    The staged rows and vectors are linked into the version, not moved: should the publish fail (a
    full disk) or the process die in it, they are still in staging for the next run to resume from.
    Staged files are therefore never rewritten in place (a published version may share them), only
    replaced.
    """

    def __init__(self, store: IndexStore, name: str, corpus_name: str, condition: str, staging: Path) -> None:
        self.store, self.name, self.corpus_name, self.condition, self.staging = (
            store,
            name,
            corpus_name,
            condition,
            staging,
        )

    def publish(self, manifest: Manifest, index: faiss.Index, place: Callable[[Path], None] | None = None) -> str:
        """Publish index with manifest; place(version) writes the rows (and vectors), else they come from staging."""
        if (manifest.corpus_name, manifest.condition) != (self.corpus_name, self.condition):
            raise ValueError("the manifest names another index than this draft's")

        def link(version: Path) -> None:
            for kept in (ROWS_FILE, VECTORS_FILE):
                if is_regular(self.staging / kept):
                    link_or_copy(self.staging / kept, version / kept)

        self.store._replace(self.name, manifest, index, place or link)  # noqa: SLF001 - the draft is the store's
        return self.name

    def discard_staging(self) -> None:
        """Delete the staging folder (after a publish, or to start a build afresh)."""
        shutil.rmtree(self.staging, ignore_errors=True)
