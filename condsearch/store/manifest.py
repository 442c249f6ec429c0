"""An index's manifest: its fields, their types, and the one function that reads and checks them.

``manifest.json`` sits beside the index files (:mod:`condsearch.store.folder`) and in a Milvus catalog
entry (:mod:`condsearch.scale.milvus`); both read it through :func:`manifest_from_dict`, which
checks every field's type and range so that a damaged manifest is one line, never a traceback.
"""

from __future__ import annotations

import functools
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from condsearch.base.cpu_kind import AUTO_DTYPE_KEY
from condsearch.errors import StoreError
from condsearch.store.vectors import VECTORS_FILE

# 2: versioned folders, index_size / index_mtime_ns / index_probe for the cheap load check
# 3: vectors.npy and rows' text hashes beside the index; search_params and fingerprint
# 4: files, the sha256 and size of every file of the index
# 5: spec, the EncoderSpec that loads the encoder again (before: read from the encoder record)
# 6: score_background, the scores of a sample of the index's row pairs (condsearch.query.calibration)
FORMAT_VERSION = 6
READABLE_FORMATS = (1, 2, 3, 4, 5, 6)
MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
ROWS_FILE = "rows.parquet"
INDEX_FILES = (INDEX_FILE, ROWS_FILE, VECTORS_FILE)  # what a version folder holds besides its manifest
#: how an index's vectors are made: case, the CASE bi-encoder (adapter + head); csr, the router tri-encoder
Mode = Literal["case", "csr"]
MODE_CASE: Mode = "case"
MODE_CSR: Mode = "csr"
#: the --mode choices
MODES: tuple[Mode, ...] = get_args(Mode)


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
    search_params: str = ""  # FAISS ParameterSpace string set on every load, e.g. "nprobe=32"
    fingerprint: str = ""  # condsearch.store.vectors.vector_fingerprint of the kept vectors ("" when none are kept)
    index_checksum: str = ""  # sha256 of index.faiss
    index_size: int = 0  # bytes of index.faiss (format 2; 0: unknown, so loads hash in full)
    index_mtime_ns: int = 0  # its modification time when written
    index_probe: str = ""  # sha256 of its first and last 64 KiB
    files: dict[str, dict[str, object]] = field(default_factory=dict)  # format 4: {file: {"sha256", "size"}}
    # format 5: condsearch.model.encoders.spec.EncoderSpec.to_dict()
    spec: dict[str, object] = field(default_factory=dict)
    # format 6: condsearch.store.background.score_background of the kept vectors ({}: none recorded)
    score_background: dict[str, object] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    condsearch_version: str = ""
    created_at: str = ""

    @property
    def precision(self) -> str:
        """Return what the vectors were encoded in: int8, a dtype asked for or chosen by auto, else float32."""
        return encoder_precision(self.encoder)


def encoder_precision(encoder: Mapping[str, object]) -> str:
    """Return what an encoder record's vectors are encoded in: int8, a dtype asked for or chosen by auto, else float32.

    Every vector of an index is in its manifest's precision: a re-index keeps the vectors of the last
    one only when they are in the precision it encodes in (condsearch.ingest.chunks).
    """
    if encoder.get("quantize") == "int8":
        return "int8"
    return str(encoder.get("dtype") or encoder.get(AUTO_DTYPE_KEY) or "float32")


def manifest_from_dict(raw: object, where: Path | str) -> Manifest:
    """Return the Manifest a parsed manifest.json holds, each field checked; raise StoreError naming where."""
    if not isinstance(raw, dict) or raw.get("format_version") not in READABLE_FORMATS:
        version = raw.get("format_version") if isinstance(raw, dict) else None
        raise StoreError(f"{where}: unsupported index format {version!r} (expected {FORMAT_VERSION})")
    names = {f.name for f in fields(Manifest)}
    required = {f.name for f in fields(Manifest) if f.default is MISSING and f.default_factory is MISSING}
    odd = sorted(raw.keys() - names) or sorted(required - raw.keys())
    if odd:
        raise StoreError(f"{where}: manifest fields do not match this condsearch version (field {odd[0]!r})")
    problem = _field_problem(raw)
    if problem:
        raise StoreError(f"{where}: corrupt manifest ({problem})")
    return Manifest(**raw)


_SHA256 = re.compile(r"[0-9a-f]{64}")
_MINIMUM = {"dim": 1, "n_vectors": 0, "n_skipped": 0, "index_size": 0}
_KINDS = {str: "str", int: "int", dict: "a JSON object"}


@functools.cache
def _field_types() -> dict[str, type]:
    """Return each Manifest field's runtime type (dict for dict[...])."""
    hints = typing.get_type_hints(Manifest)
    return {name: typing.get_origin(hint) or hint for name, hint in hints.items()}


def _field_problem(raw: dict[str, Any]) -> str:
    """Return what is wrong with a manifest's fields, in a few words, or "" when nothing is."""
    for name, kind in _field_types().items():
        if name not in raw:
            continue
        value = raw[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"field {name!r} should be {_KINDS[kind]}"
        if name in _MINIMUM and typing.cast(int, value) < _MINIMUM[name]:
            return f"field {name!r} should be an int >= {_MINIMUM[name]}"
    for file_name, record in raw.get("files", {}).items():
        if file_name not in INDEX_FILES:
            return f"field 'files' should be about {', '.join(INDEX_FILES)} only, not {file_name!r}"
        if not (
            isinstance(record, dict)
            and record.keys() == {"sha256", "size"}
            and isinstance(record["sha256"], str)
            and _SHA256.fullmatch(record["sha256"])
            and type(record["size"]) is int
            and record["size"] >= 0
        ):
            return f"field 'files' should be {{file: {{'sha256': hex digest, 'size': bytes}}}} for {file_name!r}"
    index = raw.get("files", {}).get(INDEX_FILE)
    if index is not None and (index["sha256"], index["size"]) != (raw.get("index_checksum"), raw.get("index_size")):
        return f"field 'files' should give {INDEX_FILE} the 'index_checksum' and 'index_size' that the manifest gives"
    return background_problem(raw.get("score_background", {}))


#: the fields of a manifest's ``score_background`` (:mod:`condsearch.query.calibration` writes and reads it)
BACKGROUND_FIELDS = ("sample_rows", "pairs", "seed", "mean", "std", "quantiles")


def background_problem(raw: object) -> str:
    """Return what is wrong with a manifest's ``score_background``, in a few words, or "" when nothing is."""
    if raw == {}:
        return ""
    if not isinstance(raw, dict) or sorted(raw) != sorted(BACKGROUND_FIELDS):
        return f"field 'score_background' should be {{}} or an object of {', '.join(BACKGROUND_FIELDS)}"
    counts = [raw[k] for k in ("sample_rows", "pairs", "seed")]
    if not all(type(c) is int and c >= 0 for c in counts) or raw["sample_rows"] < 2 or raw["pairs"] < 1:
        return "field 'score_background' should be of a sample of at least 2 rows and 1 pair"
    quantiles = raw["quantiles"]
    numbers = [raw["mean"], raw["std"], *(quantiles.values() if isinstance(quantiles, dict) else [None])]
    if not all(_is_number(v) for v in numbers) or raw["std"] < 0:
        return "field 'score_background' should be of finite numbers: mean, std >= 0, quantiles {quantile: score}"
    return ""


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)
