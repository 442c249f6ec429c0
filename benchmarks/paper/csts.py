#!/usr/bin/env python3
"""C-STS benchmark: Spearman and Pearson (×100) of cosine against label, per split.

Modes: ``unconditional`` (each sentence embedded alone, condition ignored), ``case``
(CASE vectors f(c; I(s)) − f(c; I(∅))) and ``csr`` (the router tri-encoder: cos of
route(s1, c) and route(s2, c), no head). Heads: a profile shipped for the default model
(``full``, which ``default`` names; ``lora``; ``frozen``), ``train`` (trained here on --train,
epoch chosen on --dev), ``none``
(raw cosine), or a folder from ``condsearch train`` (a head and/or a LoRA adapter, e.g.
``train lora``; the adapter is loaded onto the encoder). ``--dims 32,64,128,256`` also
trains one head per dimension (case mode).
In case mode the JSON also carries the isotropy I_iso (CASE Appendix C, 1,000 random
directions) of f(c; I(s)) and of f(c; I(s)) − f(c; I(∅)) on dev. Model selection uses
--dev only; --test is scored, never tuned on.

    python -m benchmarks.paper.csts --train ../shared/data/csts-reannotated/train.csv \
        --dev ../shared/data/csts-reannotated/dev.csv --mode case --json-out results.json
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks._lib.common import git_commit, quiet_transformers, run_info, synthetic_csts, write_outputs  # noqa: E402
from benchmarks._lib.features import plain_features  # noqa: E402
from benchmarks._lib.isotropy import cosine_to_mean, isotropy  # noqa: E402
from condsearch.base.output_cache import EmbeddingCache, default_cache_dir  # noqa: E402
from condsearch.corpus.csts import CstsData, read_csts  # noqa: E402
from condsearch.errors import CondsearchError, first_line  # noqa: E402
from condsearch.model.artifacts.profiles import PROFILE_DEFAULT as HEAD_DEFAULT  # noqa: E402
from condsearch.model.artifacts.profiles import PROFILE_NONE as HEAD_NONE  # noqa: E402
from condsearch.model.artifacts.profiles import SHIPPED_PROFILES as SHIPPED_HEADS  # noqa: E402
from condsearch.model.artifacts.profiles import Profile  # noqa: E402
from condsearch.model.encoders import Encoder, load_encoder  # noqa: E402
from condsearch.model.encoders.cpu import QUANTIZE_CHOICES, CpuConfig  # noqa: E402
from condsearch.model.encoders.spec import EncoderSpec, Runtime  # noqa: E402
from condsearch.model.vectorizer import head_folder, resolve_head  # noqa: E402
from condsearch.train.head import (  # noqa: E402
    HeadTrainConfig,
    PairFeatures,
    case_features,
    evaluate_head,
    fit_head,
)
from condsearch.version import __version__  # noqa: E402

SMOKE_ROWS = 48
HEAD_CHOICES = ("auto", HEAD_DEFAULT, *SHIPPED_HEADS, "train", "none")


def _log(msg: str) -> None:
    print(f"[csts] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", type=Path, default=None, help="C-STS CSV to train heads on (required but in --smoke)")
    p.add_argument("--dev", type=Path, default=None, help="C-STS CSV for model selection and the dev score")
    p.add_argument("--test", type=Path, default=None, help="held-out CSV: scored only")
    p.add_argument("--mode", choices=["unconditional", "case", "csr"], default="case")
    p.add_argument(
        "--router",
        default="auto",
        help="csr mode: router folder, 'default' (shipped), 'none' (untrained), 'train' (train one on --train, "
        "choosing the epoch on --dev) or 'auto' (default for the default model)",
    )
    p.add_argument(
        "--variant",
        choices=["paper", "extended", "context"],
        default=None,
        help="csr mode with --router none/train: the router variant (paper: eq. 1 of seed 002; extended and "
        "context: ours). A trained router folder carries its own.",
    )
    p.add_argument("--k", type=int, default=None, help="--variant context: top layers that see the condition")
    p.add_argument("--train-backbone", choices=["all", "top"], default=None, help="--variant context, --router train")
    p.add_argument("--init", choices=["base", "full"], default="base", help="--variant context, --router train")
    p.add_argument("--router-epochs", type=int, default=None, help="csr --router train: epochs [default: 3]")
    p.add_argument(
        "--head",
        default="auto",
        help=(
            "auto, default, full, lora, frozen, train, none, or a folder written by condsearch train (a head, an "
            "adapter, or both); auto: the shipped default profile (full) for the default model in case mode, else train"
        ),
    )
    p.add_argument("--model", default=None, help="model id or folder (default all-MiniLM-L6-v2)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--dims", default=None, help="comma-separated head dimensions to sweep as well (e.g. 32,64,128,256)")
    p.add_argument("--isotropy-directions", type=int, default=1000, help="random directions for I_iso")
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64, help="pairs per encoder forward pass")
    p.add_argument("--no-cache", action="store_true", help="do not use the encoder-output cache")
    p.add_argument(
        "--quantize",
        choices=QUANTIZE_CHOICES,
        default=CpuConfig.quantize,
        help="int8: encode with the int8 encoder (CPU, onnxruntime) and score float32 on dev beside it",
    )
    p.add_argument("--threads", type=int, default=CpuConfig.threads, help="intra-op threads [default: every core]")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument(
        "--smoke",
        action="store_true",
        help=f"first {SMOKE_ROWS} rows of each file (synthetic without files), 2 epochs",
    )
    args = p.parse_args(argv)
    if not args.smoke and (args.train is None or args.dev is None):
        p.error("--train and --dev are required (except with --smoke)")
    if args.head not in HEAD_CHOICES and not Path(args.head).is_dir():
        p.error(f"--head {args.head!r}: choose from {', '.join(HEAD_CHOICES)} or give a folder")
    if args.mode == "csr" and args.quantize != "none":
        p.error("--quantize applies to --mode case and unconditional (the CSR remainder stays float32)")
    if args.mode == "csr" and args.head not in ("auto", "none"):
        p.error("--mode csr evaluates the routed vectors directly: --head applies to case/unconditional only")
    return args


def csr_features(
    encoder: object, data: CstsData, *, batch_size: int = 64, progress: bool = False
) -> tuple[PairFeatures, float]:
    """Route both sentences of each row under its condition with the router tri-encoder;
    return the features and the condition sensitivity (each sentence under its pair's two
    conditions, see condsearch.train.router.pair_sensitivity)."""
    from condsearch.train.router import pair_sensitivity

    with torch.inference_mode():
        v1, v2 = (
            encoder.encode(side, data.condition, batch_size=batch_size, progress=progress)  # type: ignore[attr-defined]
            for side in (data.sentence1, data.sentence2)
        )
    return PairFeatures(v1, v2, data.labels), pair_sensitivity(data, v1, v2)


def isotropy_report(
    encoder: Encoder, data: CstsData, *, batch_size: int, cache: EmbeddingCache | None, n_directions: int
) -> dict[str, object]:
    """I_iso and cosine-to-mean of cond = f(c; I(s)) and of CASE = cond − f(c; I(∅)) (CASE Table 2/8/9)."""
    sentences = data.sentence1 + data.sentence2
    conditions = data.condition + data.condition
    cond = encoder.encode_pairs(list(zip(conditions, sentences, strict=True)), batch_size=batch_size, cache=cache)
    base = encoder.encode_pairs([(c, None) for c in conditions], batch_size=batch_size, cache=cache)
    case = cond - base
    return {
        "n_vectors": len(sentences),
        "n_directions": n_directions,
        "i_iso": {"cond": isotropy(cond, n_directions), "cond_minus_c": isotropy(case, n_directions)},
        "cos_to_mean": {"cond": cosine_to_mean(cond), "cond_minus_c": cosine_to_mean(case)},
    }


def run(args: argparse.Namespace) -> dict[str, object]:
    if args.train is None or args.dev is None:  # --smoke without files: synthetic rows
        splits: dict[str, CstsData] = {"train": synthetic_csts(SMOKE_ROWS, seed=0), "dev": synthetic_csts(32, seed=1)}
    else:
        splits = {"train": read_csts(args.train), "dev": read_csts(args.dev)}
    if args.test is not None:
        splits["test"] = read_csts(args.test)
    epochs = args.epochs
    if args.smoke:
        splits = {k: v.head(SMOKE_ROWS) for k, v in splits.items()}
        epochs = 2
    if args.mode == "csr":
        return _run_csr(args, splits)
    encoder = load_encoder(
        EncoderSpec(args.model, quantize=args.quantize, runtime=Runtime(threads=args.threads)),
        profile=Profile(adapter=_adapter_folder(args)),
    )
    cache = None if args.no_cache or args.smoke else EmbeddingCache(default_cache_dir() / "features")
    featurize = case_features if args.mode == "case" else plain_features
    head_choice = args.head
    if head_choice == "auto":
        shipped = resolve_head("auto", encoder)[1] if args.mode == "case" else HEAD_NONE
        head_choice = "train" if shipped == HEAD_NONE else shipped  # the default model's default profile
    need = ["dev", "test"] + (["train"] if head_choice == "train" else [])
    feats: dict[str, PairFeatures] = {}
    start = time.perf_counter()
    for name in need:
        if name in splits:
            _log(f"encoding {name} ({len(splits[name])} rows, mode {args.mode})")
            feats[name] = featurize(encoder, splits[name], batch_size=args.batch_size, cache=cache, progress=True)
    encode_s = time.perf_counter() - start
    history: list[dict[str, float]] = []
    if head_choice not in ("train", "none"):  # default, or a folder (with its adapter loaded above)
        head = resolve_head(head_choice, encoder)[0]
    elif head_choice == "train":
        config = HeadTrainConfig(dim=args.dim, epochs=epochs, seed=args.seed)
        _log(f"training a {args.dim}-d head for {epochs} epochs, epoch chosen on dev")
        head, history = fit_head(feats["train"], config, dev=feats["dev"])
    else:
        head = None
    result: dict[str, object] = {name: evaluate_head(head, f) for name, f in feats.items()}
    if args.dims and head_choice == "train":
        result["dim_sweep"] = _dim_sweep(args, feats, epochs)
    if args.quantize == "int8":
        result["float32"] = _float32_beside(args, splits["dev"], head, featurize, cache)
        result["int8_minus_float32_dev_spearman"] = round(
            float(result["dev"]["spearman"]) - float(result["float32"]["dev"]["spearman"]),
            2,  # type: ignore[index]
        )
    if args.mode == "case":
        _log(f"isotropy on dev ({args.isotropy_directions} directions)")
        result["isotropy"] = isotropy_report(
            encoder, splits["dev"], batch_size=args.batch_size, cache=cache, n_directions=args.isotropy_directions
        )
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
        "quantize": args.quantize,
        "threads": torch.get_num_threads(),
        "condsearch_version": __version__,
        "torch": torch.__version__,
        "device": str(getattr(encoder, "device", "cpu")),
        "machine": f"{platform.machine()} {platform.processor() or ''} {torch.get_num_threads()} threads".strip(),
        "run": run_info(),
        "git_commit": git_commit(),
    }
    return result


def _float32_beside(
    args: argparse.Namespace, dev: CstsData, head: object, featurize: object, cache: EmbeddingCache | None
) -> dict[str, object]:
    """Score dev in float32 with the same head (and adapter), to set beside the int8 score."""
    _log("encoding dev in float32 to compare")
    reference = load_encoder(
        EncoderSpec(args.model, runtime=Runtime(device="cpu")), profile=Profile(adapter=_adapter_folder(args))
    )
    feats = featurize(reference, dev, batch_size=args.batch_size, cache=cache, progress=True)  # type: ignore[operator]
    return {"dev": evaluate_head(head, feats), "encoder": reference.describe()}  # type: ignore[arg-type]


def _adapter_folder(args: argparse.Namespace) -> Path | None:
    """Return the LoRA adapter folder that --head names in case mode (the encoder loads it), if any."""
    if args.mode != "case" or args.head in ("train", "none"):
        return None
    from condsearch.base.model_sources import resolve_model
    from condsearch.train.adapter import has_adapter

    folder = head_folder(args.head, resolve_model(args.model).model_id)
    return folder if folder is not None and has_adapter(folder) else None


def _dim_sweep(args: argparse.Namespace, feats: dict[str, PairFeatures], epochs: int) -> list[dict[str, object]]:
    """Train one head per dimension in --dims (same recipe, epoch chosen on dev)."""
    rows: list[dict[str, object]] = []
    for dim in [int(d) for d in args.dims.split(",") if d.strip()]:
        _log(f"dimension sweep: {dim}-d head, {epochs} epochs")
        start = time.perf_counter()
        head, history = fit_head(
            feats["train"], HeadTrainConfig(dim=dim, epochs=epochs, seed=args.seed), dev=feats["dev"]
        )
        row: dict[str, object] = {"dim": dim, "train_seconds": round(time.perf_counter() - start, 2)}
        row.update({name: evaluate_head(head, f) for name, f in feats.items() if name != "train"})
        row["best_epoch"] = int(max(history, key=lambda r: r["dev_spearman"])["epoch"])
        rows.append(row)
    return rows


def _run_csr(args: argparse.Namespace, splits: dict[str, CstsData]) -> dict[str, object]:
    from condsearch.model.csr import load_csr_encoder

    cache_dir = None
    if args.smoke or args.no_cache:
        import tempfile

        cache_dir = Path(tempfile.mkdtemp(prefix="csts-csr-"))
    router = "none" if args.router == "train" else args.router
    layer = -args.k if args.k is not None else None
    encoder = load_csr_encoder(args.model, router=router, variant=args.variant, layer=layer, cache_dir=cache_dir)
    training = None
    if args.router == "train":
        from condsearch.train.router import RouterTrainConfig, fit_router

        config = RouterTrainConfig(
            epochs=1 if args.smoke else (args.router_epochs or RouterTrainConfig.epochs),
            train_backbone=args.train_backbone,
            init=args.init,
        ).resolved(encoder.router.config.variant)
        _log(f"training the {encoder.router.config.describe()} router on train ({len(splits['train'])} rows)")
        t0 = time.perf_counter()
        history = fit_router(encoder, splits["train"], config, dev=splits.get("dev"))
        training = {"config": asdict(config), "seconds": round(time.perf_counter() - t0, 1), "history": history}
        encoder.router_name = "trained here (--router train)"
    start = time.perf_counter()
    result: dict[str, object] = {}
    for name in ("dev", "test"):
        if name in splits:
            _log(f"routing {name} ({len(splits[name])} rows, router {encoder.router_name})")
            feats, sensitivity = csr_features(
                encoder, splits[name], batch_size=args.batch_size, progress=not args.smoke
            )
            result[name] = {**evaluate_head(None, feats), "condition_sensitivity": sensitivity}
    if training is not None:
        result["training"] = training
    result["config"] = {
        "mode": "csr",
        "head": "none",
        "router": encoder.router_name,
        "router_checksum": encoder.router_checksum,
        "router_layer": encoder.router.layer,
        "router_variant": encoder.router.config.variant,
        "router_label": encoder.router.config.describe(),
        "model": encoder.model_id,
        "model_revision": encoder.revision,
        "encoder": encoder.describe(),
        "dim": encoder.dim,
        "seed": args.seed,
        "smoke": args.smoke,
        "files": {k: str(getattr(args, k)) for k in ("train", "dev", "test") if getattr(args, k)},
        "dropped_label_minus_1": {k: v.n_dropped for k, v in splits.items()},
        "encode_seconds": round(time.perf_counter() - start, 2),
        "condsearch_version": __version__,
        "torch": torch.__version__,
        "device": str(encoder.device),
        "machine": f"{platform.machine()} {platform.processor() or ''} {torch.get_num_threads()} threads".strip(),
        "run": run_info(),
        "git_commit": git_commit(),
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
    quantize = config.get("quantize", "none")
    for split in ("train", "dev", "test"):
        r = result.get(split)
        if isinstance(r, dict):
            name = f"{split} ({quantize})" if quantize != "none" else split
            lines.append(f"| {name} | {r['n']} | {r['spearman']:.2f} | {r['pearson']:.2f} |")
    beside = result.get("float32")
    if isinstance(beside, dict):
        r = beside["dev"]
        lines.append(f"| dev (float32) | {r['n']} | {r['spearman']:.2f} | {r['pearson']:.2f} |")
    sweep = result.get("dim_sweep")
    if isinstance(sweep, list) and sweep:
        lines += ["", "| head dim | dev Spearman×100 | dev Pearson×100 | best epoch |", "|---:|---:|---:|---:|"]
        for row in sweep:
            dev = row["dev"]
            lines.append(f"| {row['dim']} | {dev['spearman']:.2f} | {dev['pearson']:.2f} | {row['best_epoch']} |")
    iso = result.get("isotropy")
    if isinstance(iso, dict):
        i, m = iso["i_iso"], iso["cos_to_mean"]
        lines += [
            "",
            f"| dev vectors (n = {iso['n_vectors']}) | I_iso | cos to mean (mean ± std) |",
            "|---|---:|---:|",
            f"| cond f(c; I(s)) | {i['cond']:.4f} | {m['cond']['mean']:.3f} ± {m['cond']['std']:.3f} |",
            f"| cond − c (CASE) | {i['cond_minus_c']:.4f} | "
            f"{m['cond_minus_c']['mean']:.3f} ± {m['cond_minus_c']['std']:.3f} |",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_transformers()
    try:
        result = run(args)
    except CondsearchError as exc:
        print(f"csts.py: error: {first_line(exc)}", file=sys.stderr)
        return 1
    write_outputs(result, markdown(result), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
