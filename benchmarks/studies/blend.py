#!/usr/bin/env python3
"""C-STS dev of our blend: B × the CASE cosine + (1 − B) × plain MiniLM's cosine (issue 25).

The blend is what ``benchmarks/studies/ood.py``'s ``blend:B:case:PROFILE`` system scores out of domain
(the concatenation of √B · CASE and √(1 − B) · plain vectors has exactly this cosine). Each row's
two sentences are encoded under its condition with the profile, and alone with the base model.

    python -m benchmarks.studies.blend --dev ../shared/data/csts-reannotated/dev.csv --profile full \
        --betas 1,0.9,0.85,0.8,0.75,0.7,0.5,0 --json-out benchmarks/studies/results/blend_csts_dev.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from benchmarks._lib.common import log, quiet_transformers, run_info, synthetic_csts, write_outputs  # noqa: E402
from condsearch.corpus.csts import CstsData, read_csts  # noqa: E402


def cosines(data: CstsData, profile: str, model: str | None, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (CASE cosine under each row's condition, plain cosine) per row."""
    from condsearch.base.faiss_indexes import normalize
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec
    from condsearch.model.vectorizer import load_vectorizer

    vec = load_vectorizer(EncoderSpec(model, profile=profile))
    n = len(data)
    case = np.zeros(n, dtype=np.float32)
    rows_of: dict[str, list[int]] = {}
    for i, c in enumerate(data.condition):
        rows_of.setdefault(c, []).append(i)
    for condition, rows in rows_of.items():  # one condition at a time: its f(c; I(∅)) once
        a = vec.encode([data.sentence1[i] for i in rows], condition, batch_size=batch_size)
        b = vec.encode([data.sentence2[i] for i in rows], condition, batch_size=batch_size)
        case[rows] = (a * b).sum(axis=1)
    texts = data.sentence1 + data.sentence2
    plain = normalize(
        load_encoder(EncoderSpec(model, profile="none")).encode_pairs([(t, None) for t in texts], batch_size=batch_size)
    )
    return case, (plain[:n] * plain[n:]).sum(axis=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dev", type=Path, default=None, help="C-STS CSV (required but in --smoke)")
    p.add_argument("--profile", default="full", help="CASE profile name or folder")
    p.add_argument("--model", default=None)
    p.add_argument("--betas", default="1,0.9,0.85,0.8,0.75,0.7,0.5,0")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="48 synthetic rows")
    args = p.parse_args(argv)
    if not args.smoke and args.dev is None:
        p.error("--dev is required (except with --smoke)")
    quiet_transformers()
    data = synthetic_csts(48) if args.smoke else read_csts(args.dev)
    betas = [float(b) for b in args.betas.split(",")]
    log("blend", f"{len(data)} rows, profile {args.profile}")
    case, plain = cosines(data, args.profile, args.model, args.batch_size)
    rows = [
        {"beta": b, "spearman": round(100 * float(spearmanr(b * case + (1 - b) * plain, data.labels)[0]), 2)}
        for b in betas
    ]
    table = "| B (CASE share) | C-STS Spearman×100 |\n|---:|---:|\n"
    table += "".join(f"| {r['beta']} | {r['spearman']:.2f} |\n" for r in rows)
    result = {"benchmark": "blend", "profile": args.profile, "n": len(data), "rows": rows, "run": run_info()}
    write_outputs(result, table, args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
