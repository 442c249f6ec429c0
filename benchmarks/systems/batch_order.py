"""Batching by token count against batching by characters: padding and pairs/s of one encoder.

``Encoder.encode_pairs`` sorts the pairs it encodes longest first, so that each batch pads
little. A BERT-style encoder now sorts by token count (``TokenSorted``); characters, the cheap
proxy it used before, is the other arm. Both arms encode the same --n C-STS pairs (sentence1
under its condition) in batches of --batch-size, alternating within each repeat, after a
warm-up; the JSON gives each arm's median pairs/s, padded tokens per real token, and the ratio.

    python -m benchmarks.systems.batch_order --csv ../shared/data/csts-reannotated/dev.csv -n 1000 \\
        --json-out benchmarks/systems/results/batch_order_cpu.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks._lib.common import log, run_info, synthetic_csts, timing_config, write_outputs
from condsearch.corpus.csts import read_csts
from condsearch.model.encoders.base import Encoder, Pair
from condsearch.model.encoders.bert_inputs import token_lengths

ARMS = ("characters", "tokens")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", type=Path, help="C-STS CSV to draw the pairs from")
    parser.add_argument("-n", type=int, default=1000, help="pairs")
    parser.add_argument("--model", default=None, help="model id or folder (default all-MiniLM-L6-v2)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--md-out", type=Path)
    parser.add_argument("--smoke", action="store_true", help="a few synthetic pairs, one repeat")
    args = parser.parse_args(argv)
    if args.smoke:
        args.n, args.repeats, args.batch_size = min(args.n, 24), 1, 4
    elif args.csv is None:
        parser.error("--csv is required (or --smoke)")
    return args


def padding(lengths: Sequence[int], order: Sequence[int], batch_size: int) -> float:
    """Return padded tokens per real token when pairs run in this order, batch_size at a time."""
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    return padded / max(1, sum(lengths))


def sorter(encoder: Encoder, arm: str) -> Callable[[Sequence[Pair]], list[int]]:
    """Return the lengths an arm batches by: characters (the base class's) or the encoder's token counts."""
    if arm == "characters":
        return lambda pairs: Encoder.sort_lengths(encoder, pairs)
    return lambda pairs: token_lengths(encoder.tokenizer, pairs)  # type: ignore[attr-defined]


def run(args: argparse.Namespace) -> dict[str, object]:
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec, Runtime

    data = synthetic_csts(args.n) if args.smoke else read_csts(args.csv)
    pairs: list[Pair] = list(zip(data.condition, data.sentence1, strict=True))[: args.n]
    spec = EncoderSpec(args.model, runtime=Runtime(device=args.device, threads=args.threads))
    encoder = load_encoder(spec)
    tokens = token_lengths(encoder.tokenizer, pairs)  # type: ignore[attr-defined]
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for repeat in range(args.repeats + 1):  # the first round is a warm-up
        for arm in ARMS if repeat % 2 == 0 else ARMS[::-1]:
            encoder.sort_lengths = sorter(encoder, arm)  # type: ignore[method-assign]
            start = time.perf_counter()
            encoder.encode_pairs(pairs, batch_size=args.batch_size)
            if repeat:
                seconds[arm].append(time.perf_counter() - start)
    rows = {}
    for arm in ARMS:
        lengths = sorter(encoder, arm)(pairs)
        order = sorted(range(len(pairs)), key=lambda i: -lengths[i])
        median = statistics.median(seconds[arm])
        rows[arm] = {
            "seconds": [round(s, 4) for s in seconds[arm]],
            "pairs_per_s": round(len(pairs) / median, 1),
            "padded_per_real_token": round(padding(tokens, order, args.batch_size), 3),
        }
        log("batch-order", f"{arm}: {rows[arm]['pairs_per_s']} pairs/s, padding {rows[arm]['padded_per_real_token']}")
    return {
        "benchmark": "batch_order",
        "model": encoder.model_id,
        "n_pairs": len(pairs),
        "arms": rows,
        "tokens_over_characters": round(rows["tokens"]["pairs_per_s"] / rows["characters"]["pairs_per_s"], 3),
        "config": timing_config(args.batch_size, args.repeats, args.smoke),
        "run": run_info(args.device),
    }


def table(result: dict[str, object]) -> str:
    arms: dict[str, dict[str, object]] = result["arms"]  # type: ignore[assignment]
    lines = ["| batches formed by | pairs/s (median) | padded / real tokens |", "|---|---:|---:|"]
    lines += [f"| {arm} | {r['pairs_per_s']} | {r['padded_per_real_token']} |" for arm, r in arms.items()]
    return "\n".join(lines) + f"\n\ntokens / characters: {result['tokens_over_characters']}×\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    write_outputs(result, table(result), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
