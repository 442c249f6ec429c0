#!/usr/bin/env python3
"""Which int8 CPU encoder to ship (issue 28): the variants built once, timed interleaved on the same pairs.

Every variant is the same model: the encoder of ``--model`` with its profile's adapter merged
(the shipped ``full`` delta by default, as ``csts.py --quantize int8`` runs it), exported with
``torch.onnx`` as condsearch exports it, in one of two traces:

* ``sdpa``: :class:`~condsearch.encoders.onnx_trace.PlainBert` as it traces for the export
  (``scaled_dot_product_attention`` with a boolean mask);
* ``fusable``: the same computation as :class:`FusableBert` here spells it (scores, an additive
  mask, softmax), which onnxruntime's BERT fusion
  (``onnxruntime.transformers.optimizer.optimize_model(model_type="bert")``) turns into its
  fused ``Attention``, ``SkipLayerNormalization`` and ``BiasGelu`` operators.

Then quantised or not: onnxruntime's ``quantize_dynamic`` (int8 weights, per output channel or
per tensor, activations per batch at run time; which operator types), its ``quantize_static``
(QDQ, activations calibrated on C-STS train pairs), and run by onnxruntime (at a graph
optimisation level) or by OpenVINO's runtime when ``openvino`` is importable. Tokenisation and
condition-segment pooling are condsearch's for every variant (:class:`OnnxBertEncoder`), each
batch in one run unless the variant sets ``rebatch`` (:attr:`OnnxBertEncoder.run_rows`: runs of
that many pairs of like token length). ``int8-shipped`` is what ``--quantize int8`` loads
(``write_export``, checked against torch, and the encoder's own defaults).

Each repeat runs every variant in turn (the order rotated by one each repeat) on the same pairs
with ``Encoder.encode`` (what ``condsearch index`` runs: length-sorted batches, CASE
differences), so a change in the machine's load falls on all of them; a new condition suffix per
repeat keeps anything from being reused. Reported: median pairs/s, the ratio to the torch
float32 encoder (the reference of ``encode_throughput.py --quantize int8``'s ``int8_speedup``)
and to onnxruntime's float32 export, and the cosine of each variant's pooled f(c; I(s)) and CASE
vectors to torch float32's (mean and least). The padding each batching leaves is counted too
(input order, ``encode_pairs``' character-length sort, an exact token-length sort, and the
character sort with runs of RUN_ROWS, as shipped). Absolute pairs/s depend on the machine's load;
the ratios within one run are what compare.

    python benchmarks/int8_study.py -n 512 --batch-size 64 --repeats 5 --variants int8-shipped,int8-dyn,...
    python benchmarks/int8_study.py --smoke --model tests-tiny-bert-folder
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from common import log, quiet_transformers, run_info, synthetic_csts, write_outputs  # noqa: E402

from condsearch.csts import CstsData, read_csts  # noqa: E402
from condsearch.encoders import load_encoder, onnx_trace  # noqa: E402
from condsearch.encoders.base import Encoder, Pair  # noqa: E402
from condsearch.encoders.bert import BertStyleEncoder  # noqa: E402
from condsearch.encoders.bert_inputs import case_inputs  # noqa: E402
from condsearch.encoders.onnx_export import (  # noqa: E402
    export_hidden,
    export_onnx,
    pooled_cosines,
    root_quiet,
    write_export,
)
from condsearch.encoders.onnx_files import (  # noqa: E402
    INPUTS,
    META_FILE,
    MODEL_FILE,
    RUN_ROWS,
    TOKENIZER_FILE,
    BackendTokenizer,
    OnnxBertEncoder,
    runtime_versions,
)
from condsearch.models import ModelSource, resolve_model  # noqa: E402
from condsearch.spec import EncoderSpec, Runtime  # noqa: E402

DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "csts-reannotated" / "dev.csv"
TRAIN = DEV.with_name("train.csv")


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


class _Last(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> Any:
        return self.model(input_ids, attention_mask, token_type_ids).last_hidden_state


def export(encoder: BertStyleEncoder, trace: str, path: Path) -> None:
    """Export the encoder's model, traced as asked, to path (weights inside), as export_onnx does."""
    batch, _ = encoder._tokenize([("a condition", "a sentence, with a comma"), ("short", None)])
    batch.setdefault("token_type_ids", torch.zeros_like(batch["input_ids"]))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_hidden(_Last(traced_module(encoder, trace)), tuple(batch[name] for name in INPUTS), path)


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
        from condsearch.encoders.base import EncodeStats

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


def read_pairs(path: Path | None, n: int, smoke_seed: int) -> list[Pair]:
    """Return n (condition, sentence) pairs: each C-STS row's two sentences under its condition."""
    data: CstsData = synthetic_csts(max(n, 8), seed=smoke_seed) if path is None else read_csts(path)
    pairs: list[Pair] = []
    for s1, s2, c in zip(data.sentence1, data.sentence2, data.condition, strict=True):
        pairs += [(c, s1), (c, s2)]
    return list(dict.fromkeys(pairs))[:n]


def padding(tokenizer: BackendTokenizer, pairs: Sequence[Pair], max_length: int, batch: int) -> dict[str, float]:
    """Return padded tokens / real tokens of the pairs' batches, by how the batches are ordered."""
    enc = tokenizer([s or c for c, s in pairs], [c for c, _ in pairs], truncation=True, max_length=max_length)
    lengths = [len(ids) for ids in enc["input_ids"]]
    orders = {
        "input_order": list(range(len(pairs))),
        "char_length_sort (encode_pairs)": sorted(
            range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1] or ""))
        ),
        "token_length_sort": sorted(range(len(pairs)), key=lambda i: -lengths[i]),
    }
    real = sum(lengths)
    out = {}
    for name, order in orders.items():
        padded = sum(
            max(lengths[i] for i in order[s : s + batch]) * len(order[s : s + batch])
            for s in range(0, len(order), batch)
        )
        out[name] = round(padded / real, 4)
    # what OnnxBertEncoder runs: each character-sorted batch as runs of RUN_ROWS of like token length
    padded = 0
    for s in range(0, len(pairs), batch):
        run_lengths = sorted(
            (lengths[i] for i in orders["char_length_sort (encode_pairs)"][s : s + batch]), reverse=True
        )
        padded += sum(run_lengths[r] * len(run_lengths[r : r + RUN_ROWS]) for r in range(0, len(run_lengths), RUN_ROWS))
    out[f"char_length_sort + runs of {RUN_ROWS} (shipped)"] = round(padded / real, 4)
    return out


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
    export_onnx(reference, base, "float32", runtime_versions())  # its tokenizer and meta serve every variant
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


def time_all(built: Sequence[Built], pairs: Sequence[Pair], batch: int, repeats: int) -> dict[str, list[float]]:
    """Return each variant's seconds per repeat, the variants run in turn (rotated) within each repeat."""
    seconds: dict[str, list[float]] = {b.variant.name: [] for b in built}
    texts = [s or "" for _, s in pairs]
    for b in built:  # warm-up: first-run allocations and kernels
        b.encoder.encode(texts[: 2 * batch], "warm-up condition", batch_size=b.variant.batch or batch)
    for r in range(repeats):
        conds = [f"{c} ({r})" for c, _ in pairs]
        order = list(built[r % len(built) :]) + list(built[: r % len(built)])
        for b in order:
            start = time.perf_counter()
            b.encoder.encode(texts, conds, batch_size=b.variant.batch or batch)
            seconds[b.variant.name].append(time.perf_counter() - start)
        log(
            "int8-study",
            f"repeat {r + 1}/{repeats} (load {os.getloadavg()[0]:.1f}): "
            + " ".join(f"{n} {len(pairs) / t[-1]:.0f}" for n, t in seconds.items()),
        )
    return seconds


def closeness(built: Sequence[Built], pairs: Sequence[Pair], batch: int) -> dict[str, dict[str, float]]:
    """Return each variant's cosine to torch float32: pooled f(c; I(s)) and CASE vectors, mean and least."""
    texts, conds = [s or "" for _, s in pairs], [c for c, _ in pairs]
    pooled = {b.variant.name: b.encoder.encode_pairs(pairs, batch_size=b.variant.batch or batch) for b in built}
    case = {b.variant.name: b.encoder.encode(texts, conds, batch_size=b.variant.batch or batch) for b in built}
    out = {}
    for name in pooled:
        p = pooled_cosines(pooled[name], pooled[REFERENCE])
        c = pooled_cosines(case[name], case[REFERENCE])
        out[name] = {
            "pooled_mean": round(float(p.mean()), 5),
            "pooled_least": round(float(p.min()), 5),
            "case_mean": round(float(c.mean()), 5),
            "case_least": round(float(c.min()), 5),
        }
    return out


def study(args: argparse.Namespace) -> dict[str, object]:
    wanted = set(args.variants.split(",")) if args.variants else None
    variants = [v for v in VARIANTS if wanted is None or v.name in wanted or v.name in (REFERENCE, ORT_FP32)]
    if not _has_openvino():
        skipped = [v.name for v in variants if v.runtime == "openvino"]
        variants = [v for v in variants if v.runtime != "openvino"]
        log("int8-study", f"openvino is not importable: left out {', '.join(skipped) or 'nothing'}")
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    pairs = read_pairs(args.csv, args.n, smoke_seed=1)
    calib = read_pairs(args.calib_csv, args.calib_n, smoke_seed=2)
    calib = calib + [(c, None) for c in dict.fromkeys(c for c, _ in calib)]  # condition-only inputs too
    load_before = os.getloadavg()
    reference = load_encoder(
        EncoderSpec(args.model, profile=args.profile, runtime=Runtime(device="cpu", threads=threads))
    )
    assert isinstance(reference, BertStyleEncoder)
    # root_quiet: the quantiser's pre-processing advice goes to the root logger
    with root_quiet(), tempfile.TemporaryDirectory(prefix="int8-study-") as tmp:
        built = build_all(variants, reference, resolve_model(args.model), Path(tmp), threads, calib)
        cosines = closeness(built, pairs, args.batch_size)
        seconds = time_all(built, pairs, args.batch_size, args.repeats)
        onnx_encoder = next(b.encoder for b in built if b.variant.name == ORT_FP32)
        pad = padding(onnx_encoder.tokenizer, pairs, reference.max_length, args.batch_size)  # type: ignore[attr-defined]
    rate = {name: len(pairs) / statistics.median(t) for name, t in seconds.items()}
    rows = []
    for b in built:
        name = b.variant.name
        rows.append(
            {
                "variant": name,
                "note": b.variant.note,
                "pairs_per_s": round(rate[name], 1),
                "vs_torch_float32": round(rate[name] / rate[REFERENCE], 3),
                "vs_onnxruntime_float32": round(rate[name] / rate[ORT_FP32], 3),
                **cosines[name],
                "seconds": [round(s, 3) for s in seconds[name]],
                "model_mib": round(b.model_bytes / 2**20, 1),
                "fused_operators": b.fused,
                "build_seconds": round(b.build_seconds, 1),
            }
        )
    return {
        "model": reference.model_id,
        "encoder": reference.describe(),
        "reference": REFERENCE_NOTE,
        "n_pairs": len(pairs),
        "n_calibration_pairs": len(calib),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "threads": threads,
        "padding_over_real_tokens": pad,
        "variants": rows,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "runtimes": runtime_versions() | ({"openvino": _openvino_version()} if _has_openvino() else {}),
        "smoke": args.smoke,
    }


def _has_openvino() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def _openvino_version() -> str:
    import openvino

    return str(openvino.__version__)


def table(r: dict[str, Any]) -> str:
    machine = r["machine"]
    head = (
        f"{r['model']} ({r['encoder'].get('adapter_checksum', 'no adapter')[:12]}), {r['n_pairs']} pairs, "
        f"batch {r['batch_size']}, median of {r['repeats']}, {r['threads']} threads, {machine['cpu']} "
        f"[{' '.join(machine['isa'])}], load {r['load_average_before'][0]} -> {r['load_average_after'][0]}\n\n"
        f"{r['reference']}\n\n"
        "| variant | pairs/s | vs torch fp32 | vs ort fp32 | pooled cos mean / least | CASE cos mean / least |\n"
        "|---|---:|---:|---:|---:|---:|\n"
    )
    body = "".join(
        f"| {v['variant']} | {v['pairs_per_s']:.1f} | {v['vs_torch_float32']:.2f}x "
        f"| {v['vs_onnxruntime_float32']:.2f}x "
        f"| {v['pooled_mean']:.4f} / {v['pooled_least']:.4f} | {v['case_mean']:.4f} / {v['case_least']:.4f} |\n"
        for v in r["variants"]
    )
    pad = ", ".join(f"{k} {v:.3f}" for k, v in r["padding_over_real_tokens"].items())
    return head + body + f"\npadded / real tokens: {pad}\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", type=Path, default=DEV, help="C-STS CSV of the timed pairs [default: dev]")
    p.add_argument("--calib-csv", type=Path, default=TRAIN, help="C-STS CSV of the calibration pairs [default: train]")
    p.add_argument("-n", type=int, default=512, help="timed pairs")
    p.add_argument("--calib-n", type=int, default=256, help="calibration pairs (static quantisation)")
    p.add_argument("--model", default=None, help="model id or folder [default: the default model]")
    p.add_argument("--profile", default=None, help="profile whose adapter is merged [default: the default one]")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--threads", type=int, default=None, help="torch, onnxruntime and OpenVINO threads [default: torch's]"
    )
    p.add_argument("--variants", default=None, help=f"comma-separated subset of {', '.join(v.name for v in VARIANTS)}")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="synthetic pairs, one short repeat")
    args = p.parse_args(argv)
    quiet_transformers()
    if args.smoke:
        args.csv = args.calib_csv = None
        args.n, args.calib_n, args.repeats, args.batch_size = 24, 16, 1, 8
    result: dict[str, Any] = {**study(args), **run_info("cpu")}
    write_outputs(result, table(result), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
