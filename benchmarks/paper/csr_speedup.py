#!/usr/bin/env python3
"""Cost of a new condition: full CASE re-encode vs the CSR path with a warm sentence cache.

For N distinct sentences: (1) fill the CSR sentence cache once (timed: the one-off cost);
(2) time a second cache pass (reuse: lookups only); then, for each of --repeats new
conditions, time (a) CASE encoding of all N sentences under the condition (one full forward
pass per pair) and (b) the CSR path for the same condition (condition query + per-pair
routing from the cache, reading states from disk). Reports medians and
``csr_new_condition_speedup`` = median(a) / median(b), measured in the same run.

    python -m benchmarks.paper.csr_speedup --csv ../shared/data/csts-reannotated/train.csv -n 5000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._lib.common import quiet_transformers, run_info, timing_config, write_json  # noqa: E402
from benchmarks.systems.index_throughput import distinct_sentences  # noqa: E402
from condsearch.model.csr import load_csr_encoder
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.spec import EncoderSpec

CONDITIONS = [
    "the color of the clothing",
    "the number of people",
    "the kind of animal",
    "the weather",
    "the location of the scene",
]


def _log(msg: str) -> None:
    print(f"[csr_speedup] {msg}", file=sys.stderr, flush=True)


def measure(args: argparse.Namespace) -> dict[str, object]:
    n = 64 if args.smoke else args.n
    repeats = 1 if args.smoke else args.repeats
    texts = distinct_sentences(args.csv, n)
    case = load_encoder(EncoderSpec(args.model, profile="none"))
    with tempfile.TemporaryDirectory() as tmp:
        cache_dir = Path(args.cache_dir) if args.cache_dir else Path(tmp)
        csr = load_csr_encoder(args.model, cache_dir=cache_dir, **_router_options(args))
        start = time.perf_counter()
        csr.cache_sentences(texts, batch_size=args.batch_size, progress=not args.smoke)
        fill_s = time.perf_counter() - start
        start = time.perf_counter()
        fresh = load_csr_encoder(args.model, cache_dir=cache_dir, **_router_options(args))
        fresh.cache_sentences(texts, batch_size=args.batch_size)
        reuse_s = time.perf_counter() - start
        bytes_per_sentence = fresh.states.nbytes_per_sentence()
        case_s, csr_s = [], []
        for r in range(repeats):
            condition = CONDITIONS[r % len(CONDITIONS)] + f" #{r}"
            start = time.perf_counter()
            case.encode(texts, condition, batch_size=args.batch_size)
            case_s.append(time.perf_counter() - start)
            # a fresh encoder object: shard index read from disk, no in-memory state carried over
            warm = load_csr_encoder(args.model, cache_dir=cache_dir, **_router_options(args))
            start = time.perf_counter()
            warm.encode(texts, condition, batch_size=args.batch_size)
            csr_s.append(time.perf_counter() - start)
            _log(f"repeat {r + 1}: CASE {case_s[-1]:.2f}s, CSR {csr_s[-1]:.2f}s")
    speedup = statistics.median(case_s) / statistics.median(csr_s)
    return {
        "n": len(texts),
        "csr_new_condition_speedup": round(speedup, 2),
        "case_reencode_seconds_median": round(statistics.median(case_s), 3),
        "csr_new_condition_seconds_median": round(statistics.median(csr_s), 3),
        "case_seconds": [round(s, 3) for s in case_s],
        "csr_seconds": [round(s, 3) for s in csr_s],
        "csr_cache_fill_seconds": round(fill_s, 3),
        "csr_cache_reuse_seconds": round(reuse_s, 3),
        "cache_bytes_per_sentence": round(bytes_per_sentence),
        "config": {
            "model": case.model_id,
            "router": csr.router_name,
            "router_layer": csr.router.layer,
            "router_config": csr.router.config.to_dict(),
            "router_variant": csr.router.config.variant,
            **timing_config(args.batch_size, repeats, args.smoke),
        },
        "run": run_info(),
    }


def _router_options(args: argparse.Namespace) -> dict[str, object]:
    """The router to time: a trained folder, or (--router none) an untrained variant; the cost
    of a router depends on its variant and k, not on its weights."""
    options: dict[str, object] = {"router": args.router}
    if args.variant is not None:
        options["variant"] = args.variant
    if args.k is not None:
        options["layer"] = -args.k
    return options


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", type=Path, required=True, help="C-STS style CSV to draw sentences from")
    p.add_argument("-n", type=int, default=5000)
    p.add_argument("--model", default=None)
    p.add_argument("--router", default="auto", help="router folder, 'default', 'none' or 'auto'")
    p.add_argument("--variant", default=None, help="with --router none: paper, extended or context")
    p.add_argument(
        "--k", type=int, default=None, help="with --router none --variant context: layers that see the condition"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache-dir", default=None, help="sentence cache folder (default: a temporary one)")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="64 sentences, one repeat")
    args = p.parse_args(argv)
    if (args.variant is not None or args.k is not None) and args.router != "none":
        p.error("--variant and --k time an untrained router: give them with --router none")
    quiet_transformers()
    result = measure(args)
    write_json(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
