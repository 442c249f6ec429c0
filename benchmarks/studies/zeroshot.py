#!/usr/bin/env python3
"""Issue 57, item 3: does ``adapt``'s recipe, trained on several sources at once, help sources it never saw?

The zero-shot default must beat plain MiniLM on text nobody labelled for it. This trains one router
on the labelled tables of a *fold* of sources, with ``condsearch adapt``'s recipe (from the shipped
router; MSE plus the in-condition contrastive term; the distillation anchor; the top two layers),
and the two training levers of the issue together:

- **condition negatives**: a source with two or more label columns gives contrast pairs only (one
  text under two of its conditions, alike under one and unlike under the other), from every
  training source at once; a one-column source gives alike and unlike pairs;
- **the anchor**: the distillation term during training, then the weights interpolated with the
  shipped router's at each ``--alphas`` weight (WiSE-FT), each saved as a router of its own.

Nothing is chosen on the sources left out: each saved router is scored on them afterwards by
``heldout.py`` (``csr:DIR``), on WordNet dev by ``ood.py`` and on C-STS dev (here, with
``--csts-dev``). Training pairs are drawn from the training sources' ``dev`` rows only (``heldout``'s
split by text hash), so no source's ``report`` rows are ever trained on.

    python -m benchmarks.studies.zeroshot --train gcide,edict,tweets --alphas 1,0.5 \\
        --out build/zeroshot/fold-a --csts-dev ../shared/data/csts-reannotated/dev.csv
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks._lib.common import exit_code, log, quiet_transformers, run_info
from benchmarks.studies.heldout import read_sources, split_of

DEFAULT_SOURCES = Path("build/anytext/sources.json")


def draw_fold_pairs(sources: list[dict[str, object]], names: list[str], n_pairs: int, seed: int):
    """Draw each training source's pairs from its dev rows (n_pairs shared equally); return rows, values, counts."""
    import numpy as np

    from condsearch.corpus.csts import CstsData
    from condsearch.train.pairs import LabelSpec, PairsConfig, make_pairs
    from condsearch.train.pairs_files import read_labelled

    by_name = {str(s["name"]): s for s in sources}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise SystemExit(f"zeroshot: error: no source named {', '.join(missing)} in the sources file")
    s1: list[str] = []
    s2: list[str] = []
    cond: list[str] = []
    labels: list[np.ndarray] = []
    values: dict[tuple[str, str], str] = {}
    counts: dict[str, dict[str, int]] = {}
    for name in names:
        source = by_name[name]
        conditions: dict[str, list[str]] = source["conditions"]  # type: ignore[assignment]
        specs = [LabelSpec(c, tuple(p)) for c, p in conditions.items()]
        data = read_labelled(Path(str(source["table"])), [s.column for s in specs])
        keep = [i for i, t in enumerate(data.texts) if split_of(t) == "dev"]
        texts = [data.texts[i] for i in keep]
        cols = {s.column: [data.labels[s.column][i] for i in keep] for s in specs}
        config = PairsConfig(n_pairs=max(1, n_pairs // len(names)), contrast_only=len(specs) >= 2, seed=seed)
        pairs = make_pairs(texts, cols, specs, config)
        rows = pairs.rows
        s1 += rows.sentence1
        s2 += rows.sentence2
        cond += rows.condition
        labels.append(rows.labels)
        for spec in specs:
            for phrasing in spec.phrasings:
                for text, value in zip(texts, cols[spec.column], strict=True):
                    if value is not None:
                        values[(phrasing, text)] = value
        counts[name] = {"pairs": pairs.n_pairs, "contrast": pairs.n_contrast, "plain": pairs.n_plain, "rows": len(rows)}
        log("zeroshot", f"{name}: {pairs.n_pairs} pairs ({pairs.n_contrast} contrast), {len(rows)} rows")
    return CstsData(s1, s2, cond, np.concatenate(labels)), values, counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sources", type=Path, default=DEFAULT_SOURCES, help="anytext's sources.json")
    ap.add_argument("--train", required=True, help="comma-separated sources to train on (the rest are left out)")
    ap.add_argument("--out", type=Path, required=True, help="folder: one router per alpha (alpha-1, alpha-0.5, ...)")
    ap.add_argument("--n-pairs", type=int, default=2000, help="pairs in all, shared equally by the sources")
    ap.add_argument("--alphas", default="1,0.5", help="interpolation weights with the shipped router to save")
    ap.add_argument("--epochs", type=int, default=None, help="[default: adapt's]")
    ap.add_argument("--lr", type=float, default=None, help="[default: adapt's]")
    ap.add_argument("--contrast-weight", type=float, default=None, help="[default: adapt's]")
    ap.add_argument("--distill-weight", type=float, default=None, help="[default: adapt's]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csts-dev", type=Path, default=None, help="C-STS dev CSV: Spearman of each saved router")
    ap.add_argument("--smoke", action="store_true", help="a few pairs, one epoch: check the script runs")
    args = ap.parse_args(argv)
    quiet_transformers()

    from condsearch.model.csr.context import CONTEXT
    from condsearch.model.csr.context_weights import backbone_delta, base_weights, save_context_router
    from condsearch.model.csr.encoder import load_csr_encoder
    from condsearch.train.adapt import AdaptConfig, _interpolate, _trainable, csts_spearman
    from condsearch.train.router import INIT_ROUTER, RouterTrainConfig, fit_router

    defaults = AdaptConfig()
    epochs = 1 if args.smoke else (args.epochs or defaults.epochs)
    n_pairs = 40 if args.smoke else args.n_pairs
    names = [n.strip() for n in args.train.split(",") if n.strip()]
    alphas = [float(a) for a in args.alphas.split(",")]
    started = time.monotonic()
    rows, values, counts = draw_fold_pairs(read_sources(args.sources), names, n_pairs, args.seed)

    encoder = load_csr_encoder(None, router=INIT_ROUTER, variant=CONTEXT)
    params = _trainable(encoder, "top")
    start = {n: p.detach().clone() for n, p in params.items()}
    config = RouterTrainConfig(
        epochs=epochs,
        batch_size=defaults.batch_size,
        lr=args.lr or defaults.lr,
        seed=args.seed,
        train_backbone="top",
        init="router",
        contrast_weight=defaults.contrast_weight if args.contrast_weight is None else args.contrast_weight,
        distill_weight=defaults.distill_weight if args.distill_weight is None else args.distill_weight,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    history = fit_router(
        encoder,
        rows,
        config,
        checkpoint_dir=args.out / "checkpoint",
        resume=(args.out / "checkpoint").exists(),
        checkpoint_every=20,
        progress=True,
        values=values,
    )
    train_seconds = round(time.monotonic() - started, 1)
    params = _trainable(encoder, "top")
    end = {n: p.detach().clone() for n, p in params.items()}
    base = base_weights(encoder.source.location)
    results: dict[str, object] = {}
    for alpha in alphas:
        _interpolate(params, start, end, alpha)
        encoder.refresh_identity()
        folder = args.out / f"alpha-{alpha:g}"
        delta, rank = backbone_delta(base, encoder.router.model)
        meta = {
            "model_id": encoder.model_id,
            "model_revision": encoder.revision,
            "training": {"zeroshot": vars(args) | {"alpha": alpha}},
        }
        save_context_router(encoder.router, delta, rank, folder, json.loads(json.dumps(meta, default=str)))
        entry: dict[str, object] = {"router": str(folder)}
        if args.csts_dev is not None:
            saved = load_csr_encoder(None, router=str(folder))
            entry["csts_dev_spearman"] = csts_spearman(saved, args.csts_dev)
            log("zeroshot", f"alpha {alpha:g}: C-STS dev {entry['csts_dev_spearman']:.2f}")
        results[f"{alpha:g}"] = entry
    report = {
        "run": run_info(),
        "train_sources": names,
        "pairs": counts,
        "config": {
            "epochs": epochs,
            "lr": config.lr,
            "contrast_weight": config.contrast_weight,
            "distill_weight": config.distill_weight,
            "n_pairs": n_pairs,
            "seed": args.seed,
        },
        "history": history,
        "train_seconds": train_seconds,
        "alphas": results,
    }
    (args.out / "zeroshot.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    log("zeroshot", f"wrote {args.out / 'zeroshot.json'} ({train_seconds:.0f} s to train)")
    return 0


if __name__ == "__main__":
    raise SystemExit(exit_code(main, "zeroshot.py"))
