"""ONNX exports of a BERT-style encoder: where they are cached, and running one without torch.

One export path, two precisions. ``float32`` is the encoder as it is (adapter merged): a one-shot
query runs it with onnxruntime instead of importing torch, which costs more than a few queries'
forward pass. ``int8`` is onnxruntime's dynamic int8 model (``--quantize int8``). Both are written
by :mod:`condsearch.encoders.onnx_export` through torch, checked against the torch model, and
only then marked usable; this module reads them with onnxruntime, ``tokenizers`` and numpy alone.

An export is cached under the cache dir's ``onnx/``, keyed by model, revision, adapter,
precision and the onnxruntime, onnx and torch versions (read from package metadata, so that
computing the key imports none of them).

Its ``export.json`` records the cache folder it was written for and the size and sha256 of each
file (:data:`EXPORT_FILES`), and nothing is loaded that does not match them: a file damaged or
swapped in (another profile's export copied over this one) is a cache miss, said in one line, and
the export is written again. Hashing the 90 MB of MiniLM's weights takes 50-60 ms here (SHA-NI;
a few times that on a CPU without it), against 0.8 s for a whole one-shot query, so a verified
export is stamped (:data:`STAMP_FILE`) with each file's device, inode, size, modification and
change times, and hashed again only when one of those moves. Any write to a file moves its change
time, which no one but the clock can set back; a file changed within :data:`SETTLE_NS` of its check
could keep the same timestamp tick, so files that young are hashed at every load, never stamped
(the rule of :mod:`condsearch.base.file_digest`, which a local model folder's revision follows too).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np

from condsearch.artifacts.adapters import read_adapter
from condsearch.base.atomic import replacing_file, swap_dir, temporary_name
from condsearch.base.file_digest import SETTLE_NS
from condsearch.base.file_digest import file_identity as _identity
from condsearch.base.file_digest import sha256_file as _sha256
from condsearch.base.model_sources import ModelSource
from condsearch.base.output_cache import default_cache_dir
from condsearch.encoders.base import Encoder, Pair
from condsearch.encoders.bert_inputs import TokenSorted, case_inputs, max_length_for
from condsearch.errors import ModelError

log = logging.getLogger(__name__)

Precision = Literal["float32", "int8"]
#: 2: export.json records its cache folder and each file's size and sha256 (checked on every load)
FORMAT_VERSION = 2
#: the cached exports live here, under default_cache_dir() (beside "features", the encoder outputs)
CACHE_SUBDIR = "onnx"
MODEL_FILE = "model.onnx"
#: the model's weights, beside it: onnxruntime maps them instead of parsing them out of the
#: protobuf, which halves a session's start here (0.3 -> 0.13 s for MiniLM)
WEIGHTS_FILE = "model.onnx.data"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "export.json"
#: the files of a usable export, each recorded in the meta file under FILES_KEY as {"size", "sha256"}
EXPORT_FILES = (MODEL_FILE, WEIGHTS_FILE, TOKENIZER_FILE)
FILES_KEY = "files"
#: in the meta file: the name of the cache folder the export was written for (its key's digest)
FOLDER_KEY = "folder"
#: beside the meta file: the files' identities (device, inode, size, mtime, ctime) when last hashed and found whole
STAMP_FILE = "verified.json"
#: in the meta file: the export's outputs agreed with the torch model's when it was written
USABLE_KEY = "usable"
#: what an export depends on besides the model; a missing one is a one-line error
RUNTIME_PACKAGES = ("onnxruntime", "onnx", "torch")
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
#: rows per onnxruntime run: a batch runs as runs of this many pairs of like token length, each
#: padded only to its own longest. On 512 C-STS dev pairs (about 24 tokens, batches of 64 sorted
#: by characters, 2 loaded cores) int8 went 306 -> 464 pairs/s and the float32 export 160 -> 196
#: (issue 28, benchmarks/systems/results/int8_study.json): less padding (1.20 -> about 1.04 tokens per
#: real token), and smaller activations (batches of 16 alone gave most of it; runs of 8 or 32 did no
#: better: benchmarks/systems/results/int8_study_runs.json)
RUN_ROWS = 16


class _Encoded(dict):  # type: ignore[type-arg]
    """Tokenizer output: lists per key, as transformers' BatchEncoding, with ``sequence_ids``."""

    def __init__(self, data: dict[str, list[list[int]]], encodings: list[Any]) -> None:
        super().__init__(data)
        self._encodings = encodings

    def sequence_ids(self, i: int) -> list[int | None]:
        return list(self._encodings[i].sequence_ids)


class BackendTokenizer:
    """The part of a transformers fast tokenizer that :mod:`.bert_inputs` uses, over ``tokenizers`` alone.

    A transformers fast tokenizer is this same backend plus truncation and padding set per call; as there,
    the settings are the backend's, so calls run one at a time (:mod:`.serial_tokenizer`).
    """

    is_fast = True

    def __init__(self, backend: Any, meta: Mapping[str, Any]) -> None:
        self.backend = backend
        self.pad_token_id: int | None = meta["pad_token_id"]
        self.model_max_length = int(meta["model_max_length"])
        self.model_input_names: list[str] = list(meta["model_input_names"])
        self.truncation_side = str(meta.get("truncation_side", "right"))
        self._lock = threading.Lock()

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return int(self.backend.num_special_tokens_to_add(pair))

    def __call__(
        self,
        text: Sequence[str],
        text_pair: Sequence[str] | None = None,
        *,
        truncation: bool | str = False,
        max_length: int | None = None,
        add_special_tokens: bool = True,
    ) -> _Encoded:
        inputs = list(text) if text_pair is None else list(zip(text, text_pair, strict=True))
        with self._lock:
            if truncation and max_length:
                strategy = "longest_first" if truncation is True else str(truncation)
                self.backend.enable_truncation(max_length, strategy=strategy, direction=self.truncation_side)
            else:
                self.backend.no_truncation()
            self.backend.no_padding()
            encodings = self.backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
        fields = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}
        data = {key: [list(getattr(e, fields[key])) for e in encodings] for key in self.model_input_names}
        return _Encoded(data, encodings)


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


def runtime_versions() -> dict[str, str]:
    """Return the versions an export depends on; a one-line error if onnxruntime, onnx or torch is missing."""
    versions = {}
    for package in RUNTIME_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            raise ModelError(f"the ONNX encoder needs {package}: pip install {package}") from None
    return versions


def export_folder(source: ModelSource, adapter: Path | None, precision: Precision) -> Path | None:
    """Return where an export of a model (with an adapter merged) is cached, or None if unsafe to cache.

    A hub model that is not in the local cache resolves to revision 'main', which names no weights.
    """
    if source.revision == "main":
        return None
    key = [
        FORMAT_VERSION,
        source.model_id,
        source.revision,
        read_adapter(adapter).key if adapter is not None else "",  # its checksum and shape (kind, rank, alpha)
        precision,
        runtime_versions(),
    ]
    return default_cache_dir() / CACHE_SUBDIR / hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]


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


def _cached_meta(folder: Path) -> dict[str, Any] | None:
    """Return the meta file of the export cached in folder, or None: missing, of another format or foreign."""
    meta = read_meta(folder)
    return meta if meta is not None and _foreign(folder, meta) is None else None


def file_records(folder: Path, names: Sequence[str] = EXPORT_FILES) -> dict[str, dict[str, object]]:
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


def export_problem(folder: Path, meta: Mapping[str, Any], names: Sequence[str] = EXPORT_FILES) -> str | None:
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


class OnnxBertEncoder(TokenSorted, Encoder):
    """:class:`~condsearch.encoders.bert.BertStyleEncoder`'s vectors (condition-mean pooling) from onnxruntime.

    Tokenisation and pooling are the torch encoder's (:mod:`.bert_inputs`); a batch runs as runs
    of :attr:`run_rows` pairs of like length (:data:`RUN_ROWS`), which changes float32 vectors by
    rounding only, int8 ones by their activation scales (one per run). In float32 its
    ``describe()`` equals the torch encoder's for the same model, adapter and token limit; int8
    adds ``quantize`` and ``quantize_runtime``, so that int8 vectors never mix with float32 ones.
    """

    pooling = "condition-mean"
    #: pairs per onnxruntime run (0: the whole batch in one run); see :data:`RUN_ROWS`
    run_rows = RUN_ROWS

    def __init__(
        self,
        source: ModelSource,
        tokenizer: BackendTokenizer,
        session: Any,
        meta: dict[str, Any],
        max_length: int | None,
    ) -> None:
        super().__init__()
        self.tokenizer, self.session = tokenizer, session
        self.model_id, self.revision = source.model_id, source.revision
        config = SimpleNamespace(**meta["config"])
        self.dim = int(config.hidden_size)
        self.max_length = max_length_for(source.location, tokenizer.model_max_length, max_length, config)
        self.precision: Precision = meta["precision"]
        self.runtime = f"onnxruntime {meta['runtime']['onnxruntime']}"
        self.adapter_checksum = ""
        self._inputs = [i.name for i in session.get_inputs()]

    def describe(self) -> dict[str, object]:
        info = {**super().describe(), "pooling": self.pooling, "max_length": self.max_length}
        if self.adapter_checksum:
            info["adapter_checksum"] = self.adapter_checksum
        if self.precision == "int8":
            info |= {"quantize": "int8", "quantize_runtime": self.runtime}
        return info

    def encode_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        batch, pool = case_inputs(self.tokenizer, pairs, self.max_length, self.stats)
        zeros = np.zeros_like(batch["input_ids"])
        mask = batch.get("attention_mask")
        # right-padded: a row's real tokens come first, so a run cut to its longest row loses only padding
        lengths = mask.sum(axis=1) if mask is not None else np.full(len(pairs), zeros.shape[1])
        order = np.argsort(-lengths, kind="stable")
        rows = self.run_rows if self.run_rows > 0 else len(pairs)
        out = np.empty((len(pairs), self.dim), dtype=np.float32)
        for start in range(0, len(pairs), rows):
            run = order[start : start + rows]
            width = int(lengths[run].max())
            (hidden,) = self.session.run(None, {name: batch.get(name, zeros)[run, :width] for name in self._inputs})
            weights = pool[run, :width]
            summed = (hidden * weights[:, :, None]).sum(axis=1)
            out[run] = summed / np.maximum(weights.sum(axis=1, keepdims=True), 1.0)
        return out


def _session(path: Path, threads: int) -> Any:
    try:
        import onnxruntime as ort
    except ImportError:
        raise ModelError("the ONNX encoder needs onnxruntime: pip install onnxruntime") from None

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Its idle threads would otherwise spin after each run, on the cores FAISS searches with next
    # (a served query's search took 20 ms beside them instead of 7; benchmarks/README, issue 28).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def read_export(
    folder: Path, source: ModelSource, *, max_length: int | None, threads: int, verify: bool = True
) -> OnnxBertEncoder | None:
    """Return the encoder of the export in folder (usable or not), or None if there is none or it is unreadable.

    ``verify``: folder is a cache folder, and its files must match what its meta file records
    (:func:`export_problem`); False only for an export just written, before it is checked against torch.
    """
    meta = _cached_meta(folder) if verify else read_meta(folder)
    if meta is None or not (folder / MODEL_FILE).is_file():
        return None
    if verify and export_problem(folder, meta) is not None:
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = BackendTokenizer(Tokenizer.from_file(str(folder / TOKENIZER_FILE)), meta["tokenizer"])
        return OnnxBertEncoder(source, tokenizer, _session(folder / MODEL_FILE, threads), meta, max_length)
    except Exception as exc:  # noqa: BLE001 - a damaged export is only a cache miss
        log.info("ignoring the ONNX export in %s (%s)", folder, type(exc).__name__)
        return None


def checked_meta(folder: Path, names: Sequence[str] = EXPORT_FILES) -> dict[str, Any] | None:
    """Return the meta file of the export cached in folder, its files (``names``) checked if it is usable.

    None where there is none or it is of another format. A foreign meta file, or a usable export whose
    files differ from their records, is a cache miss said in one line: the folder is discarded.
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
    return meta


def load_cached_export(
    source: ModelSource, precision: Precision, *, max_length: int | None, adapter: Path | None, threads: int
) -> OnnxBertEncoder | None:
    """Return the encoder of a model's cached, usable export (adapter merged), or None (a cache miss)."""
    from condsearch.artifacts.adapters import checked_checksum

    folder = export_folder(source, adapter, precision)
    meta = checked_meta(folder) if folder is not None else None
    if folder is None or meta is None or not meta.get(USABLE_KEY):
        return None
    encoder = read_export(folder, source, max_length=max_length, threads=threads, verify=False)  # verified just now
    if encoder is not None and adapter is not None:
        encoder.adapter_checksum = checked_checksum(adapter, encoder)
    return encoder


def refusal(folder: Path | None) -> str | None:
    """Return why the export cached in folder was refused when it was written, or None if it was not."""
    meta = _cached_meta(folder) if folder is not None else None
    return None if meta is None or meta.get(USABLE_KEY) else str(meta.get("refused", "refused"))
