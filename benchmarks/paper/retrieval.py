#!/usr/bin/env python3
r"""Conditional retrieval on C-STS dev: does the condition move a sentence's partner up the ranking?

C-STS judges each sentence pair twice, under two conditions; the one with the higher label is the
pair's *high* condition, the other its *low* one. Pairs judged exactly twice, under two different
conditions with different labels, are kept, and --pairs of them sampled (seeded). For each pair and
each of its two conditions, sentence1 is searched for among its partner sentence2 and --distractors
other dev sentences (a seeded sample of the dev sentences outside the pair, the same for both
conditions and both sides), query and candidates all encoded under that condition; then sentence2
among sentence1 and the same distractors. The partner's rank is 1 + the candidates scoring strictly
higher + half those tied with it. Reported per system:

- ``mrr_high`` / ``mrr_low``: the partner's mean reciprocal rank under the high / low condition;
- ``share_better_under_high``: the share of (pair, query side) whose partner ranks strictly better
  under the high condition than under the low one, ties counting half. A system blind to the
  condition scores exactly 0.5; one that follows it scores above.

Systems are benchmarks/studies/ood.py's: ``plain``, ``prefix``, ``case:PROFILE`` (a shipped profile name or
a profile/adapter folder), ``csr`` (the default router), ``csr:ROUTER`` (a router folder) and
``blend:B:SYSTEM``.

    python -m benchmarks.paper.retrieval --dev ../shared/data/csts-reannotated/dev.csv --pairs 100 \
        --distractors 50 --systems plain,prefix,case:full,csr --json-out benchmarks/paper/results/retrieval_dev.json
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from benchmarks._lib.common import compare_systems, log, quiet_transformers, synthetic_csts, write_outputs  # noqa: E402
from benchmarks.studies.ood import Embed, add_system_options, load_system  # noqa: E402
from condsearch.corpus.csts import CstsData, read_csts  # noqa: E402

#: (pairs, distractors) of a real run and of --smoke
SIZES = {"dev": (200, 100), "smoke": (8, 10)}
SYSTEMS = {
    "dev": "plain,prefix,case:full,csr",
    "smoke": "plain,prefix,case:full",
    "smoke_model": "plain,prefix,case:none",
}


class Pair(NamedTuple):
    """Two sentences judged under two conditions; ``high`` is the one with the higher label."""

    sentence1: str
    sentence2: str
    high: str
    low: str


def find_pairs(data: CstsData) -> list[Pair]:
    """Return the sentence pairs (in either order) judged exactly twice, under different conditions and labels."""
    rows: dict[frozenset[str], list[int]] = defaultdict(list)
    for i, (a, b) in enumerate(zip(data.sentence1, data.sentence2, strict=True)):
        rows[frozenset((a, b))].append(i)
    pairs = []
    for group in rows.values():
        if len(group) != 2:
            continue
        high, low = sorted(group, key=lambda r: -float(data.labels[r]))
        if data.labels[high] == data.labels[low] or data.condition[high] == data.condition[low]:
            continue
        pairs.append(Pair(data.sentence1[high], data.sentence2[high], data.condition[high], data.condition[low]))
    return pairs


def sample(
    pairs: Sequence[Pair], sentences: Sequence[str], n_pairs: int, n_distractors: int, seed: int
) -> tuple[list[Pair], list[list[str]]]:
    """Return n_pairs pairs (seeded, in their original order) and each one's n_distractors other sentences."""
    rng = np.random.default_rng(seed)
    chosen = [pairs[i] for i in sorted(rng.choice(len(pairs), size=n_pairs, replace=False).tolist())]
    pools = []
    for pair in chosen:
        # two spare draws cover the pair's own sentences, which are left out
        drawn = rng.choice(len(sentences), size=min(n_distractors + 2, len(sentences)), replace=False)
        pool = [sentences[i] for i in drawn.tolist() if sentences[i] not in (pair.sentence1, pair.sentence2)]
        pools.append(pool[:n_distractors])
    return chosen, pools


def partner_ranks(scores: np.ndarray) -> np.ndarray:
    """Return the partner's rank per query: (n_queries,) float64, 1 = best.

    scores: (n_queries, n_candidates), higher is better, the partner in column 0. A candidate tied
    with the partner counts half (the mean rank over the orders the tie allows).
    """
    partner, others = scores[:, :1], scores[:, 1:]
    return 1.0 + (others > partner).sum(axis=1) + 0.5 * (others == partner).sum(axis=1)


def share_better(ranks_high: np.ndarray, ranks_low: np.ndarray) -> float:
    """Return the share of queries ranking their partner strictly better under high than low, ties half."""
    return float(np.mean((ranks_high < ranks_low) + 0.5 * (ranks_high == ranks_low)))


def evaluate(pairs: Sequence[Pair], pools: Sequence[Sequence[str]], embed: Embed, conditional: bool) -> dict:
    """Return mrr_high, mrr_low, share_better_under_high and n (queries: two per pair) for one system.

    Each condition's sentences (its pairs' two sides and their pools) are encoded in one call; an
    unconditional system's once for all.
    """
    needed: dict[str, dict[str, None]] = defaultdict(dict)  # condition -> its texts, in first-seen order
    for pair, pool in zip(pairs, pools, strict=True):
        for condition in (pair.high, pair.low):
            needed[condition if conditional else ""].update(dict.fromkeys([pair.sentence1, pair.sentence2, *pool]))
    encoded: dict[str, tuple[dict[str, int], np.ndarray]] = {}
    for condition, texts in needed.items():
        order = list(texts)
        encoded[condition] = ({t: i for i, t in enumerate(order)}, np.asarray(embed(order, condition), np.float32))
    ranks: dict[str, list[np.ndarray]] = {"high": [], "low": []}
    for pair, pool in zip(pairs, pools, strict=True):
        for side, condition in (("high", pair.high), ("low", pair.low)):
            row, vectors = encoded[condition if conditional else ""]
            queries = vectors[[row[pair.sentence1], row[pair.sentence2]]]  # (2, d): each the other's partner
            partner = queries[0] @ queries[1]
            others = queries @ vectors[[row[t] for t in pool]].T  # (2, n_distractors)
            ranks[side].append(partner_ranks(np.column_stack([np.full(2, partner), others])))
    high, low = np.concatenate(ranks["high"]), np.concatenate(ranks["low"])
    return {
        "mrr_high": round(float(np.mean(1 / high)), 4),
        "mrr_low": round(float(np.mean(1 / low)), 4),
        "share_better_under_high": round(share_better(high, low), 4),
        "n": len(high),
    }


def table(results: dict[str, dict]) -> str:
    """Return the results as a markdown table."""
    lines = ["| system | MRR (high) | MRR (low) | better under high | n |", "|---|---:|---:|---:|---:|"]
    for system, r in results.items():
        lines.append(
            f"| {system} | {r['mrr_high']:.3f} | {r['mrr_low']:.3f} | {r['share_better_under_high']:.3f} | {r['n']} |"
        )
    lines.append("")
    lines.append(
        "(better under high: the share of queries whose partner ranks higher under the high condition; 0.5 = blind)"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dev", type=Path, default=None, help="C-STS CSV (required but in --smoke)")
    p.add_argument(
        "--systems",
        default=None,
        help=f"comma-separated system specs [default: {SYSTEMS['dev']}; --smoke: {SYSTEMS['smoke']}, "
        f"with --model: {SYSTEMS['smoke_model']}]",
    )
    p.add_argument("--pairs", type=int, default=None, help=f"sentence pairs (seeded) [default: {SIZES['dev'][0]}]")
    p.add_argument(
        "--distractors", type=int, default=None, help=f"other sentences per pair's pool [default: {SIZES['dev'][1]}]"
    )
    add_system_options(p)
    p.add_argument(
        "--smoke", action="store_true", help="synthetic C-STS rows, {} pairs, {} distractors".format(*SIZES["smoke"])
    )
    args = p.parse_args(argv)
    if args.smoke == (args.dev is not None):
        p.error("give --dev or --smoke (which makes its own rows)")
    mode = "smoke" if args.smoke else "dev"
    n_pairs = args.pairs if args.pairs is not None else SIZES[mode][0]
    n_distractors = args.distractors if args.distractors is not None else SIZES[mode][1]
    default_systems = SYSTEMS["smoke_model" if args.smoke and args.model else mode]  # shipped profiles fit MiniLM
    systems = [s.strip() for s in (args.systems or default_systems).split(",") if s.strip()]
    quiet_transformers()
    data = synthetic_csts(64) if args.smoke else read_csts(args.dev)
    pairs = find_pairs(data)
    sentences = list(dict.fromkeys(data.sentence1 + data.sentence2))
    if not 0 < n_pairs <= len(pairs):
        p.error(f"--pairs {n_pairs}: between 1 and the {len(pairs)} usable pairs")
    if not 0 < n_distractors <= len(sentences) - 2:
        p.error(f"--distractors {n_distractors}: between 1 and {len(sentences) - 2} (the other sentences)")
    chosen, pools = sample(pairs, sentences, n_pairs, n_distractors, args.seed)
    log("retrieval", f"{n_pairs} of {len(pairs)} pairs, {n_distractors} distractors, systems {', '.join(systems)}")

    def run(system: str) -> dict:
        embed, conditional = load_system(system, args.batch_size, args.cache_dir, args.model)
        return evaluate(chosen, pools, embed, conditional)

    results, record = compare_systems("retrieval", systems, run, log_results=True)
    result = {
        "benchmark": "retrieval",
        "data": "smoke" if args.smoke else str(args.dev),
        "pairs": n_pairs,
        "usable_pairs": len(pairs),
        "distractors": n_distractors,
        "seed": args.seed,
        **record,
    }
    write_outputs(result, table(results), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
