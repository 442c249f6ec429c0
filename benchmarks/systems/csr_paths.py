#!/usr/bin/env python3
r"""What runs the router fastest on this CPU, and what each path costs in accuracy (issues 39 and 41).

Four paths run the router tri-encoder's two passes: torch float32, onnxruntime float32 (its
checked export, condsearch.model.csr.onnx), onnxruntime int8 (dynamic quantisation, as CASE's
``--quantize int8``) and torch under bfloat16 autocast (condsearch.model.csr.bfloat16; the context router
only, and worth timing only on a CPU with bf16 products). Each has its own fresh cache folder. Per path:

- ``new_sentence_pairs_per_s``: texts never seen, under a condition whose code is cached: the lower
  layers, the state cache's write and read, and the routed layers (``encode`` on a fresh state cache);
- ``new_condition_pairs_per_s``: cached sentence states under a condition whose code is cached too:
  the routed layers alone, with the cache's reads;
- medians of ``--repeats`` rounds, the paths interleaved within each round (rotated), so that a
  background load weighs on each alike; each round's seconds are kept, with the load averages;
- ``cosine_to_torch``: each routed vector's cosine to torch float32's, on the timed texts;
- ``dev_spearman``: C-STS dev from each path's vectors (``--dev``), as benchmarks/paper/csts.py --mode csr scores it.

    python -m benchmarks.systems.csr_paths --dev ../shared/data/csts-reannotated/dev.csv \
        --json-out benchmarks/systems/results/csr_paths.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._lib.common import log, quiet_transformers, run_info, synthetic_csts, write_outputs  # noqa: E402
from benchmarks.paper.csts import csr_features  # noqa: E402
from condsearch.corpus.csts import read_csts  # noqa: E402
from condsearch.metrics import correlations, cosine_rows  # noqa: E402
from condsearch.model.csr import load_csr_encoder  # noqa: E402
from condsearch.model.csr.cache import StateCache  # noqa: E402
from condsearch.model.csr.encoder import CsrEncoder  # noqa: E402

PATHS = ("torch-float32", "onnxruntime-float32", "onnxruntime-int8", "torch-bfloat16")


def load_path(name: str, args: argparse.Namespace, cache: Path, threads: int) -> CsrEncoder:
    """Load the router on one path, its caches in their own folder: on the CPU, even where CUDA is present."""
    encoder = load_csr_encoder(
        args.model,
        device="cpu",
        router=args.router,
        variant=args.variant,
        cache_dir=cache,
        quantize="int8" if name.endswith("int8") else "none",
        threads=threads,
    )
    if name == "onnxruntime-float32" and not encoder.use_onnx("float32", threads=threads):
        raise SystemExit("csr_paths: the float32 export was refused")
    if name == "torch-bfloat16" and not encoder.use_bfloat16():
        raise SystemExit(f"csr_paths: the {encoder.variant} router has no bfloat16 path (the context router has)")
    return encoder


def fresh_states(encoder: CsrEncoder, folder: Path) -> None:
    """Give the encoder an empty state cache (same storage) in folder: its next texts are new sentences."""
    encoder.states = StateCache(folder, dtype=encoder.states.dtype, names=encoder.states.names)


def _loads() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def time_paths(
    encoders: dict[str, CsrEncoder], texts: list[str], conditions: list[str], args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """Time both costs on every path, interleaved; return per path its rounds, medians and cosines."""
    for encoder in encoders.values():  # every condition code cached first: a pass per condition, torch's on all paths
        for c in conditions:
            encoder.condition_code(c)
        encoder.encode(texts[:8], conditions[0], batch_size=args.batch_size)  # warm the sessions
    names = list(encoders)
    rounds: dict[str, dict[str, list[float]]] = {n: {"new_sentence": [], "new_condition": []} for n in names}
    vectors: dict[str, np.ndarray] = {}
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            encoder = encoders[name]
            fresh_states(encoder, tmp / f"{name}-{r}")
            t0 = time.perf_counter()
            v = encoder.encode(texts, conditions[0], batch_size=args.batch_size)
            rounds[name]["new_sentence"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            encoder.encode(texts, conditions[1 + r % (len(conditions) - 1)], batch_size=args.batch_size)
            rounds[name]["new_condition"].append(time.perf_counter() - t0)
            vectors.setdefault(name, v)
        log("csr_paths", f"round {r + 1}/{args.repeats}, load {_loads()}")
    out: dict[str, Any] = {}
    for name in names:
        cos = cosine_rows(vectors[name], vectors[PATHS[0]])
        out[name] = {
            **{f"{k}_pairs_per_s": round(len(texts) / statistics.median(s), 1) for k, s in rounds[name].items()},
            "seconds": {k: [round(x, 3) for x in s] for k, s in rounds[name].items()},
            "cosine_to_torch": {"min": float(cos.min()), "median": float(np.median(cos))},
        }
    for name in names:
        for k in ("new_sentence", "new_condition"):
            # per round, so that a load shared by the round cancels; then the median of the ratios
            ratios = [t / a for a, t in zip(rounds[name][k], rounds[PATHS[0]][k], strict=True)]
            out[name][f"{k}_speedup_vs_torch"] = round(statistics.median(ratios), 2)
    return out


def measure(args: argparse.Namespace) -> dict[str, object]:
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    data = synthetic_csts(24) if args.smoke else read_csts(args.dev)
    texts = list(dict.fromkeys(data.sentence1 + data.sentence2))[: args.n_texts]
    conditions = list(dict.fromkeys(data.condition))[: args.repeats + 1]
    result: dict[str, object] = {"load_average_start": _loads()}
    with tempfile.TemporaryDirectory(prefix="csr-paths-") as tmp_name:
        tmp = Path(tmp_name)
        encoders = {name: load_path(name, args, tmp / name, threads) for name in PATHS}
        first = encoders[PATHS[0]]
        log("csr_paths", f"router {first.router_name} ({first.variant}), {len(texts)} texts, {threads} threads")
        timing = time_paths(encoders, texts, conditions, args, tmp / "timed")
        scores: dict[str, dict[str, object]] = {}
        if not args.no_csts:
            reference: tuple[np.ndarray, np.ndarray] | None = None
            for name, encoder in encoders.items():
                fresh_states(encoder, tmp / f"{name}-csts")
                log("csr_paths", f"{name}: C-STS, {len(data)} rows")
                feats, sensitivity = csr_features(encoder, data, batch_size=args.batch_size)
                v = (feats.x1, feats.x2)
                reference = reference or v
                cos = np.concatenate([cosine_rows(a, b) for a, b in zip(v, reference, strict=True)])
                scores[name] = {
                    **{f"dev_{k}": round(x, 2) for k, x in correlations(cosine_rows(*v), feats.labels).items()},
                    "condition_sensitivity": round(sensitivity, 4),
                    "cosine_to_torch_min": float(cos.min()),
                    "cosine_to_torch_p01": float(np.quantile(cos, 0.01)),
                }
        paths = {name: {**timing[name], **scores.get(name, {})} for name in PATHS}
    result |= {
        "router": first.router_name,
        "router_variant": first.variant,
        "router_checksum": first.router_checksum,
        "model": first.model_id,
        "n_texts": len(texts),
        "n_rows": len(data),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "threads": threads,
        "data": "smoke" if args.smoke else str(args.dev),
        "paths": paths,
        "load_average_end": _loads(),
        "run": run_info("cpu"),
    }
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Router {result['router']} ({result['router_variant']}) on {result['model']}, {result['n_texts']} texts, "
        f"{result['threads']} threads, {result['run']['machine']['cpu']}; load {result['load_average_start']} → "
        f"{result['load_average_end']}\n",
        "| path | new sentence pairs/s (× torch) | new condition pairs/s (× torch) | min cos to torch "
        "| dev Spearman | sensitivity |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in result["paths"].items():
        spearman = f"{r['dev_spearman']:.2f}" if "dev_spearman" in r else "-"
        sensitivity = f"{r['condition_sensitivity']:.3f}" if "condition_sensitivity" in r else "-"
        lines.append(
            f"| {name} | {r['new_sentence_pairs_per_s']:.0f} ({r['new_sentence_speedup_vs_torch']:.2f}×) "
            f"| {r['new_condition_pairs_per_s']:.0f} ({r['new_condition_speedup_vs_torch']:.2f}×) "
            f"| {r['cosine_to_torch']['min']:.5f} | {spearman} | {sensitivity} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dev", type=Path, default=None, help="C-STS CSV (required but in --smoke)")
    p.add_argument("--model", default=None, help="model id or folder [default: the default model]")
    p.add_argument("--router", default="auto", help="router folder, 'default', 'none' or 'auto' (the shipped one)")
    p.add_argument("--variant", default=None, help="with --router none: paper, extended or context [default: paper]")
    p.add_argument("--n-texts", type=int, default=512, help="distinct texts timed per round")
    p.add_argument("--repeats", type=int, default=5, help="rounds (each path once per round)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="torch's and onnxruntime's threads [default: torch's]")
    p.add_argument("--no-csts", action="store_true", help="time only")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="24 synthetic rows, 2 rounds")
    args = p.parse_args(argv)
    if args.smoke == (args.dev is not None):
        p.error("give --dev or --smoke (which makes its own rows)")
    if args.smoke:
        args.repeats = 2
    quiet_transformers()
    result = measure(args)
    write_outputs(result, markdown(result), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
