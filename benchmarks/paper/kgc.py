#!/usr/bin/env python3
"""Knowledge-graph completion on WN18RR with the router tri-encoder, SimKGC protocol.

Entity text ``name: definition``; query = the head's text routed under the relation text
(``inverse <relation>`` for head prediction); candidates = all entities, each encoded once
without a condition (the plain forward pass of the same backbone) and searched through a
FAISS index; filtered ranking (other known answers in train+dev+test removed); MRR and
Hit@1/3/10 (×100) per direction and averaged. ``--rerank`` adds SimKGC's graph re-ranking
(+0.05 for entities within 5 hops of the head in the training graph) — reported labelled.
``--link-graph`` reads entities as SimKGC's ``--use-link-graph`` does (a description under 20
words gains the names of up to 10 neighbours in the training graph; in training each side of
a triple leaves the other out); a router trained so records it, and is then scored so.

The router evaluated by default is the one trained here on WN18RR (benchmarks/weights/);
``--router none`` gives the zero-shot (untrained) router. ``--train`` first trains with SimKGC's
objective (in-batch and self-negatives, with ``--pre-batch N`` the tails of the N previous batches
too, additive margin, learnable temperature), choosing on dev:

- by default the context router (ours, SPEC §2.2) with its **whole backbone** training, as
  SimKGC trains every layer: each batch runs every layer from the entities' token ids, and
  evaluation encodes every entity afresh with the trained weights;
- ``--frozen-lower`` (and always for the paper/extended router): only the layers above the
  state cache train, on cached entity states (cheap; what the first WN18RR router used).

Long runs are checkpointed (``--checkpoint-dir``, ``--resume``); with ``--save`` the best dev
weights so far are written there each time dev improves (a context router as a compact change
of the base model, both towers within 10 MB). ``--weights-from`` a run's checkpoint folder scores
its best dev weights exactly, or with ``--save`` writes and scores them as saved (the committed
artifact, regenerated from a run):

    python -m benchmarks.paper.kgc --data-dir ../shared/data/wn18rr --json-out results/kgc.json
    python -m benchmarks.paper.kgc --data-dir ../shared/data/wn18rr --router none --split dev --max-test 1000
    python -m benchmarks.paper.kgc --data-dir ../shared/data/wn18rr --train --epochs 10 --batch-size 256 \
        --checkpoint-dir build/kgc-context --save benchmarks/weights/wn18rr-minilm-context --split dev
    python -m benchmarks.paper.kgc --data-dir ../shared/data/wn18rr --weights-from build/kgc-context \
        --save benchmarks/weights/wn18rr-minilm-context --split dev --max-test 1000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from benchmarks._lib.common import log, quiet_transformers, run_info, write_outputs  # noqa: E402
from condsearch.errors import CondsearchError, first_line  # noqa: E402

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"
#: what ``--router auto`` evaluates: the best WN18RR router on dev so far (the context router, whole backbone)
AUTO_ROUTER = WEIGHTS_DIR / "wn18rr-minilm-context"
SIMKGC = {"mrr": 66.55, "hit@1": 58.65, "hit@3": 71.65, "hit@10": 80.01}  # released metrics.json, ×100
CSR_PAPER = {"mrr": 66.1, "hit@1": 58.1, "hit@3": 71.1}


def _log(msg: str) -> None:
    log("kgc", msg)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=None, help="WN18RR-shaped folder (see kgclib.data)")
    p.add_argument("--split", choices=["dev", "test"], default="test", help="split to score (default test)")
    p.add_argument("--max-test", type=int, default=None, help="score only the first N triples of the split")
    p.add_argument("--model", default=None, help="model id or folder (default all-MiniLM-L6-v2)")
    p.add_argument(
        "--router",
        default="auto",
        help="router folder, 'none' (untrained) or 'auto' (the WN18RR one; with --train: none)",
    )
    p.add_argument("--max-length", type=int, default=50, help="tokens per entity text (SimKGC: 50)")
    p.add_argument("--rerank", action="store_true", help="SimKGC graph re-ranking (+0.05 within 5 hops)")
    p.add_argument(
        "--link-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="SimKGC's --use-link-graph: a description under 20 words gains the names of up to 10 "
        "training-graph neighbours (default: as the router or checkpoint was trained)",
    )
    p.add_argument("--k", type=int, default=100, help="FAISS top-k per query before the exact fallback")
    p.add_argument("--device", default=None)
    p.add_argument("--cache-dir", type=Path, default=None, help="CSR state cache root (default the user cache)")
    p.add_argument(
        "--weights-from",
        type=Path,
        default=None,
        help="a whole-backbone run's --checkpoint-dir: score its best dev weights exactly, "
        "or with --save as saved (the committed artifact, regenerated)",
    )
    t = p.add_argument_group("training (--train)")
    t.add_argument("--train", action="store_true", help="train first (starting from --router)")
    t.add_argument(
        "--save", type=Path, default=None, help="folder to save the best trained router into (as dev improves)"
    )
    t.add_argument(
        "--frozen-lower",
        action="store_true",
        help="train only the layers above the state cache, on cached states (always so for paper/extended)",
    )
    t.add_argument("--epochs", type=int, default=1)
    t.add_argument("--batch-size", type=int, default=1024)
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--max-examples", type=int, default=None, help="training examples per epoch (of 173,670)")
    t.add_argument("--eval-every", type=int, default=0, help="steps between dev evaluations (0: per epoch)")
    t.add_argument("--max-dev", type=int, default=1000, help="dev triples used to choose the checkpoint")
    t.add_argument("--bf16", action="store_true", help="bfloat16 autocast for training passes")
    t.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    t.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="time N training steps at float32 and bfloat16, interleaved; report examples/s and stop",
    )
    t.add_argument(
        "--projection-probe",
        type=int,
        default=0,
        help="train N steps from --router without projecting; report what one projection would take away "
        "of the update (token table, rank cut, int8 rounding) and stop",
    )
    t.add_argument(
        "--profile-chunks",
        default="64",
        help="with --profile-steps: rows per length-sorted chunk of a batch to compare, e.g. 256,64",
    )
    t.add_argument(
        "--towers",
        type=int,
        choices=[1, 2],
        default=2,
        help="2: candidates get their own copy of the router layers (SimKGC's separate tail encoder); "
        "1: queries and candidates share them",
    )
    t.add_argument(
        "--variant",
        choices=["paper", "extended", "context"],
        default=None,
        help="router variant to train from scratch (--router none): paper = eq. 1 of seed 002, extended and "
        "context = ours (default with --train: context)",
    )
    t.add_argument("--context-k", type=int, default=None, help="context: top layers that see the condition")
    t.add_argument("--router-layer", type=int, default=None, help="first routed layer (negative: from the top)")
    t.add_argument("--hyper-rank", type=int, default=None, help="extended: rank of the condition projection (0: off)")
    t.add_argument("--checkpoint-dir", type=Path, default=None, help="checkpoint the run here (every N steps)")
    t.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    t.add_argument(
        "--project-every",
        type=int,
        default=0,
        help="ours: every N steps and before each dev check, put the weights into the saved artifact's "
        "compact form, so that dev scores what --save keeps (context router, whole backbone; 0: never)",
    )
    t.add_argument(
        "--freeze-token-table",
        action="store_true",
        help="ours: the input token table does not train (projection loses most of an update there)",
    )
    t.add_argument(
        "--pre-batch",
        type=int,
        default=0,
        help="SimKGC's pre-batch negatives: previous batches whose tails join each batch's negatives "
        "(SimKGC: 2 on FB15k-237; 0: off, as SimKGC on WN18RR)",
    )
    t.add_argument("--resume", action="store_true", help="continue the run in --checkpoint-dir")
    t.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="synthetic 60-entity graph, a few training steps")
    args = p.parse_args(argv)
    if args.project_every < 0 or (args.project_every and (args.frozen_lower or not args.train)):
        p.error("--project-every takes a count of steps, with --train of the whole backbone (not --frozen-lower)")
    if args.freeze_token_table and (args.frozen_lower or not args.train):
        p.error("--freeze-token-table needs --train of the whole backbone (not --frozen-lower)")
    if args.pre_batch < 0 or (args.pre_batch and not args.train):
        p.error("--pre-batch takes a count of batches, with --train")
    if (args.profile_steps or args.projection_probe) and not args.train:
        p.error("--profile-steps and --projection-probe measure training: add --train")
    if args.profile_steps < 0 or args.projection_probe < 0:
        p.error("--profile-steps and --projection-probe take a count of steps")
    return args


def _variant(args: argparse.Namespace) -> object:
    """Return the router config for an untrained start (None: the encoder's default)."""
    from dataclasses import replace

    from condsearch.model.csr.context import CONTEXT, CONTEXT_DEFAULT
    from condsearch.model.csr.router import PRESETS

    name = args.variant or (CONTEXT if args.train or args.weights_from else None)
    if name == CONTEXT:
        if args.router_layer is not None or args.hyper_rank is not None:
            raise CondsearchError("--router-layer and --hyper-rank apply to the paper/extended router; use --context-k")
        return replace(CONTEXT_DEFAULT, k=args.context_k) if args.context_k else CONTEXT_DEFAULT
    if args.context_k is not None:
        raise CondsearchError("--context-k applies to the context router (--variant context)")
    if name is None and args.router_layer is None and args.hyper_rank is None:
        return None
    config = PRESETS[name or "extended"]
    if args.router_layer is not None:
        config = replace(config, layer=args.router_layer)
    if args.hyper_rank is not None:
        config = replace(config, hyper_rank=args.hyper_rank)
    return config


def _router_spec(args: argparse.Namespace) -> str:
    if args.router != "auto":
        return str(args.router)
    if args.smoke or args.train or args.weights_from:
        return "none"
    return str(AUTO_ROUTER) if AUTO_ROUTER.is_dir() else "none"


def _link_graph(args: argparse.Namespace, router: str) -> bool:
    """Return whether entities are read with SimKGC's link-graph texts: as asked, else as the
    router folder (its router.json) or the checkpoint (--weights-from, --resume) was trained."""
    from condsearch.base.artifact_files import read_json
    from condsearch.model.artifacts.routers import read_router_config
    from condsearch.train.checkpoint import STATE_FILE

    if args.link_graph is not None:
        return bool(args.link_graph)
    run = args.weights_from or (args.checkpoint_dir if args.resume else None)
    if run is not None and (Path(run) / STATE_FILE).is_file():
        config = read_json(Path(run) / STATE_FILE, "checkpoint").get("config") or {}
        return bool(config.get("link_graph", False))
    if router != "none":
        return bool(read_router_config(Path(router)).get("link_graph", False))
    return False


def _meta(encoder: Any, data_dir: Path, backbone: str, config: object, linked: bool = False) -> dict[str, object]:
    """Return what a saved WN18RR router records of its making."""
    return {
        "link_graph": linked,
        "model_id": encoder.model_id,
        "model_revision": encoder.revision,
        "task": "link prediction (SimKGC protocol)",
        "data": Path(data_dir).name,
        "max_length": encoder.max_length,
        "backbone": backbone,
        "config": config,
    }


def _router_label(args: argparse.Namespace, encoder: Any, checkpoint: dict[str, Any] | None) -> str:
    if args.train:
        return "trained here (--train)"
    if checkpoint is not None:
        return f"checkpoint {checkpoint['checkpoint']}, step {checkpoint['best_dev'].get('step')}" + (
            ", as saved" if checkpoint["saved"] else ", exact"
        )
    return str(encoder.router_name)


def _from_checkpoint(args: argparse.Namespace, encoder: Any, base: Any, data_dir: Path) -> tuple[Any, dict[str, Any]]:
    """Give the towers a whole-backbone run's best dev weights (--weights-from) and, with --save, save
    them as the committed artifact is saved, so that what is scored next is the saved router.
    Return the candidate tower and what to report of the checkpoint."""
    from benchmarks._lib.kgclib.encoding import save_towers, tail_tower
    from benchmarks._lib.kgclib.training import load_best_weights

    if args.train:
        raise CondsearchError("--weights-from scores a run's checkpoint; to train on, use --checkpoint-dir --resume")
    if base is None or args.frozen_lower:
        raise CondsearchError("--weights-from reads a whole-backbone context router's checkpoint")
    tail = tail_tower(encoder.router) if args.towers == 2 else None
    row, config = load_best_weights(args.weights_from, encoder.router, tail)
    info: dict[str, Any] = {"checkpoint": str(args.weights_from), "best_dev": row, "saved": args.save is not None}
    if args.save is not None:
        linked = isinstance(config, dict) and bool(config.get("link_graph"))
        meta = {**_meta(encoder, data_dir, "whole backbone", config, linked), "best_dev": row}
        info["checksum"] = save_towers(encoder, tail, base, args.save, meta)
        _log(f"saved the checkpoint's step-{row.get('step')} weights to {args.save}; scoring them as saved")
    return tail, info


def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    from benchmarks._lib.kgclib.data import known_answers, link_graph, linked_texts, read_kg, write_synthetic_kg
    from benchmarks._lib.kgclib.encoding import (
        entity_tokens,
        evaluate_link_prediction,
        load_entity_states,
        load_tail_tower,
        project_towers,
        save_towers,
        tail_tower,
    )
    from benchmarks._lib.kgclib.projection_probe import projection_probe
    from benchmarks._lib.kgclib.step_profile import profile_steps
    from benchmarks._lib.kgclib.training import KgcTrainConfig, train_kgc
    from condsearch.model.csr import load_csr_encoder
    from condsearch.model.csr.context import ContextRouter

    if args.threads:
        torch.set_num_threads(args.threads)
    data_dir = args.data_dir
    if args.smoke and data_dir is None:
        data_dir = write_synthetic_kg(tmp / "kg")
    if data_dir is None:
        raise CondsearchError("--data-dir is required (or --smoke for synthetic data)")
    data = read_kg(data_dir)
    _log(
        f"{data.n_entities} entities, {data.n_relations} relations, "
        + ", ".join(f"{k} {len(v)}" for k, v in data.splits.items())
    )
    router = _router_spec(args)
    cache_dir = args.cache_dir or (tmp / "cache" if args.smoke else None)
    encoder = load_csr_encoder(
        args.model,
        router=router,
        variant=_variant(args) if router == "none" else None,
        max_length=args.max_length,
        device=args.device,
        cache_dir=cache_dir,
    )
    context = isinstance(encoder.router, ContextRouter)
    whole = context and not args.frozen_lower
    base = None
    if context:
        from condsearch.model.csr.context_weights import base_weights

        encoder.router.trainable = "all" if whole else "top"
        base = base_weights(encoder.source.location)
    timing: dict[str, float] = {}
    start = time.perf_counter()
    linked = linked_texts(data) if _link_graph(args, router) else None
    if linked is not None and args.train and not whole:
        raise CondsearchError("--link-graph trains the whole backbone (not with --frozen-lower)")
    texts = data.entity_texts if linked is None else linked.texts()
    if whole:  # every tower runs its own lower layers: the entities go in as token ids
        entities: Any = entity_tokens(encoder, texts)
    else:
        entities = load_entity_states(encoder, texts, progress=not args.smoke)
    timing["entity_states_seconds"] = round(time.perf_counter() - start, 1)
    answers = known_answers(data.splits.values(), data.n_relations)
    tail = load_tail_tower(encoder.router, Path(router), base) if router != "none" else None
    checkpoint = None
    if args.weights_from is not None:
        tail, checkpoint = _from_checkpoint(args, encoder, base, data_dir)
    training = None
    if args.train:
        epochs, batch, max_examples, lr = args.epochs, args.batch_size, args.max_examples, args.lr
        if args.smoke:  # a few steps, at a rate that moves a tiny model within them
            epochs, batch, max_examples, lr = 2, 16, 48, 1e-3
        config = KgcTrainConfig(
            epochs=epochs,
            batch_size=batch,
            lr=lr,
            max_examples=max_examples,
            bf16=args.bf16,
            checkpoint_every=args.checkpoint_every,
            seed=args.seed,
            project_every=args.project_every,
            freeze_token_table=args.freeze_token_table,
            pre_batch=args.pre_batch,
        )
        # the smoke chooses on training triples: a tiny random model learns those within a few steps
        dev = data.splits["train" if args.smoke else "dev"][: args.max_dev]
        if args.towers == 2 and tail is None:
            tail = tail_tower(encoder.router)
        backbone = "whole backbone" if whole else "layers above the state cache"
        if args.profile_steps:
            _log(f"profiling {args.profile_steps} steps ({args.towers} tower(s), {backbone}): {asdict(config)}")
            return {
                "profile": profile_steps(
                    encoder,
                    entities,
                    data,
                    config,
                    tail,
                    args.profile_steps,
                    [int(c) for c in args.profile_chunks.split(",")],
                ),
                **run_info(str(encoder.device)),
            }
        if args.projection_probe:
            if base is None or not whole:
                raise CondsearchError("--projection-probe reads a whole-backbone context router")
            _log(f"training {args.projection_probe} steps without projecting: {asdict(config)}")
            probe = projection_probe(encoder, entities, data, config, tail, base, args.projection_probe, linked)
            return {"projection_probe": probe, **run_info(str(encoder.device))}
        _log(f"training ({args.towers} tower(s), {backbone}): {asdict(config)}; choosing on {len(dev)} dev triples")
        meta = _meta(encoder, data_dir, backbone, asdict(config), linked is not None)

        def dev_scores() -> dict[str, float]:
            out = evaluate_link_prediction(encoder, entities, data, dev, answers, k=args.k, tail=tail)
            _log(
                f"dev MRR {out['mrr']:.2f}, Hit@1 {out['hit@1']:.2f}, Hit@10 {out['hit@10']:.2f}, "
                f"sensitivity {out['condition_sensitivity']:.4f}"
            )
            return {k: v for k, v in out.items() if isinstance(v, float)}  # type: ignore[misc]

        def progress(step: int, total: int, loss: float) -> None:
            if step % 10 == 0 or step == total:
                _log(f"step {step}/{total} loss {loss:.4f} ({time.perf_counter() - start:.0f}s)")

        def save_best(row: dict[str, float]) -> None:
            if args.save is not None:  # training goes on with its exact weights, not the saved low-rank ones
                save_towers(encoder, tail, base, args.save, {**meta, "best_dev": row}, keep_weights=True)
                _log(f"saved the best router so far (step {row['step']:.0f}, dev MRR {row['dev']:.2f}) to {args.save}")

        start = time.perf_counter()
        history = train_kgc(
            encoder,
            entities,
            data,
            config,
            evaluate=dev_scores,
            eval_every=args.eval_every,
            tail=tail,
            on_step=progress,
            checkpoint_dir=args.checkpoint_dir,
            resume=args.resume,
            on_best=save_best,
            project=(lambda: project_towers(encoder, tail, base)) if whole and args.project_every else None,
            linked=linked,
        )
        seconds = time.perf_counter() - start
        best = max(history, key=lambda r: r.get("dev", -1.0))
        training = {
            "config": asdict(config),
            "backbone": backbone,
            "seconds": round(seconds, 1),
            "dev_triples": len(dev),
            "best_step": best["step"],
            "dev_mrr_best": best.get("dev"),
            "dev_mrr_start": history[0].get("dev"),
            "dev_condition_sensitivity_start": history[0].get("dev_condition_sensitivity"),
            "dev_condition_sensitivity_best": best.get("dev_condition_sensitivity"),
            "towers": args.towers,
            "router": encoder.router.config.to_dict(),
            "history": history,
        }
        if args.save and best["step"] == 0:
            _log(f"not saving: no checkpoint beat the start on dev (MRR {best.get('dev'):.2f})")
        elif args.save:
            training["checksum"] = save_towers(encoder, tail, base, args.save, {**meta, "training": training})
            _log(f"saved the router to {args.save}; what follows scores the weights as saved")
    triples = data.splits[args.split][: args.max_test]
    graph = link_graph(data.splits["train"], data.n_entities) if args.rerank else None
    _log(f"ranking {len(triples)} {args.split} triples in both directions" + (" with re-ranking" if graph else ""))
    start = time.perf_counter()
    result = evaluate_link_prediction(
        encoder, entities, data, triples, answers, rerank_graph=graph, k=args.k, tail=tail
    )
    timing["evaluate_seconds"] = round(time.perf_counter() - start, 1)
    result["config"] = {
        "data": str(data_dir) if not args.smoke else "synthetic",
        "split": args.split,
        "triples": len(triples),
        "max_test": args.max_test,
        "model": encoder.model_id,
        "model_revision": encoder.revision,
        "router": _router_label(args, encoder, checkpoint),
        "router_checksum": (training or checkpoint or {}).get("checksum")
        if args.train or checkpoint
        else encoder.router_checksum,
        "router_layer": encoder.router.layer,
        "router_variant": encoder.router.config.variant,
        "router_label": encoder.router.config.describe(),
        "backbone_trained": "whole" if whole else "above the state cache",
        "towers": 2 if tail is not None else 1,
        "max_length": encoder.max_length,
        "rerank": bool(args.rerank),
        "link_graph": linked is not None,
        "candidates": data.n_entities,
        "index": "FAISS Flat (inner product on unit vectors)",
        "filtered": "train+dev+test answers removed",
        "smoke": args.smoke,
        **run_info(str(encoder.device)),
    }
    result["timing"] = timing
    if training is not None:
        result["training"] = training
    if checkpoint is not None:
        result["checkpoint"] = checkpoint
    return result


def markdown(result: dict[str, object]) -> str:
    config = result["config"]
    assert isinstance(config, dict)
    label = "router " + str(config["router"]).split("/")[-1] + (", re-ranked" if config["rerank"] else "")
    label += ", link-graph texts" if config.get("link_graph") else ""
    lines = [
        f"KGC ({config['split']}, {config['triples']} triples) — {config['model']}, {label}",
        "",
        "| direction | n | MRR | Hit@1 | Hit@3 | Hit@10 | MR |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("forward", "backward"):
        m = result[name]
        assert isinstance(m, dict)
        lines.append(
            f"| {name} | {m['n']} | {m['mrr']:.2f} | {m['hit@1']:.2f} | {m['hit@3']:.2f} | {m['hit@10']:.2f} | "
            f"{m['mr']:.1f} |"
        )
    r = result
    lines.append(
        f"| **average** | {r['n']} | **{r['mrr']:.2f}** | {r['hit@1']:.2f} | {r['hit@3']:.2f} | "
        f"{r['hit@10']:.2f} | {r['mr']:.1f} |"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_transformers()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            result = run(args, Path(tmp))
        except CondsearchError as exc:
            print(f"kgc.py: error: {first_line(exc)}", file=sys.stderr)
            return 1
    if "profile" in result:  # --profile-steps: the timing alone
        prof = result["profile"]
        assert isinstance(prof, dict)
        rows = [
            f"| {name} | {v['seconds_per_step_median']} | {v['examples_per_second']} | {v['epoch_hours']} |"
            for name, v in prof["settings"].items()
        ]
        table = "| training step | s / step (median) | examples / s | hours / epoch |\n|---|---:|---:|---:|\n"
        write_outputs(result, table + "\n".join(rows) + "\n", args.json_out, args.md_out)
        return 0
    if "projection_probe" in result:  # --projection-probe: the norms alone
        probe = result["projection_probe"]
        assert isinstance(probe, dict)
        parts = probe["norms"]
        table = "| part | norm |\n|---|---:|\n" + "".join(f"| {k} | {v} |\n" for k, v in parts.items())
        write_outputs(result, table + f"\nlost / update: {probe['lost_over_update']}\n", args.json_out, args.md_out)
        return 0
    write_outputs(result, markdown(result), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
