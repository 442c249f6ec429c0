#!/usr/bin/env python3
"""CASE on this CPU: torch bfloat16 against torch float32 and onnxruntime float32 (pairs/s, cosine, C-STS dev).

The figures behind one row of :data:`condsearch.base.cpu_kind.PATHS`. Two parts, one run:

- **accuracy**: the default model with its default profile (``full``: the shipped head) encodes
  every C-STS dev row in float32 and in bfloat16 (torch); each vector's cosine to float32 (min,
  median, before and after the head) and the dev Spearman ×100 of both;
- **speed**: ``-n`` dev pairs encoded by torch float32, torch bfloat16 and onnxruntime float32 (the
  checked export) in turn within each of ``--repeats`` rounds, so that a change in the machine's
  load falls on all three; medians, and the load averages before and after.

    python -m benchmarks.systems.cpu_paths --csv $D/dev.csv -n 400 --repeats 3 \
        --json-out benchmarks/systems/results/cpu_paths_amd.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks._lib.common import quiet_transformers, run_info, synthetic_csts, write_outputs
from condsearch.base.cpu_kind import cpu_kind
from condsearch.corpus.csts import CstsData, read_csts
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.model.vectorizer import load_vectorizer
from condsearch.train.head import case_features, evaluate_head


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def cosines(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Return the min and median cosine of each row of a to the same row of b."""
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"min": round(float(cos.min()), 5), "median": round(float(np.median(cos)), 5)}


def measure(args: argparse.Namespace) -> dict[str, object]:
    from condsearch.base.model_sources import resolve_model
    from condsearch.model.encoders.bert import BertStyleEncoder
    from condsearch.model.encoders.onnx.bert import write_export

    dev: CstsData = synthetic_csts(16, seed=1) if args.csv is None else read_csts(args.csv)
    if args.smoke:
        dev = dev.head(16)
    load_before = os.getloadavg()
    runtime = Runtime(device="cpu", threads=args.threads)
    loaded = {
        dtype: load_vectorizer(EncoderSpec(args.model, dtype=dtype, runtime=runtime))
        for dtype in ("float32", "bfloat16")
    }
    accuracy: dict[str, object] = {}
    feats = {}
    for dtype, vec in loaded.items() if args.accuracy else ():
        start = time.perf_counter()
        feats[dtype] = case_features(vec.encoder, dev, batch_size=args.batch_size)  # type: ignore[arg-type]
        log(f"dev encoded in {dtype} in {time.perf_counter() - start:.0f} s")
        accuracy[f"dev_{dtype}"] = evaluate_head(vec.head, feats[dtype])
    if args.accuracy:
        raw32 = np.concatenate([feats["float32"].x1, feats["float32"].x2])
        raw16 = np.concatenate([feats["bfloat16"].x1, feats["bfloat16"].x2])
        accuracy["cosine_bfloat16_float32_encoder"] = cosines(raw16, raw32)
        head = loaded["float32"].head
        if head is not None:
            accuracy["cosine_bfloat16_float32_indexed"] = cosines(head.project(raw16), head.project(raw32))
        accuracy["dev_spearman_bfloat16_minus_float32"] = round(
            float(accuracy["dev_bfloat16"]["spearman"]) - float(accuracy["dev_float32"]["spearman"]),  # type: ignore[index]
            3,
        )

    float32 = loaded["float32"].encoder
    assert isinstance(float32, BertStyleEncoder)
    ort32, refused = write_export(
        float32, resolve_model(args.model), None, "float32", max_length=None, threads=torch.get_num_threads()
    )
    if ort32 is None:
        raise SystemExit(f"the float32 ONNX export was refused: {refused}")
    encoders = {"torch_float32": float32, "torch_bfloat16": loaded["bfloat16"].encoder, "onnxruntime_float32": ort32}
    texts = (dev.sentence1 + dev.sentence2)[: args.n]
    conditions = (dev.condition + dev.condition)[: args.n]
    for enc in encoders.values():
        enc.encode(texts[: 2 * args.batch_size], "warm-up condition", batch_size=args.batch_size)  # type: ignore[attr-defined]
    seconds: dict[str, list[float]] = {name: [] for name in encoders}
    for r in range(args.repeats):
        conds = [f"{c} ({r})" for c in conditions]  # a new suffix per round: nothing reused between rounds
        for name, enc in encoders.items():
            start = time.perf_counter()
            enc.encode(texts, conds, batch_size=args.batch_size)  # type: ignore[attr-defined]
            seconds[name].append(time.perf_counter() - start)
        log("round", r, " ".join(f"{n}: {len(texts) / t[-1]:.0f}" for n, t in seconds.items()), "pairs/s")
    rate = {name: len(texts) / statistics.median(t) for name, t in seconds.items()}
    return {
        "cpu_kind": cpu_kind(),
        "model": float32.model_id,
        "profile": loaded["float32"].profile_name,
        "dev_rows": len(dev),
        "accuracy": accuracy,
        "speed": {
            "n_pairs": len(texts),
            "batch_size": args.batch_size,
            "threads": torch.get_num_threads(),
            "seconds": {name: [round(x, 3) for x in t] for name, t in seconds.items()},
            "pairs_per_s_median": {name: round(v, 1) for name, v in rate.items()},
            "bfloat16_vs_torch_float32": round(rate["torch_bfloat16"] / rate["torch_float32"], 3),
            "bfloat16_vs_onnxruntime_float32": round(rate["torch_bfloat16"] / rate["onnxruntime_float32"], 3),
        },
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "command": " ".join(["python -m benchmarks.systems.cpu_paths", *sys.argv[1:]]),
        "run": run_info("cpu"),
    }


def table(r: dict[str, object]) -> str:
    speed, acc = r["speed"], r["accuracy"]
    rate = speed["pairs_per_s_median"]  # type: ignore[index]
    rows = "".join(f"| {name} | {v:.0f} |\n" for name, v in rate.items())  # type: ignore[union-attr]
    text = f"CPU kind {r['cpu_kind']}: pairs/s (median of rounds)\n\n| path | pairs/s |\n|---|---:|\n{rows}\n"
    if not acc:
        return text
    return text + (
        f"cosine bfloat16 to float32 (encoder): {acc['cosine_bfloat16_float32_encoder']}; "  # type: ignore[index]
        f"C-STS dev Spearman bfloat16 - float32: {acc['dev_spearman_bfloat16_minus_float32']}\n"  # type: ignore[index]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--csv", type=Path, help="C-STS dev CSV (required but in --smoke)")
    parser.add_argument("--model", default=None, help="model id or folder [default: the default model]")
    parser.add_argument("-n", type=int, default=400, help="pairs encoded per path per round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--md-out", type=Path)
    parser.add_argument("--no-accuracy", dest="accuracy", action="store_false", help="measure speed only")
    parser.add_argument("--smoke", action="store_true", help="16 synthetic rows, one round")
    args = parser.parse_args(argv)
    if args.csv is None and not args.smoke:
        parser.error("--csv is required but in --smoke")
    if args.smoke:
        args.n, args.repeats = min(args.n, 16), 1
    quiet_transformers()
    result = measure(args)
    write_outputs(result, table(result), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
