"""Writing an ONNX export through torch: its graphs traced, quantised for int8, checked against torch, cached.

One routine for every family: CASE's encoder (:mod:`condsearch.model.encoders.onnx.bert`, one graph)
and the router (:mod:`condsearch.model.csr.onnx`, its sentence pass and its routed pass) each give their
graphs (:class:`Graph`), a probe and how to read the export back; the rest is here.
:func:`export_graphs` traces each graph with ``torch.onnx`` (its weights beside it, which
onnxruntime maps instead of parsing: a session starts in half the time). For ``int8`` the float32
graph is then quantised by onnxruntime's ``quantize_dynamic``: int8 weights per output channel,
activations quantised per run, for the matrix products only (embeddings, LayerNorm, softmax and
GELU stay float32). Measured here against PyTorch's own dynamic quantisation, onnxruntime was the
faster and the closer to float32 (benchmarks/README.md). :func:`write_meta` adds the tokenizer and
the meta file (each file's size and sha256, :mod:`condsearch.model.encoders.onnx.cache`).

:func:`write_checked` writes an export in a temporary folder, reads it back and compares its outputs
on the family's probe with the torch model's (:func:`disagreement`): float32 must agree within
:func:`probe_tolerance` (float32 rounding at the largest activation the probe reaches,
:mod:`condsearch.model.encoders.onnx.rounding`, and never less than :data:`FLOAT32_TOLERANCE`), int8
within a cosine of :data:`MIN_INT8_COSINE`. Only then is it marked usable and renamed into the
cache, so a reader never sees half of one and two exporters do not collide; a refused export is
recorded, so that it is not tried again.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from condsearch.errors import ModelError
from condsearch.model.encoders.onnx.cache import (
    FILES_KEY,
    FOLDER_KEY,
    FORMAT_VERSION,
    META_FILE,
    TOKENIZER_FILE,
    USABLE_KEY,
    Precision,
    file_records,
    publish_export,
    runtime_versions,
)
from condsearch.model.encoders.onnx.rounding import float_tolerance, largest_activation, transformer_depth
from condsearch.model.encoders.onnx.run import Runner

log = logging.getLogger(__name__)

#: the least difference of a float32 export's outputs from torch's on the probe that refuses it;
#: past it, the bound grows with the probe's activations (:func:`probe_tolerance`): an adapter with
#: large activations rounds by more on any CPU, and another CPU's kernels round otherwise
FLOAT32_TOLERANCE = 1e-4
#: an int8 export whose outputs fall below this cosine to float32 on the probe is refused
MIN_INT8_COSINE = 0.9


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


@dataclass(frozen=True)
class Graph:
    """One graph of an export: its file's name, the torch module traced, example inputs and the names of each.

    ``axes``: the dynamic axes of the inputs and outputs, by name ({0: "batch", 1: "tokens"}).
    """

    name: str
    module: nn.Module
    args: tuple[torch.Tensor, ...]
    inputs: Sequence[str]
    outputs: Sequence[str]
    axes: Mapping[str, Mapping[int, str]]


def trace(graph: Graph, path: Path) -> None:
    """Write graph traced on its example inputs to path (TorchScript exporter, opset 17; weights inside)."""
    torch.onnx.export(
        graph.module,
        tuple(a.clone() for a in graph.args),  # an inference tensor cannot be traced outside inference mode
        str(path),
        input_names=list(graph.inputs),
        output_names=list(graph.outputs),
        dynamic_axes={name: dict(axes) for name, axes in graph.axes.items()},
        opset_version=17,
        dynamo=False,
    )


def quantize_int8(plain: Path, path: Path) -> None:
    """Write onnxruntime's dynamic int8 model of the float32 ONNX model plain to path, and remove plain.

    int8 weights per output channel, activations quantised per run, matrix products only.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(plain), str(path), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"]
    )
    plain.unlink()


def weights_beside(path: Path) -> None:
    """Move an ONNX model's weights out of its protobuf into the file ``<name>.data`` beside it."""
    import onnx

    model = onnx.load(str(path))
    location = f"{path.name}.data"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location)


def export_graphs(graphs: Sequence[Graph], folder: Path, precision: Precision, failure: str) -> None:
    """Write each graph into folder in precision, its weights beside it; ``failure`` begins the one-line error."""
    try:
        # the TorchScript exporter's deprecation notice and onnxruntime's pre-processing advice
        # (logged on the root logger) concern neither the user nor the model
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings(), root_quiet():
            warnings.simplefilter("ignore")
            for graph in graphs:
                path = folder / graph.name
                plain = path.with_name(f"{path.stem}.float32{path.suffix}") if precision == "int8" else path
                trace(graph, plain)
                if precision == "int8":
                    quantize_int8(plain, path)
                weights_beside(path)
    except Exception as exc:  # noqa: BLE001 - the exporter's and quantiser's errors have no common base
        raise ModelError(f"{failure} ({type(exc).__name__}: {exc})") from exc


def tokenizer_files(tokenizer: Any) -> tuple[str, dict[str, Any]]:
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


def write_meta(
    folder: Path,
    tokenizer: Any,
    precision: Precision,
    cache_name: str | None,
    files: Sequence[str],
    **fields: object,
) -> None:
    """Write the tokenizer and the meta file (not yet usable) of the export whose graphs are in folder.

    The meta file records the family's ``fields``, ``cache_name`` (the cache folder it is written
    for; None: not cached) and the size and sha256 of each of ``files``, which every load checks.
    """
    text, tokenizer_meta = tokenizer_files(tokenizer)
    (folder / TOKENIZER_FILE).write_text(text)
    meta = {
        "format_version": FORMAT_VERSION,
        **fields,
        "precision": precision,
        USABLE_KEY: False,
        "tokenizer": tokenizer_meta,
        "runtime": runtime_versions(),
        FOLDER_KEY: cache_name,
        FILES_KEY: file_records(folder, files),
    }
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def pooled_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the row-wise cosine of two (n, dim) arrays (int8 against float32 outputs, for reports)."""
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


def probe_tolerance(model: nn.Module, largest: float) -> float:
    """Return how far a float32 export's outputs may stray from torch's on the probe.

    ``largest``: the largest |activation| of ``model``'s forward pass on the probe. Two correct float32
    runs differ by rounding at that magnitude, through the model's depth; never less than FLOAT32_TOLERANCE.
    """
    return max(FLOAT32_TOLERANCE, float_tolerance(largest, depth=transformer_depth(model)))


def disagreement(
    model: nn.Module, reference: Callable[[], np.ndarray], export: Callable[[], np.ndarray], precision: Precision
) -> str | None:
    """Return why an export's probe outputs stray too far from the torch model's, or None if they agree.

    ``reference`` and ``export`` compute the probe's outputs with torch (through ``model``, whose
    activations set the float32 bound) and with the export.
    """
    with largest_activation(model) as found:
        want = reference()
    got = export()
    if not np.isfinite(got).all():
        return "non-finite outputs"
    if precision == "int8":
        cosine = float(pooled_cosines(want, got).min())
        return None if cosine >= MIN_INT8_COSINE else f"cosine {cosine:.3f} < {MIN_INT8_COSINE}"
    gap, bound = float(np.abs(want - got).max()), probe_tolerance(model, max(found, default=0.0))
    return None if gap <= bound else f"max difference {gap:.3g} > {bound:.3g}"


def write_checked(
    folder: Path | None,
    *,
    write: Callable[[Path, str | None], None],
    read: Callable[[Path], Runner | None],
    check: Callable[[Runner], str | None],
    graphs: Sequence[str],
    what: str,
    model_id: str,
) -> tuple[Runner | None, str | None]:
    """Write an export, check it against torch and cache it in folder (None: not cached).

    ``write(tmp, cache_name)`` writes it into an empty folder, ``read(tmp)`` reads it back (None:
    unreadable), ``check(runner)`` says why it is refused, or None; ``graphs``: its files dropped
    when refused; ``what`` names it in messages. Returns (runner, None), or (None, why) when it was
    refused; a refusal is cached too, so that it is not tried again. An unreadable folder there is replaced.
    """
    parent = folder.parent if folder is not None else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=parent))
    try:
        write(tmp, folder.name if folder is not None else None)
        runner = read(tmp)
        if runner is None:
            raise ModelError(f"{model_id}: {what} cannot be read back")
        refused = check(runner)
        publish_export(tmp, folder, refused, graphs, f"{what} of {model_id}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the sessions hold the graphs in memory
    return (None, refused) if refused is not None else (runner, None)
