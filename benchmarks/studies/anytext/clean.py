"""Turn a parser's rows into a table fit for pair making: sane lengths, no duplicates, no rare labels.

Also the guard on reserved text: a text that shares a run of words with a WordNet gloss (the
out-of-domain benchmark's corpus, WN18RR's entity texts) is dropped whatever its source.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.studies.anytext.sources import Row
from benchmarks.studies.anytext.text import squash

_WORD = re.compile(r"[a-z0-9]+")
#: how many consecutive words a text must share with a reserved gloss to be dropped
SHINGLE = 6


@dataclass(frozen=True)
class CleanConfig:
    """The bounds every source's table is held to."""

    min_chars: int = 20
    max_chars: int = 400
    #: a label value held by fewer texts is dropped (the text stays if it has another label)
    min_count: int = 20


@dataclass
class CleanReport:
    """What cleaning removed from one source, for sources.json."""

    parsed: int = 0
    length: int = 0
    duplicate: int = 0
    reserved: int = 0
    unlabelled: int = 0
    dropped_values: dict[str, int] = field(default_factory=dict)
    dropped_columns: list[str] = field(default_factory=list)


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Reserved:
    """Reserved glosses as word 6-grams: each 6-gram's glosses, each gloss's 6-gram count, and short glosses whole."""

    grams: dict[tuple[str, ...], tuple[int, ...]]
    sizes: tuple[int, ...]
    short: frozenset[tuple[str, ...]]


def reserved_shingles(glosses: Iterable[str]) -> Reserved:
    """Index reserved glosses by their word 6-grams (those shorter than 6 words, of 3 or more, whole)."""
    grams: dict[tuple[str, ...], list[int]] = {}
    sizes: list[int] = []
    short: set[tuple[str, ...]] = set()
    for gloss in glosses:
        words = _words(gloss)
        own = {tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}
        for gram in own:
            grams.setdefault(gram, []).append(len(sizes))
        sizes.append(len(own))
        if len(words) < SHINGLE and len(words) >= 3:
            short.add(tuple(words))
    return Reserved({g: tuple(ids) for g, ids in grams.items()}, tuple(sizes), frozenset(short))


def read_wn18rr_glosses(path: Path) -> list[str]:
    """Return the definitions of WN18RR's ``entity2text.txt`` (``id<TAB>name, definition``)."""
    glosses = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split("\t", 1)[-1]
        glosses.append(text.split(", ", 1)[-1])
    return glosses


def is_reserved(text: str, reserved: Reserved) -> bool:
    """Say whether a text holds at least half of some reserved gloss's 6-grams, or a short gloss whole.

    Half, not one: a single shared 6-gram is often a stock phrase ("the state or quality of being").
    """
    words = _words(text)
    hits: Counter[int] = Counter()
    for gram in {tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}:
        hits.update(reserved.grams.get(gram, ()))
    if any(n * 2 >= reserved.sizes[gloss] for gloss, n in hits.items()):
        return True
    definition = tuple(_words(text.split(", ", 1)[-1]))
    return definition in reserved.short


def clean_rows(
    rows: list[Row],
    labels: Iterable[str],
    config: CleanConfig,
    reserved: Reserved | None = None,
) -> tuple[list[Row], CleanReport]:
    """Return the rows kept and what was dropped.

    Texts outside ``[min_chars, max_chars]``, repeated texts (the first is kept) and reserved texts
    go; label values with fewer than ``min_count`` texts become None; rows left with no label go;
    a label column left with fewer than two values is removed (named in the report).
    """
    columns = list(labels)
    report = CleanReport(parsed=len(rows))
    seen: set[str] = set()
    kept: list[Row] = []
    for row in rows:
        text = squash(row["text"] or "")
        if not config.min_chars <= len(text) <= config.max_chars:
            report.length += 1
            continue
        key = " ".join(_words(text))
        if key in seen:
            report.duplicate += 1
            continue
        seen.add(key)
        if reserved is not None and is_reserved(text, reserved):
            report.reserved += 1
            continue
        kept.append({**row, "text": text})
    for column in columns:
        counts = Counter(row[column] for row in kept if row.get(column))
        rare = {value for value, n in counts.items() if n < config.min_count}
        report.dropped_values[column] = len(rare)
        for row in kept:
            if row.get(column) in rare:
                row[column] = None
        if len(counts) - len(rare) < 2:
            report.dropped_columns.append(column)
            for row in kept:
                row.pop(column, None)
    live = [c for c in columns if c not in report.dropped_columns]
    labelled = [row for row in kept if any(row.get(c) for c in live)]
    report.unlabelled = len(kept) - len(labelled)
    return labelled, report
