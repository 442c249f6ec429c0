#!/usr/bin/env python3
"""What each interpolation weight of a saved ``condsearch adapt`` run costs and buys (issue 57).

The wise anchor chooses α on validation rows: ``θ₀ + α (θ₁ − θ₀)``, θ₀ the start router, θ₁ the
trained one. A saved run keeps the router at its chosen α only; every smaller α lies on the same
line, ``θ₀ + (α / α_saved) (θ_saved − θ₀)``. For each run folder (``report.json`` beside the
router) and each α asked, this re-weighs the routed layers, and scores precision@10 on the run's
held rows (the same split and plans as the run's own report) and C-STS dev. Nothing is chosen
here: the table shows which rule on the *validation* figures (in each report) would have kept
C-STS dev, and what it would have cost on the held rows.

    python -m benchmarks.studies.adapt_alpha build/adapt-runs/r2/rows-* --alphas 1,0.75,0.5,0.25 \\
        --csts-dev ../shared/data/csts-reannotated/dev.csv --json-out benchmarks/studies/results/adapt_alpha.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks._lib.common import exit_code, log, quiet_transformers, run_info, write_outputs
from benchmarks.studies.heldout import read_sources
from condsearch.base.artifact_files import ADAPT_REPORT
from condsearch.errors import CorpusError


def held_plans(report: dict[str, object], sources: Path) -> list[object]:
    """Rebuild the held rows' plans of a run from its table, labels and config (as adapt made them)."""
    from condsearch.train.adapt import AdaptConfig, _row_keys, split_rows
    from condsearch.train.adapt_score import plan_scoring
    from condsearch.train.pairs_files import read_labelled

    by_name = {Path(str(s["table"])).name: s for s in read_sources(sources)}
    source = by_name.get(str(report["table"]))
    if source is None:
        raise CorpusError(f"{report['table']}: not a table of {sources}")
    table = Path(str(source["table"]))
    labels: dict[str, list[str]] = report["labels"]  # type: ignore[assignment]
    scored: dict[str, list[str]] = report["scored_only"]  # type: ignore[assignment]
    columns = [*labels, *scored]
    config = AdaptConfig(**report["config"])  # type: ignore[arg-type]
    held_values = {c: set(v) for c, v in report.get("held_values", {}).items()}  # type: ignore[union-attr]
    data = read_labelled(table, columns)
    keys = _row_keys(table, "text", "id", None, data.texts)
    split = split_rows(keys, data.labels, config, held_values)
    conditions = {c: p[0] for c, p in {**labels, **scored}.items()}
    return plan_scoring(  # type: ignore[return-value]
        data.texts,
        data.labels,
        conditions,
        split.held,
        max_rows=config.report_rows,
        n_queries=config.queries,
        seed=config.seed,
        query_values=held_values,
    )


def reweigh(
    run: Path, alphas: list[float], sources: Path, csts_dev: Path | None, start_router: str | None = None
) -> dict[str, object]:
    """Score one saved run at each α: held precision@10 per column and C-STS dev.

    start_router: the router the run started from [default: the shipped one].
    """
    from condsearch.model.csr.context import CONTEXT
    from condsearch.model.csr.encoder import load_csr_encoder
    from condsearch.train.adapt import _interpolate, _trainable, csts_spearman
    from condsearch.train.adapt_score import mean, router_embed, score_plan
    from condsearch.train.router import INIT_ROUTER

    report = json.loads((run / ADAPT_REPORT).read_text(encoding="utf-8"))
    saved_alpha = float(report["alpha"])
    if saved_alpha <= 0:
        raise CorpusError(f"{run}: saved at α 0 (the start router): nothing to re-weigh")
    plans = held_plans(report, sources)
    scope = report["config"]["train_backbone"]
    start_enc = load_csr_encoder(None, router=start_router or INIT_ROUTER, variant=CONTEXT)
    start = {n: p.detach().clone() for n, p in _trainable(start_enc, scope).items()}
    del start_enc
    enc = load_csr_encoder(None, router=str(run))
    params = _trainable(enc, scope)
    saved = {n: p.detach().clone() for n, p in params.items()}
    end = {n: start[n] + (saved[n] - start[n]) / saved_alpha for n in saved}  # θ₁, the trained weights
    kept: dict[str, object] | None = {} if scope == "top" else None  # the layers below do not move
    rows = []
    for a in alphas:
        _interpolate(params, start, end, a)
        enc.refresh_identity()
        held = score_plan(plans, router_embed(enc, states=kept))  # type: ignore[arg-type]
        row: dict[str, object] = {"alpha": a, "held_p10": held, "held_mean": mean(held)}
        if csts_dev is not None:
            row["csts_dev"] = csts_spearman(enc, csts_dev)
        val = report["validation_p10_by_alpha"].get(f"{a:g}")
        row["validation_p10"] = val
        log("adapt_alpha", f"{run.name} α {a:g}: held {row['held_mean']:.3f}, C-STS dev {row.get('csts_dev')}")
        rows.append(row)
    plain = {c: v["plain"] for c, v in report["held_p10"].items()}
    return {
        "run": str(run),
        "table": report["table"],
        "saved_alpha": saved_alpha,
        "validation_p10_plain": report["validation_p10_plain"],
        "validation_p10_by_alpha": report["validation_p10_by_alpha"],
        "held_plain": plain,
        "held_plain_mean": mean(plain),
        "rows": rows,
    }


def table(runs: list[dict[str, object]]) -> str:
    lines = [
        "| run | α | validation p@10 (plain) | held p@10 (plain) | vs plain | C-STS dev |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        for row in r["rows"]:  # type: ignore[attr-defined]
            csts = f"{row['csts_dev']:.2f}" if row.get("csts_dev") is not None else "—"
            val, plain = (
                f"{x:.3f}" if x is not None else "—" for x in (row["validation_p10"], r["validation_p10_plain"])
            )
            lines.append(
                f"| {Path(str(r['run'])).name} | {row['alpha']:g} | {val} ({plain}) | "
                f"{row['held_mean']:.3f} ({r['held_plain_mean']:.3f}) | "
                f"{row['held_mean'] / r['held_plain_mean'] - 1:+.1%} | {csts} |"  # type: ignore[operator]
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", type=Path, help="adapt output folders (router + report.json)")
    p.add_argument("--sources", type=Path, default=Path("build/anytext/sources.json"), help="sources file")
    p.add_argument("--alphas", default="1,0.75,0.5,0.25", help="comma-separated interpolation weights")
    p.add_argument("--csts-dev", type=Path, default=None, help="C-STS dev CSV")
    p.add_argument("--router", default=None, help="the router the runs started from (default: the shipped one)")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="adapt a tiny made-up table, then re-weigh that run")
    args = p.parse_args(argv)
    quiet_transformers()
    if args.smoke:
        import tempfile

        from benchmarks.studies import adapt as adapt_study
        from benchmarks.studies.heldout import smoke_sources

        tmp = Path(tempfile.mkdtemp(prefix="adapt-alpha-smoke-"))
        args.sources, args.router = smoke_sources(tmp), "none"
        small = [
            "--anchor",
            "none",
            "--n-pairs",
            "40",
            "--report-rows",
            "72",
            "--validation-rows",
            "72",
            "--epochs",
            "1",
        ]
        adapt_study.main(["--sources", str(args.sources), "--out-dir", str(tmp / "runs"), "--router", "none", *small])
        args.runs = sorted(r.parent for r in (tmp / "runs").glob(f"rows-*/{ADAPT_REPORT}"))
    alphas = [float(a) for a in args.alphas.split(",") if a.strip()]
    if not args.runs:
        raise CorpusError("name at least one adapt run folder")
    runs = [reweigh(run, alphas, args.sources, args.csts_dev, args.router) for run in args.runs]
    result = {"benchmark": "adapt_alpha", "alphas": alphas, "runs": runs, "run": run_info("cpu")}
    write_outputs(result, table(runs), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(exit_code(main, "adapt_alpha.py"))
