"""CASE's ONNX export: a BERT-style encoder (adapter merged) as one graph, and :class:`OnnxBertEncoder`, which runs it.

One export path, two precisions. ``float32`` is the encoder as it is: a one-shot query runs it with
onnxruntime instead of importing torch, which costs more than a few queries' forward pass, and
bulk work on a CPU kind whose measured path is onnxruntime runs it too. ``int8`` is onnxruntime's
dynamic int8 model (``--quantize int8``, :func:`load_int8_encoder`). Both are written and checked
by the backend (:mod:`condsearch.model.encoders.onnx.export`, which this module imports only when it
writes one, with torch); reading one needs onnxruntime, ``tokenizers`` and numpy alone.
Tokenisation, condition-segment pooling and the head are the torch encoder's, untouched.

An export is cached under the cache dir's ``onnx/`` (:mod:`condsearch.model.encoders.onnx.cache`), keyed
by model, revision, adapter and precision (:func:`export_folder`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from condsearch.base.model_sources import ModelSource
from condsearch.base.output_cache import default_cache_dir
from condsearch.errors import ModelError
from condsearch.model.artifacts.adapters import read_adapter
from condsearch.model.encoders.base import Encoder, Pair
from condsearch.model.encoders.bert_inputs import TokenSorted, case_inputs, max_length_for
from condsearch.model.encoders.onnx.cache import (
    TOKENIZER_FILE,
    USABLE_KEY,
    Precision,
    cache_folder,
    cached_meta,
    checked_meta,
    export_problem,
    read_meta,
    refusal,
)
from condsearch.model.encoders.onnx.run import INPUTS, RUN_ROWS, BackendTokenizer, open_export, read_tokenizer, runs

if TYPE_CHECKING:
    import torch

    from condsearch.model.encoders.bert import BertStyleEncoder
    from condsearch.model.encoders.onnx.export import Graph

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
#: the model's weights, beside it: onnxruntime maps them instead of parsing them out of the
#: protobuf, which halves a session's start here (0.3 -> 0.13 s for MiniLM)
WEIGHTS_FILE = MODEL_FILE + ".data"
#: the files of a usable export, each recorded in its meta file (size and sha256)
EXPORT_FILES = (MODEL_FILE, WEIGHTS_FILE, TOKENIZER_FILE)
#: the graph's output: the last hidden state, pooled in numpy
OUTPUT = "hidden"
_CONFIG_KEYS = ("hidden_size", "max_position_embeddings", "model_type")
_PROBE: list[Pair] = [
    ("the condition", "a probe sentence, with a comma"),
    ("another one", "short"),
    ("the colour of the dress", "A girl in an orange dress serves the ball."),
    ("the sport", None),
]


class OnnxBertEncoder(TokenSorted, Encoder):
    """:class:`~condsearch.model.encoders.bert.BertStyleEncoder`'s vectors (condition-mean pooling) from onnxruntime.

    Tokenisation and pooling are the torch encoder's (:mod:`condsearch.model.encoders.bert_inputs`); a
    batch runs as runs of :attr:`run_rows` pairs of like length
    (:func:`condsearch.model.encoders.onnx.run.runs`). In float32 its ``describe()`` equals the torch
    encoder's for the same model, adapter and token limit; int8 adds ``quantize`` and
    ``quantize_runtime``, so that int8 vectors never mix with float32 ones.
    """

    pooling = "condition-mean"
    #: pairs per onnxruntime run (0: the whole batch in one run);
    #: see :data:`~condsearch.model.encoders.onnx.run.RUN_ROWS`
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
        out = np.empty((len(pairs), self.dim), dtype=np.float32)
        for run, width in runs(lengths, self.run_rows):
            (hidden,) = self.session.run(None, {name: batch.get(name, zeros)[run, :width] for name in self._inputs})
            weights = pool[run, :width]
            summed = (hidden * weights[:, :, None]).sum(axis=1)
            out[run] = summed / np.maximum(weights.sum(axis=1, keepdims=True), 1.0)
        return out


def export_folder(source: ModelSource, adapter: Path | None, precision: Precision) -> Path | None:
    """Return where an export of a model (with an adapter merged) is cached, or None if unsafe to cache.

    A hub model that is not in the local cache resolves to revision 'main', which names no weights.
    """
    if source.revision == "main":
        return None
    adapter_key = read_adapter(adapter).key if adapter is not None else ""  # its checksum and shape (kind, rank, alpha)
    return cache_folder(default_cache_dir(), [source.model_id, source.revision, adapter_key], precision)


def read_export(
    folder: Path, source: ModelSource, *, max_length: int | None, threads: int, verify: bool = True
) -> OnnxBertEncoder | None:
    """Return the encoder of the export in folder (usable or not), or None if there is none or it is unreadable.

    ``verify``: folder is a cache folder, and its files must match what its meta file records
    (:func:`~condsearch.model.encoders.onnx.cache.export_problem`); False only for an export just written,
    before it is checked against torch, or one checked just now.
    """
    meta = cached_meta(folder) if verify else read_meta(folder)
    if meta is None or not (folder / MODEL_FILE).is_file():
        return None
    if verify and export_problem(folder, meta, EXPORT_FILES) is not None:
        return None
    tokenizer = read_tokenizer(folder, meta)
    if tokenizer is None:
        return None

    def build(sessions: list[Any]) -> OnnxBertEncoder:
        return OnnxBertEncoder(source, tokenizer, sessions[0], meta, max_length)

    return open_export(folder, (MODEL_FILE,), threads, build)


def load_cached_export(
    source: ModelSource, precision: Precision, *, max_length: int | None, adapter: Path | None, threads: int
) -> OnnxBertEncoder | None:
    """Return the encoder of a model's cached, usable export (adapter merged), or None (a cache miss)."""
    from condsearch.model.artifacts.adapters import checked_checksum

    folder = export_folder(source, adapter, precision)
    meta = checked_meta(folder, EXPORT_FILES) if folder is not None else None
    if folder is None or meta is None or not meta.get(USABLE_KEY):
        return None
    encoder = read_export(folder, source, max_length=max_length, threads=threads, verify=False)  # verified just now
    if encoder is not None and adapter is not None:
        encoder.adapter_checksum = checked_checksum(adapter, encoder)
    return encoder


def cached_refusal(folder: Path | None) -> str | None:
    """Return why the export cached in folder was refused when it was written, or None if it was not."""
    return refusal(cached_meta(folder)) if folder is not None else None


def graph(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> Graph:
    """Return CASE's graph of a module of (input_ids, attention_mask, token_type_ids) -> last hidden state."""
    from condsearch.model.encoders.onnx.export import Graph

    axes = {name: {0: "batch", 1: "tokens"} for name in (*INPUTS, OUTPUT)}
    return Graph(MODEL_FILE, module, args, INPUTS, (OUTPUT,), axes)


def export_onnx(encoder: BertStyleEncoder, folder: Path, precision: Precision, cache_name: str | None = None) -> None:
    """Write the export of a CPU float32 encoder (model, tokenizer, meta not yet usable) into an empty folder.

    The model traced is :class:`~condsearch.model.encoders.onnx.trace.PlainBert` with its weights where it
    computes this model (transformers' BertModel traces to a graph that computes something else
    here), else the model itself. ``cache_name``: the cache folder it is written for (None: not cached).
    """
    import torch

    from condsearch.model.encoders.onnx.export import export_graphs, write_meta
    from condsearch.model.encoders.onnx.trace import LastHidden, plain_bert

    batch, _ = encoder._tokenize(_PROBE)
    if "token_type_ids" not in batch:
        batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    module = LastHidden(plain_bert(encoder.model) or encoder.model)
    traced = graph(module, tuple(batch[name] for name in INPUTS))
    export_graphs([traced], folder, precision, f"{encoder.model_id}: cannot export to {precision} ONNX")
    config = {k: getattr(encoder.model.config, k, None) for k in _CONFIG_KEYS}
    write_meta(folder, encoder.tokenizer, precision, cache_name, EXPORT_FILES, config=config)


def on_cpu(encoder: BertStyleEncoder, source: ModelSource) -> BertStyleEncoder:
    """Return the encoder if it runs on the CPU in float32, else such a copy of it (the export's reference)."""
    import torch

    from condsearch.model.encoders.bert import BertStyleEncoder

    if encoder.device.type == "cpu" and encoder.dtype == torch.float32:
        return encoder
    loaded = (encoder.tokenizer, copy.deepcopy(encoder.model))
    twin = BertStyleEncoder(source, device="cpu", max_length=encoder.max_length, loaded=loaded)
    twin.adapter_checksum = encoder.adapter_checksum
    return twin


def write_export(
    reference: BertStyleEncoder,
    source: ModelSource,
    folder: Path | None,
    precision: Precision,
    *,
    max_length: int | None,
    threads: int,
) -> tuple[OnnxBertEncoder | None, str | None]:
    """Export a float32 encoder of source, check it on the probe and cache it in folder (None: not cached).

    Returns (encoder, None), or (None, why) when the export was refused; a refusal is cached too,
    so that it is not tried again (:func:`condsearch.model.encoders.onnx.export.write_checked`).
    """
    from condsearch.model.encoders.onnx.export import disagreement, write_checked

    reference = on_cpu(reference, source)

    def read(tmp: Path) -> OnnxBertEncoder | None:
        encoder = read_export(tmp, source, max_length=max_length, threads=threads, verify=False)
        if encoder is not None:
            encoder.adapter_checksum = reference.adapter_checksum
        return encoder

    def check(encoder: OnnxBertEncoder) -> str | None:
        want, got = (lambda: reference.encode_batch(_PROBE)), (lambda: encoder.encode_batch(_PROBE))
        return disagreement(reference.model, want, got, precision)

    return write_checked(
        folder,
        write=lambda tmp, cache_name: export_onnx(reference, tmp, precision, cache_name),
        read=read,
        check=check,
        graphs=(MODEL_FILE, WEIGHTS_FILE),
        what=f"the {precision} ONNX export",
        model_id=reference.model_id,
    )


def load_int8_encoder(
    source: ModelSource, *, max_length: int | None, adapter: Path | None, threads: int | None = None
) -> OnnxBertEncoder:
    """Return the int8 encoder of a BERT-style model (adapter merged), exporting it the first time.

    ``threads``: onnxruntime's intra-op threads [default: torch's count, one per physical core].
    """
    import torch

    from condsearch.model.encoders.bert import BertStyleEncoder

    threads = threads or torch.get_num_threads()
    encoder = load_cached_export(source, "int8", max_length=max_length, adapter=adapter, threads=threads)
    if encoder is not None:
        return encoder
    folder = export_folder(source, adapter, "int8")
    refused = cached_refusal(folder)
    if refused is None:
        reference = BertStyleEncoder(source, device="cpu", max_length=max_length)
        if adapter is not None:
            from condsearch.model.encoders.lora import apply_adapter

            apply_adapter(reference, adapter)
        encoder, refused = write_export(reference, source, folder, "int8", max_length=max_length, threads=threads)
    if encoder is None:
        raise ModelError(f"{source.model_id}: int8 outputs stray from float32 ({refused})")
    return encoder
