#!/usr/bin/env python3
"""Which int8 CPU encoder to ship (issue 28): the variants built once, timed interleaved on the same pairs.

Every variant is the same model: the encoder of ``--model`` with its profile's adapter merged
(the shipped ``full`` delta by default, as ``csts.py --quantize int8`` runs it), exported with
``torch.onnx`` as condsearch exports it, in one of two traces:

* ``sdpa``: :class:`~condsearch.model.encoders.onnx.trace.PlainBert` as it traces for the export
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

    python -m benchmarks.systems.int8_study -n 512 --batch-size 64 --repeats 5 --variants int8-shipped,int8-dyn,...
    python -m benchmarks.systems.int8_study --smoke --model tests-tiny-bert-folder
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks._lib.common import log, quiet_transformers, run_info, synthetic_csts, write_outputs  # noqa: E402
from benchmarks._lib.int8_variants import (  # noqa: E402
    ORT_FP32,
    REFERENCE,
    REFERENCE_NOTE,
    VARIANTS,
    Built,
    build_all,
)
from condsearch.base.model_sources import resolve_model  # noqa: E402
from condsearch.corpus.csts import CstsData, read_csts  # noqa: E402
from condsearch.model.encoders import load_encoder  # noqa: E402
from condsearch.model.encoders.base import Pair  # noqa: E402
from condsearch.model.encoders.bert import BertStyleEncoder  # noqa: E402
from condsearch.model.encoders.onnx.cache import runtime_versions  # noqa: E402
from condsearch.model.encoders.onnx.export import pooled_cosines, root_quiet  # noqa: E402
from condsearch.model.encoders.onnx.run import RUN_ROWS, BackendTokenizer  # noqa: E402
from condsearch.model.encoders.spec import EncoderSpec, Runtime  # noqa: E402

DEV = Path(__file__).resolve().parents[3] / "shared" / "data" / "csts-reannotated" / "dev.csv"
TRAIN = DEV.with_name("train.csv")


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
        EncoderSpec(args.model, profile=args.profile, dtype="float32", runtime=Runtime(device="cpu", threads=threads))
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
