"""int8 CASE encoding on a CPU: a BERT-style encoder exported to ONNX and dynamically quantised.

The float32 encoder is loaded for inference (its LoRA adapter merged), exported with
``torch.onnx`` and quantised by onnxruntime's ``quantize_dynamic``: int8 weights per output
channel, activations quantised per batch at run time, for the encoder's matrix products only
(embeddings, LayerNorm, softmax and GELU stay float32). Tokenisation, condition-segment
pooling and the head are the float32 encoder's, untouched. Measured here against PyTorch's own
dynamic quantisation, onnxruntime was the faster and the closer to float32 (benchmarks/README.md).

The quantised model is cached beside the encoder-output cache, keyed by the model's revision,
the adapter and the onnxruntime, onnx and torch versions, so later runs load it without
exporting again. An export whose outputs stray too far from float32 is refused.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from condsearch.cache import default_cache_dir
from condsearch.encoders.base import Pair
from condsearch.encoders.bert import BertStyleEncoder
from condsearch.encoders.cpu import ONNX_EXTRA
from condsearch.errors import ModelError
from condsearch.models import ModelSource

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MODEL_FILE = "model.int8.onnx"
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "int8.json"
#: the cached exports live here, under default_cache_dir() (beside "features", the encoder outputs)
CACHE_SUBDIR = "onnx-int8"
#: an export whose pooled outputs fall below this cosine to float32 on the probe pairs is refused
MIN_COSINE = 0.9
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_CONFIG_KEYS = ("hidden_size", "max_position_embeddings", "model_type")
_PROBE: list[Pair] = [
    ("the condition", "a probe sentence, with a comma"),
    ("another one", "short"),
    ("the colour of the dress", "A girl in an orange dress serves the ball."),
    ("the sport", None),
]


def runtime_versions() -> dict[str, str]:
    """Return the versions that an export depends on; a one-line error if onnxruntime or onnx is missing."""
    versions = {}
    for package in ("onnxruntime", "onnx"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            raise ModelError(f"--quantize int8 needs {package}: pip install '{ONNX_EXTRA}'") from None
    return {**versions, "torch": torch.__version__}


def export_folder(source: ModelSource, adapter: Path | None) -> Path | None:
    """Return where the int8 export of a model (with an adapter merged) is cached, or None if unsafe to cache.

    A hub model that is not in the local cache resolves to revision 'main', which names no weights.
    """
    if source.revision == "main":
        return None
    from condsearch.encoders.bert_inference import adapter_key

    key = [
        FORMAT_VERSION,
        source.model_id,
        source.revision,
        adapter_key(adapter) if adapter else "",
        runtime_versions(),
    ]
    return default_cache_dir() / CACHE_SUBDIR / hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]


class OrtBert(nn.Module):
    """An onnxruntime session in the place of BertStyleEncoder's model: returns ``last_hidden_state``."""

    def __init__(self, session: Any, config: dict[str, Any]) -> None:
        super().__init__()
        self.session = session
        self.config = SimpleNamespace(**config)
        self._inputs = [i.name for i in session.get_inputs()]

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> SimpleNamespace:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        feed = {}
        for name in self._inputs:
            value = given[name]
            feed[name] = np.zeros_like(input_ids.numpy()) if value is None else value.cpu().numpy()
        (hidden,) = self.session.run(None, feed)
        return SimpleNamespace(last_hidden_state=torch.from_numpy(hidden))


class Int8BertEncoder(BertStyleEncoder):
    """:class:`BertStyleEncoder` whose transformer runs as onnxruntime's dynamic int8 model on the CPU."""

    quantize = "int8"
    runtime = ""

    def describe(self) -> dict[str, object]:
        # recorded in manifests and cache keys: int8 vectors never mix with float32 ones
        return {**super().describe(), "quantize": self.quantize, "quantize_runtime": self.runtime}


class _Last(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> Any:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out.last_hidden_state


@contextmanager
def _root_quiet() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _tokenizer_files(tokenizer: Any) -> tuple[str, dict[str, Any]]:
    """Return (tokenizer.json text, the settings BackendTokenizer reads) of a loaded fast tokenizer."""
    from tokenizers import Tokenizer

    # a transformers fast tokenizer, or the BackendTokenizer of a cached inference copy
    backend = tokenizer.backend_tokenizer if hasattr(tokenizer, "backend_tokenizer") else tokenizer.backend
    copy = Tokenizer.from_str(backend.to_str())  # the loaded one keeps its truncation and padding
    copy.no_truncation()
    copy.no_padding()
    meta = {
        "pad_token_id": tokenizer.pad_token_id,
        "model_max_length": int(min(tokenizer.model_max_length, 1 << 30)),
        "model_input_names": list(tokenizer.model_input_names),
        "truncation_side": getattr(tokenizer, "truncation_side", "right"),
    }
    return copy.to_str(), meta


def export_int8(encoder: BertStyleEncoder, folder: Path, versions: dict[str, str]) -> None:
    """Write the int8 export of a float32 encoder (model, tokenizer, settings) into an empty folder."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    batch, _ = encoder._tokenize(_PROBE)
    if "token_type_ids" not in batch:
        batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    args = tuple(batch[name].cpu() for name in _INPUTS)
    axes = {name: {0: "batch", 1: "tokens"} for name in (*_INPUTS, "hidden")}
    plain = folder / "model.float32.onnx"
    try:
        # the TorchScript exporter's deprecation notice and onnxruntime's pre-processing advice
        # (logged on the root logger) concern neither the user nor this model
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings(), _root_quiet():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Last(encoder.model.cpu().float()),
                args,
                str(plain),
                input_names=list(_INPUTS),
                output_names=["hidden"],
                dynamic_axes=axes,
                opset_version=17,
                dynamo=False,
            )
            quantize_dynamic(
                str(plain),
                str(folder / MODEL_FILE),
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
            )
    except Exception as exc:  # noqa: BLE001 - the exporter's and quantiser's errors have no common base
        raise ModelError(f"{encoder.model_id}: cannot export to int8 ONNX ({type(exc).__name__}: {exc})") from exc
    finally:
        plain.unlink(missing_ok=True)
    text, tokenizer_meta = _tokenizer_files(encoder.tokenizer)
    (folder / TOKENIZER_FILE).write_text(text)
    config = {k: getattr(encoder.model.config, k, None) for k in _CONFIG_KEYS}
    meta = {"format_version": FORMAT_VERSION, "config": config, "tokenizer": tokenizer_meta, "runtime": versions}
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def _read(folder: Path, source: ModelSource, max_length: int | None, threads: int) -> Int8BertEncoder | None:
    """Return the encoder of a cached export, or None if there is none or it is unreadable."""
    if not (folder / META_FILE).is_file():
        return None
    try:
        from tokenizers import Tokenizer

        from condsearch.encoders.bert_inference import BackendTokenizer

        meta = json.loads((folder / META_FILE).read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            return None
        tokenizer = BackendTokenizer(Tokenizer.from_file(str(folder / TOKENIZER_FILE)), meta["tokenizer"])
        model = OrtBert(_session(folder / MODEL_FILE, threads), meta["config"])
    except Exception as exc:  # noqa: BLE001 - a damaged export is only a cache miss
        log.info("ignoring the int8 export in %s (%s)", folder, type(exc).__name__)
        return None
    encoder = Int8BertEncoder(source, device="cpu", max_length=max_length, loaded=(tokenizer, model))
    encoder.runtime = f"onnxruntime {meta['runtime']['onnxruntime']}"
    return encoder


def load_int8_encoder(
    source: ModelSource, *, max_length: int | None, adapter: Path | None, threads: int | None = None
) -> Int8BertEncoder:
    """Return the int8 encoder of a BERT-style model (adapter merged), exporting it the first time.

    ``threads``: onnxruntime's intra-op threads [default: torch's count, one per physical core].
    """
    runtime_versions()  # fails here, in one line, if onnxruntime or onnx is missing
    threads = threads or torch.get_num_threads()
    folder = export_folder(source, adapter)
    encoder = _read(folder, source, max_length, threads) if folder is not None else None
    if encoder is None:
        encoder = _export_and_read(source, folder, max_length=max_length, adapter=adapter, threads=threads)
    if adapter is not None:
        from condsearch.finetune.adapter import adapter_checksum

        encoder.adapter_checksum = adapter_checksum(adapter)
    return encoder


def _export_and_read(
    source: ModelSource, folder: Path | None, *, max_length: int | None, adapter: Path | None, threads: int
) -> Int8BertEncoder:
    from condsearch.encoders.bert_inference import PlainBert, load_for_inference

    reference = load_for_inference(source, device="cpu", max_length=max_length, adapter=adapter)
    if not isinstance(reference.model, PlainBert):  # first load: transformers' model; its copy is written now
        reference = load_for_inference(source, device="cpu", max_length=max_length, adapter=adapter)
    parent = folder.parent if folder is not None else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".int8-", dir=parent))
    try:
        export_int8(reference, tmp, runtime_versions())
        encoder = _read(tmp, source, max_length, threads)
        if encoder is None:
            raise ModelError(f"{source.model_id}: the int8 export cannot be read back")
        gap = float(pooled_cosines(reference.embed_batch(_PROBE), encoder.embed_batch(_PROBE)).min())
        if not gap >= MIN_COSINE:
            raise ModelError(f"{source.model_id}: int8 outputs stray from float32 (cosine {gap:.3f} < {MIN_COSINE})")
        if folder is not None:
            try:
                tmp.rename(folder)  # fails if another process got there first: its export is as good
                log.info("cached the int8 export of %s in %s", source.model_id, folder)
            except OSError:
                pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the session holds the model in memory
    return encoder


def pooled_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the row-wise cosine of two (n, dim) arrays (int8 against float32 outputs, for reports)."""
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


__all__: Sequence[str] = ("Int8BertEncoder", "export_folder", "load_int8_encoder", "runtime_versions")
