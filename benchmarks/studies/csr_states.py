#!/usr/bin/env python3
r"""How small can the router's sentence cache be? Vectors and C-STS dev from float32, float16 and int8 states.

The router tri-encoder caches each sentence's states below the layers that see the condition
(condsearch.model.csr.cache.StateCache). This routes every dev row (both sentences, each under its row's
condition) from a cache filled in each storage type, each in its own fresh cache folder, and
reports per type:

- ``bytes_per_sentence``: the cache's size on disk over the sentences it holds;
- ``cosine_gap_max`` / ``cosine_gap_p99`` / ``cosine_gap_median``: 1 − cosine between each routed
  vector and the same row's vector from float32 states;
- the dev Spearman and condition sensitivity those vectors score.

    python -m benchmarks.studies.csr_states --dev ../shared/data/csts-reannotated/dev.csv \
        --json-out benchmarks/studies/results/csr_states.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks._lib.common import log, quiet_transformers, run_info, synthetic_csts, write_outputs  # noqa: E402
from benchmarks.paper.csts import csr_features  # noqa: E402
from condsearch.corpus.csts import read_csts  # noqa: E402
from condsearch.metrics import correlations, cosine_rows  # noqa: E402
from condsearch.model.csr import load_csr_encoder  # noqa: E402
from condsearch.model.csr.cache import STATE_DTYPES  # noqa: E402


def measure(args: argparse.Namespace) -> dict[str, object]:
    data = synthetic_csts(24) if args.smoke else read_csts(args.dev)
    rows: dict[str, dict[str, object]] = {}
    reference: tuple[np.ndarray, np.ndarray] | None = None
    for name in ("float32", "float16", "int8"):
        with tempfile.TemporaryDirectory(prefix="csr-states-") as tmp:
            encoder = load_csr_encoder(
                args.model, router=args.router, cache_dir=Path(tmp), state_dtype=STATE_DTYPES[name]
            )
            log("csr_states", f"{name}: routing {len(data)} rows, router {encoder.router_name}")
            feats, sensitivity = csr_features(encoder, data, batch_size=args.batch_size, progress=not args.smoke)
            v = (feats.x1, feats.x2)
            row: dict[str, object] = {
                "bytes_per_sentence": round(encoder.states.nbytes_per_sentence()),
                **{f"dev_{k}": round(x, 2) for k, x in correlations(cosine_rows(*v), feats.labels).items()},
                "condition_sensitivity": round(sensitivity, 4),
            }
        if reference is None:
            reference = v
        gap = 1.0 - np.concatenate([cosine_rows(a, r) for a, r in zip(v, reference, strict=True)])
        row.update(
            cosine_gap_max=float(gap.max()),
            cosine_gap_p99=float(np.quantile(gap, 0.99)),
            cosine_gap_median=float(np.median(gap)),
        )
        rows[name] = row
    return {
        "router": encoder.router_name,
        "router_variant": encoder.variant,
        "router_checksum": encoder.router_checksum,
        "n_rows": len(data),
        "data": "smoke" if args.smoke else str(args.dev),
        "states": rows,
        "run": run_info(),
    }


def markdown(result: dict[str, object]) -> str:
    lines = [
        f"Router {result['router']} ({result['router_variant']}), {result['n_rows']} rows\n",
        "| states | bytes / sentence | 1 − cos vs float32: max | p99 | median | dev Spearman | sensitivity |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in result["states"].items():  # type: ignore[attr-defined]
        lines.append(
            f"| {name} | {r['bytes_per_sentence']:,} | {r['cosine_gap_max']:.2e} | {r['cosine_gap_p99']:.2e} "
            f"| {r['cosine_gap_median']:.2e} | {r['dev_spearman']:.2f} | {r['condition_sensitivity']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dev", type=Path, default=None, help="C-STS CSV (required but in --smoke)")
    p.add_argument("--model", default=None)
    p.add_argument("--router", default="auto", help="router folder, 'default', 'none' or 'auto'")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="24 synthetic rows")
    args = p.parse_args(argv)
    if args.smoke == (args.dev is not None):
        p.error("give --dev or --smoke (which makes its own rows)")
    quiet_transformers()
    result = measure(args)
    write_outputs(result, markdown(result), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
