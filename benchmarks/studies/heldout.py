#!/usr/bin/env python3
"""Conditional retrieval on labelled text: does a condition help find texts that share a label?

Each source is a table of texts with one or more label columns (built by
``benchmarks/studies/anytext/build_data.py``, or any parquet, CSV or JSON lines file with a ``text``
column). A label column is searched under a condition that names it ("the subject field of the
definition" for a dictionary's field). A query is a text of the table; its own row is left out of
the ranking, and relevant are the corpus rows with the same value in that column. Reported per
system, source and condition:

- ``p10``: label precision@10, the share of the top 10 with the query's value;
- ``chance``: the same share for a random ranking (how common the queries' values are);
- ``top1`` / ``top10`` / ``spread``: the mean score at rank 1 and 10 and their gap.

A plain sentence encoder ignores the condition, so a model that conditions well should beat it
on every column: the condition names which of the text's aspects the neighbours must share.

Rows are split by a hash of their text into ``dev`` (half; choose on it) and ``report`` (the
other half; the quoted figures), so that choosing a recipe never sees the reported rows. The
corpus of one (source, condition) is a seeded sample of the split's rows that carry a value.

Systems are those of ``ood.py``: ``plain``, ``prefix``, ``case:PROFILE``, ``csr``,
``csr:ROUTER`` and ``blend:B:SYSTEM``.

    python -m benchmarks.studies.heldout --sources build/anytext/sources.json --split dev \
        --systems plain,prefix,case:full,csr --json-out benchmarks/studies/results/heldout_dev.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from benchmarks._lib.common import compare_systems, exit_code, log, quiet_transformers, write_outputs  # noqa: E402
from benchmarks.studies.ood import K, add_system_options, best_k, load_system  # noqa: E402
from condsearch.errors import CorpusError
from condsearch.metrics import label_hits

SPLITS = ("dev", "report")


class Column(NamedTuple):
    """One label column of a source, searched under one condition."""

    source: str
    column: str
    condition: str
    texts: list[str]
    values: list[str]


def split_of(text: str) -> str:
    """Return the split a text belongs to: a stable hash of the text, so every reader agrees."""
    return SPLITS[hashlib.sha256(text.encode("utf-8")).digest()[0] & 1]


def read_sources(path: Path) -> list[dict[str, object]]:
    """Read a sources file: benchmarks/studies/anytext's ``sources.json`` (``{"sources": {name: {"table",
    "conditions": {column: [condition, ...]}}}}``) or a list of ``{"name", "table", "conditions"}``.

    ``table`` is relative to the file's folder; the first condition of each column is the one searched.
    """
    spec = json.loads(path.read_text(encoding="utf-8"))
    sources = spec["sources"] if isinstance(spec, dict) else spec
    if isinstance(sources, dict):
        sources = [{"name": name, **source} for name, source in sources.items()]
    out = []
    for source in sources:
        if not source.get("conditions"):
            continue  # paraphrase pairs and the like: nothing to search under
        table = Path(str(source["table"]))
        out.append({**source, "table": table if table.is_absolute() else path.parent / table})
    return out


def read_columns(
    sources: Sequence[dict[str, object]], split: str, only: set[str] | None, min_rows: int = 0
) -> list[Column]:
    """Return every (source, label column) with at least min_rows of its split's rows carrying a value."""
    from condsearch.corpus.formats import format_of, read_table

    columns = []
    for source in sources:
        name = str(source["name"])
        if only is not None and name not in only:
            continue
        path = Path(str(source["table"]))
        table = read_table(path, format_of(path), "text")
        texts = [str(t) if t is not None else "" for t in table.column("text").to_pylist()]
        labels: dict[str, object] = source["conditions"]  # type: ignore[assignment]
        for column, conditions in labels.items():
            condition = conditions[0] if isinstance(conditions, list) else str(conditions)
            values = table.column(column).to_pylist()
            keep = [(t, str(v)) for t, v in zip(texts, values, strict=True) if t.strip() and v not in (None, "")]
            keep = [(t, v) for t, v in keep if split_of(t) == split]
            if len(keep) >= min_rows:
                columns.append(Column(name, column, condition, [t for t, _ in keep], [v for _, v in keep]))
    return columns


def sample_column(col: Column, corpus_size: int, n_queries: int, seed: int) -> tuple[list[int], list[int]]:
    """Return (corpus rows, query positions within the corpus): a seeded sample; queries have a same-valued row."""
    rng = np.random.default_rng(seed)
    rows = sorted(rng.permutation(len(col.texts))[:corpus_size].tolist())
    counts: dict[str, int] = {}
    for r in rows:
        counts[col.values[r]] = counts.get(col.values[r], 0) + 1
    candidates = [i for i, r in enumerate(rows) if counts[col.values[r]] >= 2]
    picked = sorted(rng.permutation(len(candidates))[:n_queries].tolist())
    return rows, [candidates[i] for i in picked]


def column_metrics(values: list[str], scores: np.ndarray, hits: np.ndarray, queries: list[int]) -> dict[str, float]:
    """Return one column's figures from each query's top-K (scores, corpus positions), best first."""
    n = len(values)
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    p10 = label_hits(values, hits[:, :K], queries)
    chance = [(counts[values[q]] - 1) / (n - 1) for q in queries]
    return {
        "queries": len(queries),
        "corpus": n,
        "values": len(counts),
        "p10": float(np.mean(p10)),
        "chance": float(np.mean(chance)),
        "top1": float(scores[:, 0].mean()),
        "top10": float(scores[:, K - 1].mean()),
        "spread": float((scores[:, 0] - scores[:, K - 1]).mean()),
    }


def evaluate(columns: Sequence[Column], embed, corpus_size: int, n_queries: int, seed: int):
    """Score one system on every column: {"source/column": figures}."""
    out: dict[str, dict[str, float]] = {}
    for col in columns:
        rows, queries = sample_column(col, corpus_size, n_queries, seed)
        if len(queries) == 0:
            continue
        texts = [col.texts[r] for r in rows]
        values = [col.values[r] for r in rows]
        vectors = embed(texts, col.condition)
        scores = vectors[queries] @ vectors.T
        scores[np.arange(len(queries)), queries] = -np.inf
        top, hits = best_k(scores, K)
        out[f"{col.source}/{col.column}"] = {"condition": col.condition, **column_metrics(values, top, hits, queries)}  # type: ignore[dict-item]
    return out


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """Return markdown: per system the mean p@10 and its ratio to plain's, then p@10 per column."""
    names = list(next(iter(results.values())))
    plain = results.get("plain")
    lines = ["| system | mean p@10 | vs plain | columns above plain |", "|---|---:|---:|---:|"]
    for system, per in results.items():
        mean = float(np.mean([per[c]["p10"] for c in names]))
        if plain is not None:
            base = float(np.mean([plain[c]["p10"] for c in names]))
            above = sum(per[c]["p10"] > plain[c]["p10"] for c in names)
            lines.append(f"| {system} | {mean:.3f} | {mean / base - 1:+.1%} | {above}/{len(names)} |")
        else:
            lines.append(f"| {system} | {mean:.3f} | — | — |")
    lines += ["", "| system | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    first = next(iter(results.values()))
    lines.append("| (chance) | " + " | ".join(f"{first[c]['chance']:.3f}" for c in names) + " |")
    for system, per in results.items():
        lines.append(f"| {system} | " + " | ".join(f"{per[c]['p10']:.3f}" for c in names) + " |")
    return "\n".join(lines) + "\n"


def smoke_sources(folder: Path) -> Path:
    """Write a tiny made-up labelled table and its sources file; return the sources file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    colours = ["red", "blue", "green"]
    animals = ["cat", "dog", "horse"]
    places = ["garden", "kitchen", "street", "field"]
    texts, colour, animal = [], [], []
    for i in range(72):
        c, a, p = colours[i % 3], animals[(i // 3) % 3], places[(i // 9) % 4]
        texts.append(f"A {c} {a} sleeps in the {p} (note {i}).")
        colour.append(c)
        animal.append(a)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": texts, "colour": colour, "animal": animal}), folder / "toy.parquet")
    spec = {
        "sources": [
            {
                "name": "toy",
                "table": "toy.parquet",
                "conditions": {"colour": ["the colour"], "animal": ["the kind of animal"]},
            }
        ]
    }
    (folder / "sources.json").write_text(json.dumps(spec))
    return folder / "sources.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sources", type=Path, default=Path("build/anytext/sources.json"), help="sources file")
    p.add_argument("--only", default=None, help="comma-separated source names to score (default all)")
    p.add_argument("--split", choices=SPLITS, default="dev", help="dev: choose on it; report: the quoted figures")
    p.add_argument("--systems", default="plain,prefix,case:full,csr", help="comma-separated system specs")
    p.add_argument("--corpus-size", type=int, default=3000, help="corpus rows per (source, condition), seeded")
    p.add_argument("--queries", type=int, default=100, help="queries per (source, condition), seeded")
    p.add_argument("--min-rows", type=int, default=200, help="skip a column with fewer rows in the split")
    add_system_options(p)
    p.add_argument("--smoke", action="store_true", help="a tiny made-up table; plain and case")
    args = p.parse_args(argv)
    quiet_transformers()
    if args.smoke:
        import tempfile

        args.sources = smoke_sources(Path(tempfile.mkdtemp(prefix="heldout-smoke-")))
        args.corpus_size, args.queries = 72, 20
        systems = ["plain", "case:full" if args.model is None else "case:none"]
    else:
        if not args.sources.is_file():
            build = "python -m benchmarks.studies.anytext.build_data"
            raise CorpusError(f"{args.sources}: no sources file (build it with {build})")
        systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    only = {s.strip() for s in args.only.split(",")} if args.only else None
    split = "dev" if args.smoke else args.split
    columns = read_columns(read_sources(args.sources), split, only, 0 if args.smoke else args.min_rows)
    if not columns:
        raise CorpusError(f"{args.sources}: no labelled columns to score")
    log("heldout", f"{len(columns)} columns: {', '.join(f'{c.source}/{c.column} ({len(c.texts)})' for c in columns)}")

    def run(system: str) -> dict[str, dict[str, float]]:
        embed, _ = load_system(system, args.batch_size, args.cache_dir, args.model)
        return evaluate(columns, embed, args.corpus_size, args.queries, args.seed)

    results, record = compare_systems("heldout", systems, run)
    result = {
        "benchmark": "heldout",
        "split": "smoke" if args.smoke else args.split,
        "sources": str(args.sources),
        "corpus_size": args.corpus_size,
        "queries": args.queries,
        "k": K,
        **record,
    }
    write_outputs(result, table(results), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(exit_code(main, "heldout.py"))
