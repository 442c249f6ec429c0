"""Where indexes live: one directory per (corpus, condition), written atomically."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import pyarrow as pa
import pyarrow.parquet as pq

from condsearch import __version__
from condsearch.corpus import file_checksum
from condsearch.errors import StoreError, first_line

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
ROWS_FILE = "rows.parquet"
_TRASH = ".trash-"


@dataclass(frozen=True)
class Manifest:
    """Everything needed to trust and reuse an index (SPEC §3)."""

    condition: str
    corpus_name: str
    corpus_path: str
    corpus_checksum: str
    model_id: str
    model_revision: str
    encoder: dict[str, object]
    mode: str
    head: str
    head_checksum: str
    dim: int
    metric: str
    factory: str
    n_vectors: int
    n_skipped: int
    index_checksum: str = ""
    format_version: int = FORMAT_VERSION
    condsearch_version: str = ""
    created_at: str = ""


@dataclass(frozen=True)
class StoredIndex:
    """An index loaded from disk with its row ids and texts."""

    name: str
    manifest: Manifest
    index: faiss.Index
    ids: list[str | int]
    texts: list[str]


def default_index_dir() -> Path:
    """Return ``$CONDSEARCH_INDEX_DIR`` or ``./indexes``."""
    return Path(os.environ.get("CONDSEARCH_INDEX_DIR") or "indexes")


def index_name(corpus_name: str, condition: str) -> str:
    """Return a directory name for (corpus, condition): a readable slug plus a short hash."""
    slug = re.sub(r"[^a-z0-9]+", "-", condition.lower()).strip("-")[:40].strip("-") or "condition"
    digest = hashlib.sha256(f"{corpus_name}\x00{condition}".encode()).hexdigest()[:10]
    return f"{slug}-{digest}"


class IndexStore:
    """A folder of indexes. Reads verify; writes replace whole directories atomically."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_index_dir()

    def write(self, manifest: Manifest, index: faiss.Index, ids: list[str | int], texts: list[str]) -> str:
        """Write one index; an existing one for the same (corpus, condition) is replaced."""
        if index.ntotal != len(ids) or len(ids) != len(texts):
            raise ValueError("index, ids and texts differ in length")
        name = index_name(manifest.corpus_name, manifest.condition)
        try:
            self._write(name, manifest, index, ids, texts)
        except OSError as exc:  # permission denied, disk full: the user's to fix, said in one line
            reason = exc.strerror or first_line(exc)
            raise StoreError(f"{self.root}: cannot write the index of {manifest.condition!r} ({reason})") from exc
        return name

    def _write(self, name: str, manifest: Manifest, index: faiss.Index, ids: list[str | int], texts: list[str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=self.root))
        tmp.chmod(0o755)  # mkdtemp makes 0700; an index is as readable as any other file
        try:
            with open(tmp / INDEX_FILE, "wb") as fh:
                # through Python's file, so that a full disk is an OSError rather than faiss's RuntimeError
                faiss.write_index(index, faiss.PyCallbackIOWriter(fh.write))
            pq.write_table(pa.table({"id": ids, "text": texts}), tmp / ROWS_FILE)
            final = Manifest(
                **{
                    **asdict(manifest),
                    "index_checksum": file_checksum(tmp / INDEX_FILE),
                    "format_version": FORMAT_VERSION,
                    "condsearch_version": __version__,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            )
            (tmp / MANIFEST).write_text(json.dumps(asdict(final), indent=2, ensure_ascii=False) + "\n")
            self._swap_in(tmp, self.root / name)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _swap_in(self, tmp: Path, target: Path) -> None:
        # A directory cannot be replaced by one rename: move the old one aside first.
        # Should a crash fall between the two renames, load() restores the old one.
        trash = None
        if target.exists():
            trash = self.root / f"{_TRASH}{target.name}-{os.getpid()}-{time.time_ns()}"
            os.rename(target, trash)
        os.rename(tmp, target)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)

    def _recover(self, name: str) -> None:
        target = self.root / name
        if target.exists():
            return
        candidates = sorted(self.root.glob(f"{_TRASH}{name}-*"))
        if candidates:
            os.rename(candidates[-1], target)

    def names(self) -> list[str]:
        """Return the names of the index directories, in order (after any crash recovery)."""
        if not self.root.is_dir():
            return []
        for trash in self.root.glob(f"{_TRASH}*"):
            # ".trash-<name>-<pid>-<ns>": restore <name> if a crash left it only here
            self._recover(trash.name[len(_TRASH) :].rsplit("-", 2)[0])
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def read_manifest(self, name: str) -> Manifest:
        """Read and check one manifest."""
        path = self.root / name / MANIFEST
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise StoreError(f"{self.root / name}: not an index (no {MANIFEST})") from exc
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise StoreError(f"{path}: corrupt manifest") from exc
        if not isinstance(raw, dict) or raw.get("format_version") != FORMAT_VERSION:
            version = raw.get("format_version") if isinstance(raw, dict) else None
            raise StoreError(f"{path}: unsupported index format {version!r} (expected {FORMAT_VERSION})")
        try:
            return Manifest(**raw)
        except TypeError as exc:
            raise StoreError(f"{path}: manifest fields do not match this condsearch version") from exc

    def manifests(self) -> list[tuple[str, Manifest | StoreError]]:
        """Return every index's manifest, or the error that stops it from loading."""
        out: list[tuple[str, Manifest | StoreError]] = []
        for name in self.names():
            try:
                out.append((name, self.read_manifest(name)))
            except StoreError as exc:
                out.append((name, exc))
        return out

    def find(self, condition: str, corpus_name: str | None = None) -> str:
        """Return the index name for a condition (and corpus when several share it)."""
        if corpus_name is not None:
            name = index_name(corpus_name, condition)
            self._recover(name)
            if (self.root / name).is_dir():
                return name
        matches = [
            name
            for name, m in self.manifests()
            if isinstance(m, Manifest)
            and m.condition == condition
            and (corpus_name is None or m.corpus_name == corpus_name)
        ]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            corpora = sorted(self.read_manifest(n).corpus_name for n in matches)
            raise StoreError(
                f"condition {condition!r} is indexed for several corpora ({', '.join(corpora)}); "
                "choose one with --corpus"
            )
        known = sorted({m.condition for _, m in self.manifests() if isinstance(m, Manifest)})
        listing = "; ".join(repr(c) for c in known) if known else "none"
        raise StoreError(f"no index for condition {condition!r} in {self.root}; indexed: {listing}")

    def load(self, name: str) -> StoredIndex:
        """Load one index, checking that its files agree with its manifest."""
        self._recover(name)
        manifest = self.read_manifest(name)
        folder = self.root / name
        index_path = folder / INDEX_FILE
        try:
            if file_checksum(index_path) != manifest.index_checksum:
                raise StoreError(f"{index_path}: checksum mismatch; the index file is damaged")
            index = faiss.read_index(str(index_path))
            rows = pq.read_table(folder / ROWS_FILE)
        except (OSError, RuntimeError, pa.ArrowInvalid) as exc:
            raise StoreError(f"{folder}: index files unreadable ({type(exc).__name__})") from exc
        ids = rows.column("id").to_pylist() if "id" in rows.column_names else []
        texts = rows.column("text").to_pylist() if "text" in rows.column_names else []
        if not (index.ntotal == manifest.n_vectors == len(ids) == len(texts)) or index.d != manifest.dim:
            raise StoreError(f"{folder}: index, rows and manifest disagree; rebuild this index")
        return StoredIndex(name, manifest, index, ids, texts)
