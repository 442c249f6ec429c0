"""Ship a full fine-tune small: dev Spearman of the fully fine-tuned model vs its rank-r delta adapters.

Each weight matrix's change ΔW is cut to rank r by truncated SVD (condsearch.model.encoders.lowrank),
rounded to float16 as an adapter file stores it, and scored on dev beside the full model and
the base. Several --tuned files are averaged first (a soup of the last epochs' weights).
``--out DIR --out-rank R`` also writes that rank's adapter folder (``--head DIR`` loads it).

    python -m benchmarks.studies.lowrank --dev $D/dev.csv --tuned build/issue14/epochs/epoch-{4,5}.safetensors \\
        --ranks 8,16,32,64 --json-out benchmarks/studies/results/lowrank.json \\
        --md-out benchmarks/studies/results/lowrank.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks._lib.common import log, quiet_transformers, run_info, synthetic_csts, write_outputs
from condsearch.corpus.csts import CstsData, read_csts
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.bert import BertStyleEncoder
from condsearch.model.encoders.lowrank import (
    apply_deltas,
    average_weights,
    delta_bytes,
    kept_energy,
    read_tuned,
    weight_deltas,
)
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.train.adapter import save_delta_adapter
from condsearch.train.finetune import FinetuneConfig, evaluate_encoder, fit_encoder


def _base(model: str | None, device: str | None) -> BertStyleEncoder:
    encoder = load_encoder(
        EncoderSpec(model, profile="none", dtype="float32", pooling="auto", runtime=Runtime(device=device))
    )
    if not isinstance(encoder, BertStyleEncoder):
        raise SystemExit("lowrank: needs a BERT-style encoder")
    return encoder


def _score(encoder: BertStyleEncoder, dev: CstsData, batch_size: int) -> tuple[float, float]:
    start = time.perf_counter()
    spearman = evaluate_encoder(encoder, None, dev, batch_size=batch_size)["spearman"]
    return round(float(spearman), 2), round(time.perf_counter() - start, 1)


def measure(args: argparse.Namespace, dev: CstsData, tuned_paths: list[Path]) -> list[dict[str, object]]:
    """Return one row per setting: base, full fine-tune, each rank."""
    base = _base(args.model, args.device)
    # on the CPU beside the read weights, whatever --device runs the dev passes
    base_state = {k: v.detach().to("cpu", copy=True) for k, v in base.model.state_dict().items()}
    tuned = average_weights([read_tuned(p) for p in tuned_paths])
    energy = kept_energy(base_state, tuned, args.ranks)
    rows: list[dict[str, object]] = []
    if args.energy_only:  # no dev passes: how much of the change each rank keeps, and its size
        for rank in args.ranks:
            mb = round(delta_bytes(weight_deltas(base_state, tuned, rank=rank)) / 1e6, 2)
            rows.append({"setting": f"rank {rank}", "rank": rank, "mb": mb, "energy": round(energy[rank], 4)})
        return rows
    spearman, seconds = _score(base, dev, args.batch_size)
    rows.append({"setting": "base (no fine-tuning)", "rank": None, "mb": 0.0, "dev_spearman": spearman})
    log("lowrank", f"base {spearman} ({seconds}s)")
    with torch.no_grad():
        params = dict(base.model.named_parameters())
        for name, weight in tuned.items():
            params[name].copy_(weight)
    full = weight_deltas(base_state, tuned, rank=None)
    spearman, seconds = _score(base, dev, args.batch_size)
    rows.append({"setting": "full fine-tune", "rank": None, "mb": delta_bytes(full, 4) / 1e6, "dev_spearman": spearman})
    log("lowrank", f"full {spearman} ({seconds}s)")
    full_score = spearman
    for rank in args.ranks:
        state = {k: v.half().float() for k, v in weight_deltas(base_state, tuned, rank=rank).items()}
        with torch.no_grad():
            for name, p in base.model.named_parameters():
                p.copy_(base_state[name])
        apply_deltas(base.model, state)
        spearman, seconds = _score(base, dev, args.batch_size)
        mb = round(delta_bytes(state) / 1e6, 2)
        rows.append({"setting": f"rank {rank}", "rank": rank, "mb": mb, "dev_spearman": spearman})
        rows[-1]["energy"] = round(energy[rank], 4)
        rows[-1]["vs_full"] = round(spearman - full_score, 2)
        log("lowrank", f"rank {rank}: {spearman} ({mb} MB float16, {seconds}s)")
        if args.out is not None and rank == args.out_rank:
            extra = {"source": [str(p) for p in tuned_paths], "dev_spearman": spearman}
            save_delta_adapter(_base(args.model, args.device), state, args.out, rank=rank, extra=extra)
    return rows


def table(rows: list[dict[str, object]], info: dict[str, object]) -> str:
    """Return the markdown table of the rows."""
    lines = [
        f"Full fine-tune vs its low-rank delta adapters (float16), {info.get('cpu_model', '')}",
        "",
        "| setting | adapter MB | ΔW energy kept | dev Spearman | vs full |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        dev = f"{r['dev_spearman']:.2f}" if "dev_spearman" in r else ""
        lines.append(f"| {r['setting']} | {r['mb']} | {r.get('energy', '')} | {dev} | {r.get('vs_full', '')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dev", type=Path, default=None, help="C-STS dev CSV (required but in --smoke)")
    p.add_argument("--tuned", type=Path, nargs="*", default=[], help="fine-tuned weights (averaged when several)")
    p.add_argument("--ranks", default="8,16,32,64", help="comma-separated ranks to measure")
    p.add_argument("--model", default=None, help="the base model (default all-MiniLM-L6-v2)")
    p.add_argument("--batch-size", type=int, default=64, help="pairs per forward pass when scoring dev")
    p.add_argument("--device", default=None)
    p.add_argument("--energy-only", action="store_true", help="no dev passes: each rank's share of ΔW and size")
    p.add_argument("--out", type=Path, default=None, help="write the --out-rank adapter folder here")
    p.add_argument("--out-rank", type=int, default=None)
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="synthetic data, a one-epoch fine-tune of --model")
    args = p.parse_args(argv)
    args.ranks = [int(r) for r in args.ranks.split(",") if r.strip()]
    quiet_transformers()
    with tempfile.TemporaryDirectory(prefix="lowrank-bench-") as tmp:
        if args.smoke:
            dev = synthetic_csts(16, seed=1)
            config = FinetuneConfig(kind="full", epochs=1, batch_size=8, lr=1e-3)
            fit_encoder(_base(args.model, args.device), synthetic_csts(32, seed=0), config, checkpoint_dir=Path(tmp))
            args.tuned = [Path(tmp)]
        elif not args.tuned or (args.dev is None and not args.energy_only):
            p.error("--tuned and --dev (unless --energy-only) are required (or --smoke)")
        else:
            dev = read_csts(args.dev) if args.dev is not None else synthetic_csts(2)
        rows = measure(args, dev, args.tuned)
    info = run_info(args.device)
    result = {
        "rows": rows,
        "config": {
            "model": args.model,
            "tuned": [str(t) for t in args.tuned],
            "ranks": args.ranks,
            "smoke": args.smoke,
            "files": {"dev": str(args.dev)},
        },
        **info,
    }
    write_outputs(result, table(rows, info), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
