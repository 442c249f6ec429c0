"""Write an ONNX export of a BERT-style encoder through torch, checked against it before it is used.

The float32 encoder (its LoRA adapter merged) is exported with ``torch.onnx``. For ``int8`` the
export is then quantised by onnxruntime's ``quantize_dynamic``: int8 weights per output
channel, activations quantised per batch at run time, for the encoder's matrix products only
(embeddings, LayerNorm, softmax and GELU stay float32). Measured here against PyTorch's own
dynamic quantisation, onnxruntime was the faster and the closer to float32
(benchmarks/README.md). Tokenisation, condition-segment pooling and the head are the float32
encoder's, untouched.

Before an export is marked usable its pooled outputs on probe pairs are compared with the torch
model's: float32 must agree within :func:`probe_tolerance` (float32 rounding at the largest
activation the probe reaches, :mod:`condsearch.encoders.rounding`, and never less than
:data:`FLOAT32_TOLERANCE`), int8 within a cosine of :data:`MIN_INT8_COSINE`. A refused export is
recorded, so that it is not tried again.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from condsearch.base.model_sources import ModelSource
from condsearch.encoders.base import Pair
from condsearch.encoders.bert import BertStyleEncoder
from condsearch.encoders.onnx_files import (
    FILES_KEY,
    FOLDER_KEY,
    FORMAT_VERSION,
    INPUTS,
    META_FILE,
    MODEL_FILE,
    TOKENIZER_FILE,
    USABLE_KEY,
    WEIGHTS_FILE,
    OnnxBertEncoder,
    Precision,
    export_folder,
    file_records,
    load_cached_export,
    publish_export,
    read_export,
    refusal,
    runtime_versions,
)
from condsearch.encoders.rounding import float_tolerance, largest_activation, transformer_depth
from condsearch.errors import ModelError

log = logging.getLogger(__name__)

#: the least difference of a float32 export's pooled outputs from torch's on the probe that refuses it;
#: past it, the bound grows with the probe's activations (:func:`probe_tolerance`): an adapter with
#: large activations rounds by more on any CPU, and another CPU's kernels round otherwise
FLOAT32_TOLERANCE = 1e-4
#: an int8 export whose pooled outputs fall below this cosine to float32 on the probe is refused
MIN_INT8_COSINE = 0.9
_CONFIG_KEYS = ("hidden_size", "max_position_embeddings", "model_type")
_PROBE: list[Pair] = [
    ("the condition", "a probe sentence, with a comma"),
    ("another one", "short"),
    ("the colour of the dress", "A girl in an orange dress serves the ball."),
    ("the sport", None),
]


class _Last(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> Any:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out.last_hidden_state


@contextmanager
def root_quiet() -> Iterator[None]:
    """Raise the root logger to ERROR while inside (onnx and its quantiser advise on it), then restore it."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _tokenizer_files(tokenizer: Any) -> tuple[str, dict[str, Any]]:
    """Return (tokenizer.json text, the settings BackendTokenizer reads) of a loaded fast tokenizer."""
    from tokenizers import Tokenizer

    backend = tokenizer.backend_tokenizer  # a transformers fast tokenizer
    plain = Tokenizer.from_str(backend.to_str())  # the loaded one keeps its truncation and padding
    plain.no_truncation()
    plain.no_padding()
    meta = {
        "pad_token_id": tokenizer.pad_token_id,
        "model_max_length": int(min(tokenizer.model_max_length, 1 << 30)),
        "model_input_names": list(tokenizer.model_input_names),
        "truncation_side": getattr(tokenizer, "truncation_side", "right"),
    }
    return plain.to_str(), meta


def on_cpu(encoder: BertStyleEncoder, source: ModelSource) -> BertStyleEncoder:
    """Return the encoder if it runs on the CPU in float32, else such a copy of it (the export's reference)."""
    if encoder.device.type == "cpu" and encoder.dtype == torch.float32:
        return encoder
    loaded = (encoder.tokenizer, copy.deepcopy(encoder.model))
    twin = BertStyleEncoder(source, device="cpu", max_length=encoder.max_length, loaded=loaded)
    twin.adapter_checksum = encoder.adapter_checksum
    return twin


def _traceable(model: nn.Module) -> nn.Module:
    # transformers' BertModel traces to a graph that computes something else here (its mask
    # handling); PlainBert, with the same weights, traces to the right one (see .onnx_trace)
    from condsearch.encoders.onnx_trace import as_plain, supports

    config: Any = getattr(model, "config", None)
    if config is None or not supports(config.to_dict()):
        return model
    return as_plain(model) or model


def export_hidden(module: nn.Module, args: tuple[torch.Tensor, ...], path: Path) -> None:
    """Export a module of (input_ids, attention_mask, token_type_ids) -> last hidden state, batch and tokens dynamic."""
    axes = {name: {0: "batch", 1: "tokens"} for name in (*INPUTS, "hidden")}
    torch.onnx.export(
        module,
        args,
        str(path),
        input_names=list(INPUTS),
        output_names=["hidden"],
        dynamic_axes=axes,
        opset_version=17,
        dynamo=False,
    )


def export_onnx(
    encoder: BertStyleEncoder,
    folder: Path,
    precision: Precision,
    versions: dict[str, str],
    cache_name: str | None = None,
) -> None:
    """Write the export of a CPU float32 encoder (model, tokenizer, meta not yet usable) into an empty folder.

    The meta file records ``cache_name``, the cache folder it is written for (None: not cached), and
    each file's size and sha256, which every load checks.
    """
    batch, _ = encoder._tokenize(_PROBE)
    if "token_type_ids" not in batch:
        batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    args = tuple(batch[name] for name in INPUTS)
    plain = folder / ("model.float32.onnx" if precision == "int8" else MODEL_FILE)
    try:
        # the TorchScript exporter's deprecation notice and onnxruntime's pre-processing advice
        # (logged on the root logger) concern neither the user nor this model
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings(), root_quiet():
            warnings.simplefilter("ignore")
            export_hidden(_Last(_traceable(encoder.model)), args, plain)
            if precision == "int8":
                quantize_int8(plain, folder / MODEL_FILE)
            weights_beside(folder / MODEL_FILE)
    except Exception as exc:  # noqa: BLE001 - the exporter's and quantiser's errors have no common base
        raise ModelError(
            f"{encoder.model_id}: cannot export to {precision} ONNX ({type(exc).__name__}: {exc})"
        ) from exc
    text, tokenizer_meta = _tokenizer_files(encoder.tokenizer)
    (folder / TOKENIZER_FILE).write_text(text)
    config = {k: getattr(encoder.model.config, k, None) for k in _CONFIG_KEYS}
    meta = {
        "format_version": FORMAT_VERSION,
        "precision": precision,
        USABLE_KEY: False,
        "config": config,
        "tokenizer": tokenizer_meta,
        "runtime": versions,
        FOLDER_KEY: cache_name,
        FILES_KEY: file_records(folder),
    }
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def quantize_int8(plain: Path, path: Path) -> None:
    """Write onnxruntime's dynamic int8 model of the float32 ONNX model plain to path, and remove plain.

    int8 weights per output channel, activations quantised per run, matrix products only.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(plain), str(path), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"]
    )
    plain.unlink()


def weights_beside(path: Path, location: str = WEIGHTS_FILE) -> None:
    """Move an ONNX model's weights out of its protobuf into the file ``location`` beside it."""
    import onnx

    model = onnx.load(str(path))
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location)


def pooled_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the row-wise cosine of two (n, dim) arrays (int8 against float32 outputs, for reports)."""
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


def probe_tolerance(model: nn.Module, largest: float) -> float:
    """Return how far a float32 export's pooled outputs may stray from torch's on the probe.

    ``largest``: the largest |activation| of ``model``'s forward pass on the probe. Two correct float32
    runs differ by rounding at that magnitude, through the model's depth; never less than FLOAT32_TOLERANCE.
    """
    return max(FLOAT32_TOLERANCE, float_tolerance(largest, depth=transformer_depth(model)))


def _disagreement(reference: BertStyleEncoder, export: OnnxBertEncoder) -> str | None:
    """Return why the export's probe outputs stray too far from the reference's, or None if they agree."""
    with largest_activation(reference.model) as found:
        want = reference.encode_batch(_PROBE)
    got = export.encode_batch(_PROBE)
    if export.precision == "int8":
        cosine = float(pooled_cosines(want, got).min())
        return None if cosine >= MIN_INT8_COSINE else f"cosine {cosine:.3f} < {MIN_INT8_COSINE}"
    gap, bound = float(np.abs(want - got).max()), probe_tolerance(reference.model, max(found, default=0.0))
    return None if gap <= bound else f"max difference {gap:.3g} > {bound:.3g}"


def write_export(
    reference: BertStyleEncoder,
    source: ModelSource,
    folder: Path | None,
    precision: Precision,
    *,
    max_length: int | None,
    threads: int,
) -> tuple[OnnxBertEncoder | None, str | None]:
    """Export a float32 encoder of source, check it and cache it in folder (None: not cached).

    Returns (encoder, None), or (None, why) when the export was refused; a refusal is cached too,
    so that it is not tried again. An unreadable folder there is replaced.
    """
    reference = on_cpu(reference, source)
    parent = folder.parent if folder is not None else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=parent))
    try:
        export_onnx(reference, tmp, precision, runtime_versions(), folder.name if folder is not None else None)
        encoder = read_export(tmp, source, max_length=max_length, threads=threads, verify=False)
        if encoder is None:
            raise ModelError(f"{reference.model_id}: the {precision} ONNX export cannot be read back")
        encoder.adapter_checksum = reference.adapter_checksum
        refused = _disagreement(reference, encoder)
        what = f"the {precision} ONNX export of {reference.model_id}"
        publish_export(tmp, folder, refused, (MODEL_FILE, WEIGHTS_FILE), what)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the session holds the model in memory
    return (None, refused) if refused is not None else (encoder, None)


def load_int8_encoder(
    source: ModelSource, *, max_length: int | None, adapter: Path | None, threads: int | None = None
) -> OnnxBertEncoder:
    """Return the int8 encoder of a BERT-style model (adapter merged), exporting it the first time.

    ``threads``: onnxruntime's intra-op threads [default: torch's count, one per physical core].
    """
    threads = threads or torch.get_num_threads()
    encoder = load_cached_export(source, "int8", max_length=max_length, adapter=adapter, threads=threads)
    if encoder is not None:
        return encoder
    folder = export_folder(source, adapter, "int8")
    refused = refusal(folder)
    if refused is None:
        reference = BertStyleEncoder(source, device="cpu", max_length=max_length)
        if adapter is not None:
            from condsearch.encoders.lora import apply_adapter

            apply_adapter(reference, adapter)
        encoder, refused = write_export(reference, source, folder, "int8", max_length=max_length, threads=threads)
    if encoder is None:
        raise ModelError(f"{source.model_id}: int8 outputs stray from float32 ({refused})")
    return encoder
