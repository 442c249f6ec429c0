"""Headline figures quoted in several documents, each from one source: benchmarks/figures.json.

Each figure in benchmarks/figures.json has its value, digits, unit, the committed results JSON and the key
it comes from, the command that made that file, and the places that quote it: a file and a piece of its
text with ``{}`` where the figure stands (whitespace in the text matches any run of whitespace, line
breaks included). Every place must be found exactly once and must show the value at the figure's digits
(or the quote's own ``digits``); where the results file is committed, the value must equal its key
rounded to those digits. tests/benchmarks/test_figures_drift.py runs the check.

    python tools/figures.py            # check: one line a problem, exit 1 if any
    python tools/figures.py --fix      # write figures.json's value into every place that quotes it
    python tools/figures.py --table    # a markdown table of the figures, their sources and commands

To change a figure: change its value in benchmarks/figures.json (after rerunning its command and
committing the results file), then ``--fix``; a place edited by hand alone fails the check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIGURES = "benchmarks/figures.json"
NUMBER = r"(-?\d[\d,]*(?:\.\d+)?)"


@dataclass(frozen=True)
class Quote:
    figure: str
    file: str
    text: str
    digits: int

    def pattern(self) -> re.Pattern[str]:
        """The quote's text as a regex: the figure's place a number, whitespace any whitespace."""
        before, after = self.text.split("{}")

        def loose(part: str) -> str:
            return r"\s+".join(re.escape(word) for word in part.split(" "))

        return re.compile(loose(before) + NUMBER + loose(after))


def load(root: Path = REPO) -> dict[str, dict]:
    """Return figures.json's figures by id."""
    figures = json.loads((root / FIGURES).read_text(encoding="utf-8"))["figures"]
    for fid, fig in figures.items():
        missing = {"value", "digits", "unit", "source", "command", "quotes"} - set(fig)
        if missing:
            raise ValueError(f"{FIGURES}: figure {fid} has no {', '.join(sorted(missing))}")
    return figures


def rounded(value: float, digits: int) -> str:
    """value at digits, halves rounded up as a reader would (0.585 is 0.59, not float's 0.58)."""
    return str(Decimal(repr(value)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def quoted(fig: dict, digits: int | None = None) -> str:
    """The figure's value as the documents write it."""
    return rounded(fig["value"], fig["digits"] if digits is None else digits)


def quotes(figures: dict[str, dict]) -> list[Quote]:
    out = []
    for fid, fig in figures.items():
        for q in fig["quotes"]:
            if q["text"].count("{}") != 1:
                raise ValueError(f"{FIGURES}: {fid}: a quote's text needs one {{}}: {q['text']!r}")
            out.append(Quote(fid, q["file"], q["text"], q.get("digits", fig["digits"])))
    return out


def source_value(fig: dict, root: Path = REPO) -> float | None:
    """The figure's key in its results file, or None where the file is not committed."""
    path = root / fig["source"]["file"]
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8"))
    for part in fig["source"]["key"].split("."):
        value = value[part]
    return float(value)


def check(root: Path = REPO) -> list[str]:
    """Return one line per problem: a quote not found, found twice, showing another value; a source differing."""
    figures = load(root)
    problems = []
    for fid, fig in figures.items():
        got = source_value(fig, root)
        if got is not None and rounded(got, fig["digits"]) != quoted(fig):
            key = f"{fig['source']['file']} {fig['source']['key']}"
            problems.append(f"{fid}: {FIGURES} says {quoted(fig)}, {key} is {rounded(got, fig['digits'])}")
    texts: dict[str, str] = {}
    for q in quotes(figures):
        if q.file not in texts:
            path = root / q.file
            texts[q.file] = path.read_text(encoding="utf-8") if path.is_file() else ""
        found = q.pattern().findall(texts[q.file])
        want = quoted(figures[q.figure], q.digits)
        if not found:
            problems.append(f"{q.figure}: {q.file}: no text {q.text!r} (reworded? update {FIGURES})")
        elif len(found) > 1:
            problems.append(f"{q.figure}: {q.file}: {q.text!r} found {len(found)} times (make the quote longer)")
        elif found[0] != want:
            problems.append(f"{q.figure}: {q.file} quotes {found[0]} where {FIGURES} says {want}: {q.text!r}")
    return problems


def fix(root: Path = REPO) -> list[str]:
    """Write each figure's value into every place quoting it; return the files changed."""
    figures = load(root)
    changed = []
    for q in quotes(figures):
        path = root / q.file
        text = path.read_text(encoding="utf-8")
        want = quoted(figures[q.figure], q.digits)
        match = q.pattern().search(text)
        if match is None:
            continue  # check() reports it
        new = text[: match.start(1)] + want + text[match.end(1) :]
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(q.file)
    return sorted(set(changed))


def table(root: Path = REPO) -> str:
    rows = ["| figure | value | unit | from | command | quoted in |", "|---|---:|---|---|---|---|"]
    for fid, fig in load(root).items():
        places = ", ".join(sorted({q["file"] for q in fig["quotes"]}))
        source = f"`{fig['source']['file']}` `{fig['source']['key']}`"
        rows.append(f"| {fid} | {quoted(fig)} | {fig['unit']} | {source} | `{fig['command']}` | {places} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fix", action="store_true", help="write figures.json's values into every quoting place")
    p.add_argument("--table", action="store_true", help="print the figures as a markdown table")
    args = p.parse_args(argv)
    if args.table:
        print(table())
        return 0
    if args.fix:
        for name in fix():
            print(f"figures: rewrote {name}", file=sys.stderr)
    problems = check()
    for line in problems:
        print(f"figures: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
