#!/usr/bin/env python3
"""C-STS benchmark: Spearman and Pearson (×100) of cosine against label, per split.

Modes: ``unconditional`` (each sentence embedded alone, condition ignored) and ``case``
(CASE vectors f(c; I(s)) − f(c; I(∅))). Heads: ``default`` (the head shipped for the
default model), ``train`` (trained here on --train, epoch chosen on --dev), ``none``
(raw cosine). Model selection uses --dev only; --test is scored, never tuned on.

    python benchmarks/csts.py --train ../shared/data/csts-reannotated/train.csv \
        --dev ../shared/data/csts-reannotated/dev.csv --mode case --json-out results.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from condsearch import __version__
from condsearch.cache import EmbeddingCache, default_cache_dir
from condsearch.csts import CstsData, read_csts
from condsearch.encoders import load_encoder
from condsearch.errors import CondsearchError
from condsearch.pipeline import resolve_head
from condsearch.training import PairFeatures, TrainConfig, case_features, evaluate_head, plain_features, train_head

SMOKE_ROWS = 48


def _log(msg: str) -> None:
    print(f"[csts] {msg}", file=sys.stderr, flush=True)


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", type=Path, required=True, help="C-STS CSV to train heads on")
    p.add_argument("--dev", type=Path, required=True, help="C-STS CSV for model selection and the dev score")
    p.add_argument("--test", type=Path, default=None, help="held-out CSV: scored only")
    p.add_argument("--mode", choices=["unconditional", "case"], default="case")
    p.add_argument(
        "--head",
        choices=["auto", "default", "train", "none"],
        default="auto",
        help="auto: the shipped head for the default model in case mode, else train",
    )
    p.add_argument("--model", default=None, help="model id or folder (default all-MiniLM-L6-v2)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64, help="pairs per encoder forward pass")
    p.add_argument("--no-cache", action="store_true", help="do not use the encoder-output cache")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help=f"first {SMOKE_ROWS} rows of each file, 2 epochs")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, object]:
    splits: dict[str, CstsData] = {"train": read_csts(args.train), "dev": read_csts(args.dev)}
    if args.test is not None:
        splits["test"] = read_csts(args.test)
    epochs = args.epochs
    if args.smoke:
        splits = {k: v.head(SMOKE_ROWS) for k, v in splits.items()}
        epochs = 2
    encoder = load_encoder(args.model)
    cache = None if args.no_cache or args.smoke else EmbeddingCache(default_cache_dir() / "features")
    featurize = case_features if args.mode == "case" else plain_features
    head_choice = args.head
    if head_choice == "auto":
        head_choice = "train"
        if args.mode == "case" and resolve_head("auto", encoder)[1] == "default":
            head_choice = "default"
    need = ["dev", "test"] + (["train"] if head_choice == "train" else [])
    feats: dict[str, PairFeatures] = {}
    start = time.perf_counter()
    for name in need:
        if name in splits:
            _log(f"encoding {name} ({len(splits[name])} rows, mode {args.mode})")
            feats[name] = featurize(encoder, splits[name], batch_size=args.batch_size, cache=cache, progress=True)
    encode_s = time.perf_counter() - start
    history: list[dict[str, float]] = []
    if head_choice == "default":
        head = resolve_head("default", encoder)[0]
    elif head_choice == "train":
        config = TrainConfig(dim=args.dim, epochs=epochs, seed=args.seed)
        _log(f"training a {args.dim}-d head for {epochs} epochs, epoch chosen on dev")
        head, history = train_head(feats["train"], config, dev=feats["dev"])
    else:
        head = None
    result: dict[str, object] = {name: evaluate_head(head, f) for name, f in feats.items()}
    result["config"] = {
        "mode": args.mode,
        "head": head_choice,
        "model": encoder.model_id,
        "model_revision": encoder.revision,
        "encoder": encoder.describe(),
        "dim": head.config.dim if head is not None else encoder.dim,
        "epochs": epochs if head_choice == "train" else None,
        "best_epoch": int(max(history, key=lambda r: r["dev_spearman"])["epoch"]) if history else None,
        "seed": args.seed,
        "smoke": args.smoke,
        "files": {k: str(getattr(args, k)) for k in ("train", "dev", "test") if getattr(args, k)},
        "dropped_label_minus_1": {k: v.n_dropped for k, v in splits.items()},
        "encode_seconds": round(encode_s, 2),
        "condsearch_version": __version__,
        "torch": torch.__version__,
        "device": str(getattr(encoder, "device", "cpu")),
        "machine": f"{platform.machine()} {platform.processor() or ''} {torch.get_num_threads()} threads".strip(),
        "git_commit": _git_commit(),
    }
    return result


def markdown(result: dict[str, object]) -> str:
    config = result["config"]
    assert isinstance(config, dict)
    lines = [
        f"C-STS — mode `{config['mode']}`, head `{config['head']}` ({config['dim']}-d), model `{config['model']}`",
        "",
        "| split | n | Spearman×100 | Pearson×100 |",
        "|---|---:|---:|---:|",
    ]
    for split in ("train", "dev", "test"):
        r = result.get(split)
        if isinstance(r, dict):
            lines.append(f"| {split} | {r['n']} | {r['spearman']:.2f} | {r['pearson']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        result = run(args)
    except CondsearchError as exc:
        print(f"csts.py: error: {exc}", file=sys.stderr)
        return 1
    table = markdown(result)
    print(table, end="")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    if args.md_out:
        args.md_out.parent.mkdir(parents=True, exist_ok=True)
        args.md_out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
