"""The int8 study's variants (benchmarks/systems/int8_study.py): how each is traced, fused, quantised and run.

Each variant is built once from the merged float32 encoder into its own folder, then run by
onnxruntime or OpenVINO; the study times them against each other.
"""

from __future__ import annotations

import json
import math
import shutil
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks._lib.common import log  # noqa: E402
from condsearch.base.model_sources import ModelSource  # noqa: E402
from condsearch.model.encoders.base import Encoder, Pair  # noqa: E402
from condsearch.model.encoders.bert import BertStyleEncoder  # noqa: E402
from condsearch.model.encoders.bert_inputs import case_inputs  # noqa: E402
from condsearch.model.encoders.onnx import trace as onnx_trace  # noqa: E402
from condsearch.model.encoders.onnx.bert import (  # noqa: E402
    MODEL_FILE,
    OnnxBertEncoder,
    export_onnx,
    graph,
    write_export,
)
from condsearch.model.encoders.onnx.cache import META_FILE, TOKENIZER_FILE  # noqa: E402
from condsearch.model.encoders.onnx.export import trace as trace_graph  # noqa: E402
from condsearch.model.encoders.onnx.run import INPUTS, BackendTokenizer  # noqa: E402


class Variant(NamedTuple):
    """One way to run the model: which trace, what quantisation, which runtime and level."""

    name: str
    trace: str = "sdpa"  # sdpa | fusable
    fuse: bool = False  # onnxruntime's BERT fusion before quantising
    quant: str = "none"  # none | dynamic | static
    per_channel: bool = True
    op_types: tuple[str, ...] = ("MatMul",)
    runtime: str = "ort"  # ort | openvino | torch | shipped
    level: str = "all"  # onnxruntime graph optimisation: basic | extended | all
    precision_hint: str = "f32"  # openvino: f32 | bf16
    spin: bool = False  # onnxruntime intra-op spinning (condsearch turns it off)
    rebatch: int = 0  # OnnxBertEncoder.run_rows: runs of this many rows of like token length (0: whole batch)
    batch: int = 0  # > 0: this batch size instead of --batch-size
    note: str = ""


VARIANTS = [
    Variant("torch-fp32", runtime="torch", note="reference: BertStyleEncoder, transformers, float32"),
    Variant("int8-shipped", runtime="shipped", note="what --quantize int8 loads now (write_export, OnnxBertEncoder)"),
    Variant("ort-fp32", note="the float32 export as shipped (sdpa trace), ORT_ENABLE_ALL"),
    Variant("ort-fp32-fusable", trace="fusable", note="fusable trace, float32, no python fusion"),
    Variant("ort-fp32-fused", trace="fusable", fuse=True, note="fusable trace + BERT fusion, float32"),
    Variant("int8-dyn", quant="dynamic", note="int8 before issue 28: sdpa trace, dynamic, per channel, MatMul"),
    Variant("int8-dyn-basic", quant="dynamic", level="basic", note="int8-dyn at ORT_ENABLE_BASIC"),
    Variant("int8-dyn-extended", quant="dynamic", level="extended", note="int8-dyn at ORT_ENABLE_EXTENDED"),
    Variant("int8-dyn-spin", quant="dynamic", spin=True, note="int8-dyn with intra-op spinning on"),
    Variant("int8-dyn-fusable", trace="fusable", quant="dynamic", note="fusable trace, dynamic, per channel, MatMul"),
    Variant(
        "int8-dyn-fusable-pt",
        trace="fusable",
        quant="dynamic",
        per_channel=False,
        note="as int8-dyn-fusable, weights per tensor",
    ),
    Variant(
        "int8-dyn-fusable-rebatch",
        trace="fusable",
        quant="dynamic",
        rebatch=16,
        note="as int8-dyn-fusable, each batch re-split by token length into runs of 16",
    ),
    Variant("int8-dyn-fusable-rebatch8", trace="fusable", quant="dynamic", rebatch=8, note="as above, runs of 8 rows"),
    Variant(
        "int8-dyn-fusable-rebatch32", trace="fusable", quant="dynamic", rebatch=32, note="as above, runs of 32 rows"
    ),
    Variant("int8-dyn-fusable-b16", trace="fusable", quant="dynamic", batch=16, note="int8-dyn-fusable, batch 16"),
    Variant("int8-dyn-rebatch", quant="dynamic", rebatch=16, note="int8-dyn (sdpa trace), runs of 16 rows"),
    Variant("ort-fp32-rebatch", rebatch=16, note="ort-fp32, runs of 16 rows"),
    Variant("int8-dyn-fused", trace="fusable", fuse=True, quant="dynamic", note="BERT fusion, then MatMul"),
    Variant(
        "int8-dyn-fused-att",
        trace="fusable",
        fuse=True,
        quant="dynamic",
        op_types=("MatMul", "Attention"),
        note="BERT fusion, then MatMul and Attention (QAttention)",
    ),
    Variant("int8-static-qdq", trace="fusable", quant="static", note="QDQ, calibrated (MinMax), per channel, MatMul"),
    Variant("ov-fp32", trace="fusable", runtime="openvino", note="OpenVINO, float32 (hint f32)"),
    Variant("ov-bf16", trace="fusable", runtime="openvino", precision_hint="bf16", note="OpenVINO, bfloat16 hint"),
    Variant("ov-int8-qdq", trace="fusable", quant="static", runtime="openvino", note="OpenVINO on the QDQ model"),
]
REFERENCE, ORT_FP32 = "torch-fp32", "ort-fp32"
REFERENCE_NOTE = (
    "vs torch fp32: the float32 encoder run by transformers (encode_throughput.py's int8_speedup denominator); "
    "vs ort fp32: the float32 ONNX export run by onnxruntime, each batch in one run"
)


class FusableBert(torch.nn.Module):
    """:class:`PlainBert`'s computation spelled as onnxruntime's BERT fusion recognises it.

    The attention is written out (query-key products scaled by a division, an additive mask of
    -10000 on padded keys, softmax, the value product), where PlainBert calls
    ``scaled_dot_product_attention`` with a boolean mask; traced, this is the graph that
    ``onnxruntime.transformers.optimizer.optimize_model(model_type="bert")`` fuses into its
    ``Attention``, ``SkipLayerNormalization`` and ``BiasGelu`` operators. The same weights (those
    of the PlainBert it wraps); the outputs agree to float rounding.
    """

    def __init__(self, plain: onnx_trace.PlainBert) -> None:
        super().__init__()
        self.plain = plain
        self.config = plain.config

    def _layer(self, layer: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        att, width = layer.attention.self, h // layer.n_heads
        q = att.query(x).view(b, n, layer.n_heads, width).permute(0, 2, 1, 3)
        k = att.key(x).view(b, n, layer.n_heads, width).permute(0, 2, 3, 1)
        v = att.value(x).view(b, n, layer.n_heads, width).permute(0, 2, 1, 3)
        scores = torch.matmul(q, k) / math.sqrt(width) + mask
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).reshape(b, n, h)
        x = layer.attention.output.LayerNorm(layer.attention.output.dense(ctx) + x)
        return layer.output.LayerNorm(layer.output.dense(F.gelu(layer.intermediate.dense(x))) + x)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> SimpleNamespace:
        """Return ``last_hidden_state``: (batch, tokens, hidden), as :meth:`PlainBert.forward` does."""
        e = self.plain.embeddings
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
        x = e.word_embeddings(input_ids) + e.token_type_embeddings(types) + e.position_embeddings(positions)
        x = e.LayerNorm(x)
        # exp(-10000) is 0 in float32: a padded key gets no weight, as under the boolean mask
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.plain.encoder.layer:
            x = self._layer(layer, x, mask)
        return SimpleNamespace(last_hidden_state=x)


def traced_module(encoder: BertStyleEncoder, trace: str) -> torch.nn.Module:
    """Return what torch.onnx traces for the encoder: PlainBert (sdpa) or its fusable spelling."""
    plain = onnx_trace.as_plain(encoder.model)
    if plain is None:
        raise SystemExit(f"{encoder.model_id} is not a plain BERT: this study covers those only")
    return plain if trace == "sdpa" else FusableBert(plain).eval()


def export(encoder: BertStyleEncoder, trace: str, path: Path) -> None:
    """Export the encoder's model, traced as asked, to path (weights inside), as export_onnx does."""
    batch, _ = encoder._tokenize([("a condition", "a sentence, with a comma"), ("short", None)])
    batch.setdefault("token_type_ids", torch.zeros_like(batch["input_ids"]))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = onnx_trace.LastHidden(traced_module(encoder, trace))
        trace_graph(graph(module, tuple(batch[name] for name in INPUTS)), path)


def fuse(src: Path, dst: Path, config: Any) -> dict[str, int]:
    """Run onnxruntime's BERT fusion on src into dst; return the fused operator counts."""
    from onnxruntime.transformers.optimizer import optimize_model

    model = optimize_model(
        str(src), model_type="bert", num_heads=config.num_attention_heads, hidden_size=config.hidden_size, opt_level=0
    )
    model.save_model_to_file(str(dst))
    return {k: v for k, v in model.get_fused_operator_statistics().items() if v}


class Calibration:
    """onnxruntime's CalibrationDataReader protocol over tokenised C-STS train pairs."""

    def __init__(self, tokenizer: BackendTokenizer, pairs: Sequence[Pair], max_length: int, batch: int) -> None:
        from condsearch.model.encoders.base import EncodeStats

        self.feeds: list[dict[str, np.ndarray]] = []
        for start in range(0, len(pairs), batch):
            inputs, _ = case_inputs(tokenizer, pairs[start : start + batch], max_length, EncodeStats())
            inputs.setdefault("token_type_ids", np.zeros_like(inputs["input_ids"]))
            self.feeds.append({name: inputs[name] for name in INPUTS})
        self._it: Iterator[dict[str, np.ndarray]] = iter(self.feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self.feeds)


def quantize(v: Variant, src: Path, dst: Path, calibration: Calibration | None) -> None:
    """Quantise src into dst as the variant asks."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    # shape inference gives no type to the fused (com.microsoft) operators' outputs: they are float32
    floats = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    if v.quant == "dynamic":
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=QuantType.QInt8,
            per_channel=v.per_channel,
            op_types_to_quantize=list(v.op_types),
            extra_options=floats,
        )
        return
    assert calibration is not None
    calibration.rewind()
    quantize_static(
        str(src),
        str(dst),
        calibration,
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=v.per_channel,
        op_types_to_quantize=list(v.op_types),
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={"MatMulConstBOnly": True, **floats},
    )


_LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


def ort_session(path: Path, threads: int, level: str, spin: bool = False) -> Any:
    """An onnxruntime session set up as condsearch's (no spinning, one inter-op thread) at a level."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[level])
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class _Input(NamedTuple):
    name: str


class OvSession:
    """The two calls OnnxBertEncoder makes of an onnxruntime session, over an OpenVINO compiled model."""

    def __init__(self, path: Path, threads: int, hint: str) -> None:
        import openvino as ov

        core = ov.Core()
        config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.request = self.compiled.create_infer_request()

    def get_inputs(self) -> list[_Input]:
        return [_Input(port.get_any_name()) for port in self.compiled.inputs]

    def run(self, _outputs: object, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        result = self.request.infer(feeds)
        return [np.asarray(result[self.compiled.output(0)])]


class Built(NamedTuple):
    variant: Variant
    encoder: Encoder
    build_seconds: float
    model_bytes: int
    fused: dict[str, int]


def build_all(
    variants: Sequence[Variant],
    reference: BertStyleEncoder,
    source: ModelSource,
    tmp: Path,
    threads: int,
    calib_pairs: Sequence[Pair],
) -> list[Built]:
    """Build every variant once from the reference encoder, in tmp."""
    base = tmp / "float32"
    base.mkdir()
    export_onnx(reference, base, "float32")  # its tokenizer and meta serve every variant
    meta = json.loads((base / META_FILE).read_text())
    tokenizer_json = base / TOKENIZER_FILE
    config = reference.model.config
    traces: dict[str, Path] = {}
    fused_models: dict[str, tuple[Path, dict[str, int]]] = {}
    calibration: Calibration | None = None
    built = []
    for v in variants:
        start = time.perf_counter()
        if v.runtime == "torch":
            built.append(Built(v, reference, 0.0, 0, {}))
            continue
        if v.runtime == "shipped":  # what --quantize int8 loads: the product's export, checked, and its encoder
            shipped, refused = write_export(reference, source, None, "int8", max_length=None, threads=threads)
            if shipped is None:
                raise SystemExit(f"the shipped int8 export was refused: {refused}")
            built.append(Built(v, shipped, time.perf_counter() - start, 0, {}))
            continue
        folder = tmp / v.name
        folder.mkdir()
        if v.trace not in traces:
            traces[v.trace] = tmp / f"trace-{v.trace}.onnx"
            export(reference, v.trace, traces[v.trace])
        src, fused = traces[v.trace], {}
        if v.fuse:
            if v.trace not in fused_models:
                path = tmp / f"fused-{v.trace}.onnx"
                fused_models[v.trace] = (path, fuse(src, path, config))
            src, fused = fused_models[v.trace]
        model = folder / MODEL_FILE
        if v.quant == "none":
            shutil.copy(src, model)
        else:
            if v.quant == "static" and calibration is None:
                tokenizer = BackendTokenizer(_tokenizer(tokenizer_json), meta["tokenizer"])
                calibration = Calibration(tokenizer, calib_pairs, reference.max_length, batch=32)
            quantize(v, src, model, calibration)
        shutil.copy(tokenizer_json, folder / TOKENIZER_FILE)
        vmeta = {**meta, "precision": "int8" if v.quant != "none" else "float32"}
        tokenizer = BackendTokenizer(_tokenizer(folder / TOKENIZER_FILE), vmeta["tokenizer"])
        session = (
            OvSession(model, threads, v.precision_hint)
            if v.runtime == "openvino"
            else ort_session(model, threads, v.level, v.spin)
        )
        encoder = OnnxBertEncoder(source, tokenizer, session, vmeta, reference.max_length)
        size = sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith("model"))
        encoder.run_rows = v.rebatch  # 0: each batch in one run, as before issue 28
        built.append(Built(v, encoder, time.perf_counter() - start, size, fused))
        log("int8-study", f"built {v.name} in {built[-1].build_seconds:.1f} s ({size / 2**20:.1f} MiB) {fused or ''}")
    return built


def _tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))
