#!/usr/bin/env python3
"""Fine-tuning the CASE encoder on C-STS: dev Spearman per fine-tuning kind and objective.

Each run named in --runs (``KIND:OBJECTIVES``, e.g. ``lora:mse``, ``full:mse+wacl``,
``lora:mse=1,bcl=0.5``, ``lora:mse+cmse``) fine-tunes the default model (or --model) from scratch with
:func:`condsearch.train.finetune_save.fit_and_save_encoder` — the code behind
``condsearch train lora|full`` — keeps the epoch with the best dev Spearman, and records
dev Spearman per epoch and the training time. The saved adapters or model folders stay in
--work-dir, so the best one can be shipped or indexed with.

    python -m benchmarks.studies.finetune --train $D/train.csv --dev $D/dev.csv \\
        --runs lora:mse,lora:quad,lora:mse+wacl,lora:mse+bcl,full:mse --head-on-top \\
        --json-out benchmarks/studies/results/finetune.json --md-out benchmarks/studies/results/finetune.md

A decoder embedder trains with LoRA on its prompts; ``--bidirectional-layers 1`` (or
``--preset bellm``) makes its top layer attend both ways, BeLLM's recipe:

    python -m benchmarks.studies.finetune --train $D/train.csv --dev $D/dev.csv --model Qwen/Qwen3-Embedding-0.6B \\
        --runs lora:mse --bidirectional-layers 1 --device cuda --json-out qwen3_bidir1.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._lib.common import log, quiet_transformers, run_info, synthetic_csts, write_csts_csv, write_outputs  # noqa: E402
from condsearch.corpus.csts import CstsData  # noqa: E402
from condsearch.model.encoders.family import POOLINGS, PRESETS  # noqa: E402
from condsearch.train.finetune import FinetuneConfig  # noqa: E402
from condsearch.train.finetune_save import fit_and_save_encoder  # noqa: E402
from condsearch.train.lora import LoraConfig  # noqa: E402
from condsearch.train.losses import parse_loss_spec  # noqa: E402


def parse_runs(spec: str) -> list[tuple[str, str]]:
    """Split ``lora:mse,full:mse+wacl`` into (kind, objectives) pairs; objectives may hold commas
    only inside ``name=weight`` lists, so a run starts at each ``kind:`` prefix."""
    runs: list[tuple[str, str]] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        kind, sep, losses = part.partition(":")
        if sep and kind in ("lora", "full"):
            runs.append((kind, losses))
        elif runs:  # a weight list continued: 'lora:mse=1,wacl=0.5'
            runs[-1] = (runs[-1][0], runs[-1][1] + "," + part)
        else:
            raise SystemExit(f"--runs: {part!r} is not KIND:OBJECTIVES (kind lora or full)")
    for _, losses in runs:
        parse_loss_spec(losses)  # fail before any training
    return runs


def subset_csv(path: Path, n_pairs: int, out: Path) -> Path:
    """Write the rows of the first n_pairs distinct sentence pairs of a C-STS CSV (both conditions kept)."""
    from condsearch.corpus.csts import read_csts

    data = read_csts(path)
    keep: dict[tuple[str, str], None] = {}
    rows = []
    for i, key in enumerate(zip(data.sentence1, data.sentence2, strict=True)):
        if key not in keep and len(keep) >= n_pairs:
            continue
        keep.setdefault(key)
        rows.append(i)
    subset = CstsData(
        [data.sentence1[i] for i in rows],
        [data.sentence2[i] for i in rows],
        [data.condition[i] for i in rows],
        data.labels[rows],
    )
    return write_csts_csv(subset, out)


def run_name(kind: str, losses: str) -> str:
    return f"{kind}-" + losses.replace("+", "_").replace(",", "_").replace("=", "")


def encoder_settings(args: argparse.Namespace) -> dict[str, object]:
    """Return the decoder settings given on the command line (those left unset are absent)."""
    given = {"bidirectional_layers": args.bidirectional_layers, "preset": args.preset, "pooling": args.pooling}
    return {k: v for k, v in given.items() if v is not None}


def measure(args: argparse.Namespace, train_csv: Path, dev_csv: Path, work_dir: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for kind, losses in parse_runs(args.runs):
        name = run_name(kind, losses)
        config = FinetuneConfig(
            kind=kind,
            epochs=args.epochs,
            batch_size=args.train_batch_size,
            lr=args.lr,  # None: FinetuneConfig's default for the kind
            losses=tuple(parse_loss_spec(losses).items()),
            head_on_top=args.head_on_top,
            head_dim=args.dim,
            init_head=str(args.init_head) if args.init_head else None,
            lora=LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank),
            seed=args.seed,
            **({"layer_decay": args.layer_decay} if args.layer_decay is not None else {}),
        )
        log("finetune", f"{name}: {args.epochs} epochs, lr {config.lr:g}, head on top: {args.head_on_top}")
        start = time.perf_counter()
        summary = fit_and_save_encoder(
            train_csv,
            work_dir / name,
            config,
            dev_csv=dev_csv,
            model=args.model,
            device=args.device,
            checkpoint_dir=work_dir / "checkpoints" / name,
            keep_epochs=args.keep_epochs,
            eval_batch_size=args.batch_size,
            encoder_settings=encoder_settings(args),
            progress=not args.smoke,
            on_epoch=lambda epoch, row, name=name: log(
                "finetune", f"{name} epoch {epoch}: loss {row['loss']:.4f}, dev {row.get('dev_spearman', 0):.2f}"
            ),
        )
        history = summary["history"]
        assert isinstance(history, list)
        rows.append(
            {
                "run": name,
                "kind": kind,
                "objectives": losses,
                "head_on_top": args.head_on_top,
                "init_head": bool(args.init_head),
                "encoder": encoder_settings(args),
                "dev_spearman": summary.get("dev_spearman"),
                "best_epoch": summary["best_epoch"],
                "dev_spearman_per_epoch": [round(float(r["dev_spearman"]), 2) for r in history],
                "train_seconds": summary["train_seconds"],
                "wall_seconds": round(time.perf_counter() - start, 1),
                "out": str(work_dir / name),
                "config": summary["config"],
            }
        )
    return rows


def _head_label(row: dict[str, object]) -> str:
    if row["init_head"]:
        return "from " + Path(str(row["config"]["init_head"])).name  # type: ignore[index]
    return "new" if row["head_on_top"] else "none"


def table(rows: list[dict[str, object]], info: dict[str, object]) -> str:
    device = info.get("gpu") or info["machine"]["cpu"]  # type: ignore[index]
    settings = rows[0]["encoder"] if rows else {}
    what = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in settings.items())  # type: ignore[union-attr]
    lines = [
        f"C-STS dev Spearman×100 after fine-tuning ({device}{'; ' + what if what else ''})",
        "",
        "| run | kind | objectives | head | dev Spearman | best epoch | per epoch | train s |",
        "|---|---|---|---|---:|---:|---|---:|",
    ]
    for r in rows:
        per_epoch = " → ".join(f"{s:.2f}" for s in r["dev_spearman_per_epoch"])  # type: ignore[union-attr]
        lines.append(
            f"| {r['run']} | {r['kind']} | {r['objectives']} | {_head_label(r)} "
            f"| {float(r['dev_spearman'] or 0):.2f} | {r['best_epoch']} | {per_epoch} | {r['train_seconds']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", type=Path, default=None, help="C-STS train CSV (required but in --smoke)")
    p.add_argument("--dev", type=Path, default=None, help="C-STS dev CSV: the epoch is chosen and scored here")
    p.add_argument("--runs", default="lora:mse,full:mse", help="comma-separated KIND:OBJECTIVES runs")
    p.add_argument("--model", default=None, help="model id or folder (default all-MiniLM-L6-v2)")
    p.add_argument("--bidirectional-layers", type=int, default=None, help="decoders: top layers attending both ways")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="decoders: paper settings (bellm)")
    p.add_argument("--pooling", choices=POOLINGS, default=None, help="pooling [default: the model family's]")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train-pairs", type=int, default=None, help="first N sentence pairs only")
    p.add_argument("--lr", type=float, default=None, help="encoder learning rate [default: per kind]")
    p.add_argument("--train-batch-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64, help="pairs per forward pass when scoring dev")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--layer-decay", type=float, default=None, help="layer-wise lr decay [default: off]")
    p.add_argument("--keep-epochs", action="store_true", help="keep each epoch's weights (for a soup)")
    p.add_argument("--head-on-top", action="store_true", help="train a projection head jointly")
    p.add_argument("--dim", type=int, default=256, help="head dimension under --head-on-top")
    p.add_argument("--init-head", type=Path, default=None, help="head folder to start the joint head from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)
    p.add_argument("--work-dir", type=Path, default=None, help="where the runs' adapters and models are kept")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="synthetic data, one epoch per run")
    args = p.parse_args(argv)
    quiet_transformers()
    with tempfile.TemporaryDirectory(prefix="finetune-bench-") as tmp:
        work_dir = args.work_dir or Path(tmp)
        if args.smoke:
            args.epochs = 1
            train_csv = write_csts_csv(synthetic_csts(32, seed=0), Path(tmp) / "train.csv")
            dev_csv = write_csts_csv(synthetic_csts(16, seed=1), Path(tmp) / "dev.csv")
        elif args.train is None or args.dev is None:
            p.error("--train and --dev are required (or --smoke)")
        else:
            train_csv, dev_csv = args.train, args.dev
            if args.train_pairs:
                train_csv = subset_csv(args.train, args.train_pairs, Path(tmp) / "train-subset.csv")
        rows = measure(args, train_csv, dev_csv, work_dir)
    info = run_info(args.device)
    result = {
        "rows": rows,
        "best": max(rows, key=lambda r: float(r["dev_spearman"] or 0))["run"] if rows else None,
        "config": {
            "model": args.model,
            "encoder": encoder_settings(args),
            "epochs": args.epochs,
            "train_pairs": args.train_pairs,
            "train_batch_size": args.train_batch_size,
            "lora_rank": args.lora_rank,
            "layer_decay": args.layer_decay,
            "dim": args.dim if args.head_on_top else None,
            "init_head": str(args.init_head) if args.init_head else None,
            "seed": args.seed,
            "smoke": args.smoke,
            "files": {"train": str(args.train), "dev": str(args.dev)},
        },
        **info,
    }
    write_outputs(result, table(rows, info), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
