"""WN18RR router designs on a GPU within a fixed time: the run behind benchmarks/README's
"KGC on an H100" table.

What benchmarks/paper/kgc.py --train does (same encoder, loss, training loop and checkpoint rule),
for several router designs in one process, each trained for a wall-clock budget and scored on
dev with exact dense ranking (the full score matrix, no FAISS: the ranks equal FAISS Flat's).
The best design's weights are saved. Use it where FAISS is not installed or a lease is short:

    python -m benchmarks.paper.kgc_gpu_sweep --data-dir ../shared/data/wn18rr --out-dir OUT \\
        --designs paper:-1:2,extended:-1:2,extended:-2:1 --budget 100 --final-budget 180

A design is ``variant:first routed layer:towers``. The chosen weights are then scored on test
with benchmarks/paper/kgc.py (FAISS) like any router folder.

``--smoke`` runs the same sweep on the CPU in seconds: a synthetic 60-entity graph (scored on its
training triples, as kgc.py's smoke does), two designs at batch 16 for a one-second budget each, a
final run, and the weights saved into a temporary folder unless --out-dir is given (give --model a
tiny BERT, or it uses the bundled MiniLM).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import types
from dataclasses import asdict, replace
from pathlib import Path

import torch

if "faiss" not in sys.modules:
    try:
        import faiss  # noqa: F401
    except ImportError:  # only condsearch.base.faiss_indexes's import needs it here; ranking below is dense
        sys.modules["faiss"] = types.ModuleType("faiss")

from benchmarks._lib.common import exit_code  # noqa: E402
from benchmarks._lib.kgclib.data import known_answers, read_kg, write_synthetic_kg  # noqa: E402
from benchmarks._lib.kgclib.encoding import (  # noqa: E402
    TAIL_FOLDER,
    direction_queries,
    entity_vectors,
    load_entity_states,
    query_vectors,
    relation_sensitivity,
    tail_tower,
)
from benchmarks._lib.kgclib.ranking import average_metrics, dense_filtered_ranks, query_filters, rank_metrics  # noqa: E402
from benchmarks._lib.kgclib.training import KgcTrainConfig, train_kgc  # noqa: E402
from condsearch.model.csr import load_csr_encoder  # noqa: E402
from condsearch.model.csr.router import PRESETS  # noqa: E402
from condsearch.model.csr.weights import save_router  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def dense_eval(encoder, states, data, triples, answers, tail) -> dict[str, float]:  # noqa: ANN001
    """Filtered MRR/Hit@k over all entities from the full score matrix, both directions."""
    cands = torch.from_numpy(entity_vectors(encoder, states, tail=tail)).to(encoder.device)
    out: dict[str, object] = {}
    for name, forward in (("forward", True), ("backward", False)):
        heads, rels, golds = direction_queries(triples, data.n_relations, forward)
        q = torch.from_numpy(query_vectors(encoder, states, heads, rels, data.conditions)).to(encoder.device)
        scores = (q @ cands.T).float().cpu().numpy()
        out[name] = rank_metrics(dense_filtered_ranks(scores, golds, query_filters(heads, rels, golds, answers)))
    out.update(average_metrics(out["forward"], out["backward"]))  # type: ignore[arg-type]
    out["condition_sensitivity"] = relation_sensitivity(encoder, states, data, triples)
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float))}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=None, help="WN18RR folder (required but in --smoke)")
    p.add_argument("--model", default=None)
    p.add_argument("--out-dir", type=Path, default=None, help="sweep.json and router/ (required but in --smoke)")
    p.add_argument("--cache-dir", type=Path, default=None)
    p.add_argument("--designs", default="paper:-1:2,extended:-1:2")
    p.add_argument("--budget", type=float, default=100.0, help="seconds of training per design")
    p.add_argument("--final-budget", type=float, default=0.0, help="then train the best design this long, afresh")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max-dev", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=40)
    p.add_argument("--device", default=None, help="[default: cuda; cpu in --smoke]")
    p.add_argument("--model-fp32", action="store_true", help="cast a half-precision model folder to float32")
    p.add_argument(
        "--smoke", action="store_true", help="synthetic 60-entity graph, two designs for a second each, on the CPU"
    )
    args = p.parse_args(argv)
    if args.smoke:  # a rate and batch that move a tiny model within a few steps, as kgc.py's smoke
        args.budget, args.final_budget, args.batch_size, args.lr = 1.0, 1.0, 16, 1e-3
        args.max_dev, args.eval_every = 24, 2
        args.designs = "paper:-1:2,extended:-1:1" if args.designs == p.get_default("designs") else args.designs
    elif args.data_dir is None or args.out_dir is None:
        p.error("--data-dir and --out-dir are required (or --smoke)")
    args.device = args.device or ("cpu" if args.smoke else "cuda")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kgc-gpu-sweep-") as tmp:
        if args.smoke:
            args.data_dir = args.data_dir or write_synthetic_kg(Path(tmp) / "kg")
            args.out_dir = args.out_dir or Path(tmp) / "out"
            args.cache_dir = args.cache_dir or Path(tmp) / "cache"
        return sweep(args)


def sweep(args: argparse.Namespace) -> int:
    args.out_dir.mkdir(parents=True, exist_ok=True)
    data = read_kg(args.data_dir)
    answers = known_answers(data.splits.values(), data.n_relations)
    # the smoke chooses on training triples: a tiny random model learns those within a few steps
    dev = data.splits["train" if args.smoke else "dev"][: args.max_dev]
    steps_per_epoch = math.ceil(2 * len(data.splits["train"]) / args.batch_size)
    results: list[dict[str, object]] = []
    states_by_layer: dict[int, list] = {}

    def write() -> None:
        clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
        (args.out_dir / "sweep.json").write_text(json.dumps(clean, indent=1))

    def run(spec: str, budget: float) -> dict[str, object]:
        variant, layer, towers = spec.split(":")
        config = replace(PRESETS[variant], layer=int(layer))  # type: ignore[index]
        encoder = load_csr_encoder(
            args.model, router="none", variant=config, max_length=50, device=args.device, cache_dir=args.cache_dir
        )
        if args.model_fp32:
            encoder.router.float()
        t0 = time.perf_counter()
        if encoder.router.layer not in states_by_layer:
            states_by_layer[encoder.router.layer] = load_entity_states(encoder, data.entity_texts, batch_size=512)
        states = states_by_layer[encoder.router.layer]
        log(f"{spec}: states ready in {time.perf_counter() - t0:.0f}s")
        tail = tail_tower(encoder.router) if towers == "2" else None
        # a short probe sets the number of examples that fit the budget
        probe = KgcTrainConfig(epochs=1, batch_size=args.batch_size, lr=args.lr, max_examples=3 * args.batch_size)
        t0 = time.perf_counter()
        train_kgc(encoder, states, data, replace(probe, warmup_steps=0, lr=0.0), tail=tail)
        per_step = (time.perf_counter() - t0) / 3
        steps = max(1, int(budget / per_step))
        epochs = max(1, math.ceil(steps / steps_per_epoch))
        max_examples = min(steps, steps_per_epoch) * args.batch_size
        cfg = KgcTrainConfig(epochs=epochs, batch_size=args.batch_size, lr=args.lr, max_examples=max_examples)
        log(f"{spec}: {per_step:.2f}s a step -> {steps} steps ({epochs} epoch(s) of {max_examples} examples)")

        def evaluate() -> dict[str, float]:
            out = dense_eval(encoder, states, data, dev, answers, tail)
            log(f"{spec}: dev MRR {out['mrr']:.2f} H@1 {out['hit@1']:.2f} sens {out['condition_sensitivity']:.4f}")
            return out

        t0 = time.perf_counter()
        history = train_kgc(encoder, states, data, cfg, evaluate=evaluate, eval_every=args.eval_every, tail=tail)
        seconds = time.perf_counter() - t0
        best = max(history, key=lambda r: r.get("dev", -1.0))
        row = {
            "design": spec,
            "router": encoder.router.config.to_dict(),
            "label": encoder.router.config.describe(),
            "towers": int(towers),
            "config": asdict(cfg),
            "seconds_a_step": round(per_step, 3),
            "train_seconds": round(seconds, 1),
            "dev_triples": len(dev),
            "dev_start": history[0],
            "dev_best": best,
            "history": history,
            "device": torch.cuda.get_device_name(0) if encoder.device.type == "cuda" else "cpu",
        }
        results.append(row)
        write()
        row["_encoder"], row["_tail"] = encoder, tail
        return row

    rows = [run(spec, args.budget) for spec in args.designs.split(",")]
    best = max(rows, key=lambda r: r["dev_best"]["dev"])  # type: ignore[index]
    if args.final_budget > 0:
        best = run(str(best["design"]), args.final_budget)
        best["final"] = True
    encoder, tail = best["_encoder"], best["_tail"]
    write()
    if best["dev_best"]["step"] == 0:  # type: ignore[index]
        log("not saving: nothing beat the start on dev")
        return 0
    meta = {
        "model_id": "sentence-transformers/all-MiniLM-L6-v2",
        "task": "link prediction (SimKGC protocol)",
        "data": "synthetic" if args.smoke else args.data_dir.name,
        "max_length": 50,
        "training": {k: v for k, v in best.items() if not k.startswith("_")},
    }
    save_router(encoder.router, args.out_dir / "router", meta)
    if tail is not None:
        save_router(tail, args.out_dir / "router" / TAIL_FOLDER, {**meta, "role": "candidate tower"})
    log(f"saved {best['design']} to {args.out_dir / 'router'}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, "kgc_gpu_sweep.py"))
