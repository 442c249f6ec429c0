"""The ONNX export cache: where an export lives, its meta file, the checks of its files, publishing one.

Every export, CASE's encoder (:mod:`condsearch.model.encoders.onnx.bert`) and the router's two passes
(:mod:`condsearch.model.csr.onnx`) alike, is a folder under the cache dir's ``onnx/``, named by a digest
of its key (:func:`cache_folder`: the format, what the family puts in, the precision and the
onnxruntime, onnx and torch versions, read from package metadata so that computing the key imports
none of them). It is written through torch by :mod:`condsearch.model.encoders.onnx.export`, checked
against the torch model, and only then marked usable; this module and :mod:`.run` read it with
onnxruntime, ``tokenizers`` and numpy alone.

Its ``export.json`` records the cache folder it was written for and the size and sha256 of each
file, and nothing is loaded that does not match them: a file damaged or swapped in (another
profile's export copied over this one) is a cache miss, said in one line, and the export is
written again. Hashing the 90 MB of MiniLM's weights takes 50-60 ms here (SHA-NI; a few times that
on a CPU without it), against 0.8 s for a whole one-shot query, so a verified export is stamped
(:data:`STAMP_FILE`) with each file's device, inode, size, modification and change times, and
hashed again only when one of those moves. Any write to a file moves its change time, which no one
but the clock can set back; a file changed within :data:`SETTLE_NS` of its check could keep the
same timestamp tick, so files that young are hashed at every load, never stamped (the rule of
:mod:`condsearch.base.file_digest`, which a local model folder's revision follows too).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from condsearch.base.atomic import replacing_file, swap_dir, temporary_name
from condsearch.base.file_digest import SETTLE_NS
from condsearch.base.file_digest import file_identity as _identity
from condsearch.base.file_digest import sha256_file as _sha256
from condsearch.errors import ModelError

log = logging.getLogger(__name__)

#: float32: the model as it is; int8: onnxruntime's dynamic int8 model (``--quantize int8``); part of an export's key
Precision = Literal["float32", "int8"]
#: 2: export.json records its cache folder and each file's size and sha256 (checked on every load)
FORMAT_VERSION = 2
#: the cached exports live here, under default_cache_dir() (beside "features", the encoder outputs)
CACHE_SUBDIR = "onnx"
#: the tokenizer an export carries, so that a one-shot query tokenizes without transformers
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "export.json"
#: in the meta file: each of the export's files (its family's list) as {"size", "sha256"}
FILES_KEY = "files"
#: in the meta file: the name of the cache folder the export was written for (its key's digest)
FOLDER_KEY = "folder"
#: beside the meta file: the files' identities (device, inode, size, mtime, ctime) when last hashed and found whole
STAMP_FILE = "verified.json"
#: in the meta file: the export's outputs agreed with the torch model's when it was written
USABLE_KEY = "usable"
#: what an export depends on besides the model; a missing one is a one-line error
RUNTIME_PACKAGES = ("onnxruntime", "onnx", "torch")


def runtime_versions() -> dict[str, str]:
    """Return the versions an export depends on; a one-line error if onnxruntime, onnx or torch is missing."""
    versions = {}
    for package in RUNTIME_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            raise ModelError(f"the ONNX encoder needs {package}: pip install {package}") from None
    return versions


def cache_folder(root: Path, key: Sequence[object], precision: Precision) -> Path:
    """Return the cache folder under root of the export a family keys by ``key`` (model, revision, weights...).

    Named by a digest of this format, the key, the precision and the runtime versions, so that any
    change of one is another folder.
    """
    parts = [FORMAT_VERSION, *key, precision, runtime_versions()]
    return root / CACHE_SUBDIR / hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]


def read_meta(folder: Path) -> dict[str, Any] | None:
    """Return an export's meta file if it is there and of this format, else None (a cache miss)."""
    try:
        meta = json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format_version") == FORMAT_VERSION else None


def _foreign(folder: Path, meta: Mapping[str, Any]) -> str | None:
    """Return why a meta file is not the one of the export cached in folder (another model, adapter or
    precision's export copied in whole), or None."""
    if meta.get(FOLDER_KEY) == folder.name:
        return None
    return f"{META_FILE} was written for the cache folder {meta.get(FOLDER_KEY)!r}"


def cached_meta(folder: Path) -> dict[str, Any] | None:
    """Return the meta file of the export cached in folder, or None: missing, of another format or foreign.

    Its files are not checked: :func:`checked_meta` does that.
    """
    meta = read_meta(folder)
    return meta if meta is not None and _foreign(folder, meta) is None else None


def refusal(meta: Mapping[str, Any] | None) -> str | None:
    """Return why the export of a meta file was refused when it was written, or None (usable, or no meta file)."""
    return None if meta is None or meta.get(USABLE_KEY) else str(meta.get("refused", "refused"))


def file_records(folder: Path, names: Sequence[str]) -> dict[str, dict[str, object]]:
    """Return the size and sha256 of each of an export's files (``names``): what its meta file records."""
    return {name: {"size": (folder / name).stat().st_size, "sha256": _sha256(folder / name)} for name in names}


def _read_stamp(folder: Path) -> object:
    try:
        return json.loads((folder / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return None


def _write_stamp(folder: Path, stamp: Mapping[str, object]) -> None:
    try:
        with replacing_file(folder / STAMP_FILE) as tmp:
            tmp.write_text(json.dumps(stamp))
    except OSError:  # a read-only cache: every load hashes
        pass


def _discard(folder: Path) -> None:
    """Remove a damaged export from the cache (renamed aside first, so that no reader sees it half gone)."""
    aside = temporary_name(folder, "damaged")
    try:
        os.replace(folder, aside)
    except OSError:  # gone already, or a read-only cache: the next load finds it damaged again
        return
    shutil.rmtree(aside, ignore_errors=True)


def export_problem(folder: Path, meta: Mapping[str, Any], names: Sequence[str]) -> str | None:
    """Return why an export's files (``names``) differ from what its meta file records (size, then sha256), or None.

    A file is hashed unless the folder's stamp shows it unchanged since it was last found whole
    (see the module's docstring); a whole export whose files have settled is stamped.
    """
    records = meta.get(FILES_KEY)
    if not isinstance(records, dict) or set(records) != set(names):
        return f"{META_FILE} records no size and sha256 of its files"
    try:
        identities = {name: _identity(folder / name) for name in names}
    except OSError as exc:
        return f"{Path(str(exc.filename)).name}: unreadable ({exc.strerror or type(exc).__name__})"
    for name in names:
        record, size = records[name], identities[name][2]
        if not isinstance(record, dict) or record.get("size") != size:
            recorded = record.get("size") if isinstance(record, dict) else None
            return f"{name}: {size} bytes where {META_FILE} records {recorded}"
    stamp = {"meta": hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest(), "files": identities}
    if _read_stamp(folder) == stamp:
        return None
    for name in names:
        try:
            digest = _sha256(folder / name)
        except OSError as exc:
            return f"{name}: unreadable ({exc.strerror or type(exc).__name__})"
        if digest != records[name].get("sha256"):
            return f"{name}: its sha256 is not the one {META_FILE} records"
    now = time.time_ns()
    if all(now - identity[4] >= SETTLE_NS for identity in identities.values()):
        _write_stamp(folder, stamp)
    return None


def checked_meta(folder: Path, names: Sequence[str], kind: str | None = None) -> dict[str, Any] | None:
    """Return the meta file of the export cached in folder, its files (``names``) checked if it is usable.

    None where there is none, it is of another format or it exports another ``kind`` (the meta
    file's; CASE's exports record none). A foreign meta file, or a usable export whose files differ
    from their records, is a cache miss said in one line: the folder is discarded.
    """
    meta = read_meta(folder)
    if meta is None:
        return None
    problem = _foreign(folder, meta) or (export_problem(folder, meta, names) if meta.get(USABLE_KEY) else None)
    if problem is not None:
        log.warning(
            "the ONNX export cached in %s does not match its %s (%s); exporting it again", folder, META_FILE, problem
        )
        _discard(folder)
        return None
    return meta if meta.get("kind") == kind else None


def publish_export(tmp: Path, folder: Path | None, refused: str | None, graphs: Sequence[str], what: str) -> None:
    """Record in tmp's meta file whether its checked export is usable, then move tmp to folder (None: not cached).

    A refused export keeps its reason and drops its graph files, so that it is not tried again. If
    another process cached the same export first, that one stays: it is as good.
    """
    meta = json.loads((tmp / META_FILE).read_text())
    meta[USABLE_KEY] = refused is None
    if refused is not None:
        meta["refused"] = refused
        del meta[FILES_KEY]
        for name in graphs:
            (tmp / name).unlink()
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    if folder is not None:
        try:
            swap_dir(tmp, folder)
            log.info("cached %s in %s", what, folder)
        except OSError:
            pass
