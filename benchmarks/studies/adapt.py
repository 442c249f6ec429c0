#!/usr/bin/env python3
"""`condsearch adapt` on every labelled source, three ways (issue 57): what adapting buys, and where.

For each source of ``build/anytext/sources.json`` (the 7 of issue 39; never the reserved corpora):

- ``rows``: adapt on the source's labelled columns, score the rows kept aside (``--holdout``);
- ``values``: the same, with two whole values of the first column held besides (all their rows,
  never trained on); scored on the held rows under that column, with only those values' rows as
  queries: texts whose label no training pair ever named;
- ``conditions``: adapt on the first column alone, score every other column on the held rows:
  conditions the adapted router never trained on (what an on-demand condition gets after adapting).

Each row of the table has plain MiniLM and the start router (the shipped one) beside the adapted
router, on the same held rows, and the adapted router's C-STS dev Spearman when ``--csts-dev``
is given. Each adapt is one call of :func:`condsearch.train.adapt.adapt_router`, as the command makes it.

    python -m benchmarks.studies.adapt --ways rows,values,conditions \\
        --csts-dev ../shared/data/csts-reannotated/dev.csv --json-out benchmarks/studies/results/adapt.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks._lib.common import exit_code, log, quiet_transformers, run_info, write_outputs
from benchmarks.studies.heldout import read_sources, smoke_sources
from condsearch.base.artifact_files import ADAPT_REPORT
from condsearch.errors import CorpusError
from condsearch.train.adapt import AdaptConfig
from condsearch.train.pairs import LabelSpec

WAYS = ("rows", "values", "conditions")


def held_value_choice(values: list[str | None], seed: int, n: int = 2) -> list[str]:
    """Return n values of a column to hold out whole: seeded among those neither rarest nor most common."""
    counts: dict[str, int] = {}
    for v in values:
        if v is not None:
            counts[v] = counts.get(v, 0) + 1
    ranked = sorted(counts, key=lambda v: (-counts[v], v))
    middle = ranked[1:-1] if len(ranked) > n + 2 else ranked[1:]  # keep the most common value for training
    n = max(1, min(n, len(ranked) - 2))  # two values at least are left to train on
    rng = np.random.default_rng(seed)
    return sorted(rng.choice(middle, size=min(n, len(middle)), replace=False).tolist())


def run_source(
    source: dict[str, object], way: str, args: argparse.Namespace, config: AdaptConfig
) -> dict[str, object] | None:
    """Adapt on one source one way; return its row of the table (None: the way does not apply)."""
    from condsearch.train.adapt import adapt_router
    from condsearch.train.pairs_files import read_labelled

    name = str(source["name"])
    conditions: dict[str, list[str]] = source["conditions"]  # type: ignore[assignment]
    specs = [LabelSpec(c, tuple(p)) for c, p in conditions.items()]
    table = Path(str(source["table"]))
    out = args.out_dir / f"{way}-{name}"
    kwargs: dict[str, object] = {}
    if way == "conditions":
        if len(specs) < 2:
            return None
        kwargs["score_only"] = specs[1:]
        specs = specs[:1]
    if way == "values":
        data = read_labelled(table, [specs[0].column])
        kwargs["held_values"] = {specs[0].column: held_value_choice(data.labels[specs[0].column], config.seed)}
    started = time.monotonic()
    if args.from_reports:  # the table of runs already made (their report.json), nothing trained
        report = json.loads((out / ADAPT_REPORT).read_text(encoding="utf-8"))
    else:
        report = adapt_router(
            table,
            specs,
            out,
            config,
            csts_dev=args.csts_dev,
            model=args.model,
            router=args.router,
            restart=True,
            say=lambda line: log("adapt", f"{name}/{way}: {line}"),
            **kwargs,  # type: ignore[arg-type]
        )
    held: dict[str, dict[str, float]] = report["held_p10"]  # type: ignore[assignment]
    if way == "values":
        column = specs[0].column
        held = {column: held[column]}
    elif way == "conditions":
        held = {c: v for c, v in held.items() if c != specs[0].column}
    mean = {k: float(np.mean([v[k] for v in held.values()])) for k in ("plain", "start_router", "adapted")}
    return {
        "source": name,
        "way": way,
        "trained_on": [s.column for s in specs],
        "held_values": report.get("held_values"),
        "columns": held,
        "mean": mean,
        "vs_plain": mean["adapted"] / mean["plain"] - 1,
        "columns_below_plain": sum(v["adapted"] < v["plain"] for v in held.values()),
        "alpha": report["alpha"],
        "validation_p10_by_alpha": report["validation_p10_by_alpha"],
        "validation_p10_plain": report["validation_p10_plain"],
        "pairs": report["pairs"],
        "rows": report["rows"],
        "train_seconds": report["train_seconds"],
        "seconds": report.get("seconds") if args.from_reports else round(time.monotonic() - started, 1),
        "csts_dev": report.get("csts_dev_spearman"),
    }


def table(rows: list[dict[str, object]]) -> str:
    """Return markdown: one line per (way, source), the mean p@10 of its scored columns."""
    lines = [
        "| way | source | scored columns | plain | shipped router | adapted | vs plain | columns below plain | α "
        "| C-STS dev |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m: dict[str, float] = r["mean"]  # type: ignore[assignment]
        cols: dict[str, object] = r["columns"]  # type: ignore[assignment]
        csts = f"{r['csts_dev']:.2f}" if isinstance(r["csts_dev"], float) else "—"
        lines.append(
            f"| {r['way']} | {r['source']} | {', '.join(cols)} | {m['plain']:.3f} | {m['start_router']:.3f} | "
            f"{m['adapted']:.3f} | {r['vs_plain']:+.1%} | {r['columns_below_plain']} | {r['alpha']:g} | {csts} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sources", type=Path, default=Path("build/anytext/sources.json"), help="sources file")
    p.add_argument("--only", default=None, help="comma-separated source names (default all)")
    p.add_argument("--ways", default="rows", help=f"comma-separated, of {', '.join(WAYS)}")
    p.add_argument("--columns", default=None, help="source=col1+col2,...: the columns to use (default all)")
    p.add_argument("--out-dir", type=Path, default=Path("build/adapt-runs/bench"), help="adapted routers go here")
    p.add_argument("--csts-dev", type=Path, default=None, help="C-STS dev CSV: each adapted router's Spearman")
    p.add_argument("--model", default=None, help="model (default: the default model)")
    p.add_argument("--router", default=None, help="router to start from (default: the shipped one)")
    for field, kind in (
        ("n_pairs", int),
        ("epochs", int),
        ("lr", float),
        ("contrast_weight", float),
        ("distill_weight", float),
        ("replay_weight", float),
        ("anchor", str),
        ("wise_keep", float),
        ("train_backbone", str),
        ("report_rows", int),
        ("validation_rows", int),
        ("holdout", float),
        ("seed", int),
    ):
        p.add_argument("--" + field.replace("_", "-"), type=kind, default=getattr(AdaptConfig(), field))
    p.add_argument(
        "--fill-plain",
        action=argparse.BooleanOptionalAction,
        default=AdaptConfig().fill_plain,
        help="fill what contrast pairs leave with alike/unlike pairs (--no-fill-plain: contrast pairs only)",
    )
    p.add_argument(
        "--from-reports", action="store_true", help="train nothing: build the table from --out-dir's report.json files"
    )
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="a tiny made-up table and a tiny model (--model)")
    args = p.parse_args(argv)
    quiet_transformers()
    if args.smoke:
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix="adapt-smoke-"))
        args.sources, args.out_dir = smoke_sources(tmp), tmp / "runs"
        args.n_pairs, args.report_rows, args.validation_rows, args.router = 40, 72, 72, args.router or "none"
        args.epochs, args.ways = 1, ",".join(WAYS)
    elif not args.sources.is_file():
        raise CorpusError(
            f"{args.sources}: no sources file (build it with python -m benchmarks.studies.anytext.build_data)"
        )
    keep = {
        f: getattr(args, f)
        for f in (
            "n_pairs",
            "fill_plain",
            "epochs",
            "lr",
            "contrast_weight",
            "distill_weight",
            "replay_weight",
            "anchor",
            "wise_keep",
            "train_backbone",
            "report_rows",
            "validation_rows",
            "holdout",
            "seed",
        )
    }
    config = AdaptConfig(**keep)
    only = {s.strip() for s in args.only.split(",")} if args.only else None
    chosen = dict(item.split("=", 1) for item in args.columns.split(",")) if args.columns else {}
    rows = []
    for way in [w.strip() for w in args.ways.split(",") if w.strip()]:
        if way not in WAYS:
            raise SystemExit(f"unknown way {way!r}: {', '.join(WAYS)}")
        sources = read_sources(args.sources)
        if only is not None:  # in the order --only names them
            order = [s.strip() for s in args.only.split(",")]
            sources = sorted((s for s in sources if s["name"] in only), key=lambda s: order.index(str(s["name"])))
        for source in sources:
            if source["name"] in chosen:
                wanted = chosen[str(source["name"])].split("+")
                source = {**source, "conditions": {c: v for c, v in source["conditions"].items() if c in wanted}}  # type: ignore[union-attr]
            if args.from_reports and not (args.out_dir / f"{way}-{source['name']}" / ADAPT_REPORT).is_file():
                continue
            row = run_source(source, way, args, config)
            if row is not None:
                log(
                    "adapt",
                    f"{row['source']}/{way}: {row['mean']} ({row['vs_plain']:+.1%}), {row['train_seconds']} s to train",
                )
                rows.append(row)
    result = {
        "benchmark": "adapt",
        "smoke": args.smoke,
        "config": keep,
        "sources": str(args.sources),
        "rows": rows,
        "run": run_info("cpu"),  # the CPU model and its instruction sets: figures differ between kinds
    }
    write_outputs(result, table(rows), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(exit_code(main, "adapt.py"))
