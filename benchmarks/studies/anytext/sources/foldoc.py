"""FOLDOC (Debian ``dict-foldoc``): computing entries whose ``<tags>`` split into a kind and an area.

Each numbered sense is a row; its text is "headword, first paragraph" with the tags, cross-reference
braces, URLs and the date taken out.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.studies.anytext.dictd import read_entries
from benchmarks.studies.anytext.sources import Row

DICT = Path("usr/share/dictd")

#: tags naming what the entry is
KINDS = frozenset(
    {
        "language",
        "company",
        "standard",
        "protocol",
        "person",
        "file format",
        "processor",
        "tool",
        "algorithm",
        "computer",
        "unit",
        "application",
        "product",
        "project",
        "job",
        "publication",
        "library",
        "specification",
        "character",
        "body",
        "software",
        "filename extension",
        "benchmark",
        "compiler",
    }
)
#: tags naming the field it belongs to
AREAS = frozenset(
    {
        "networking",
        "programming",
        "operating system",
        "hardware",
        "communications",
        "storage",
        "mathematics",
        "database",
        "graphics",
        "web",
        "messaging",
        "architecture",
        "security",
        "text",
        "chat",
        "theory",
        "data",
        "electronics",
        "logic",
        "games",
        "testing",
        "compression",
        "parallel",
        "legal",
        "education",
        "cryptography",
        "business",
        "artificial intelligence",
        "history",
        "file system",
        "simulation",
        "audio",
        "hypertext",
        "music",
        "robotics",
        "multimedia",
        "philosophy",
        "information science",
        "human language",
    }
)

_TAGS = re.compile(r"^\s*(?:(\d+)\.\s*)?<([^<>]+)>\s*")
_SENSE = re.compile(r"^\s*\d+\.\s", re.MULTILINE)


def _clean(text: str) -> str:
    text = re.sub(r"\{?\(?(?:https?|ftp|mailto|news):[^\s)}]*\)?\}?", "", text)
    text = re.sub(r"\[[^\[\]]*\]", "", text)
    text = re.sub(r"\(\d{4}-\d{2}-\d{2}\)", "", text)
    text = text.replace("{", "").replace("}", "")
    return re.sub(r"\s+", " ", text).strip(" .;,") + "."


def _senses(body: str) -> list[str]:
    """Split an entry's body into its numbered senses (the whole body when unnumbered)."""
    starts = [m.start() for m in _SENSE.finditer(body)]
    if not starts:
        return [body]
    return [body[a:b] for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]


def parse_entry(head: str, entry: str) -> list[Row]:
    """Return one row per tagged sense of a FOLDOC entry."""
    lines = entry.splitlines()
    body_start = next((i for i, line in enumerate(lines) if line.startswith((" ", "\t"))), len(lines))
    names = [line.strip() for line in lines[:body_start] if line.strip()]
    head = names[0] if names else head
    rows: list[Row] = []
    for sense in _senses("\n".join(lines[body_start:])):
        match = _TAGS.match(sense)
        if not match:
            continue
        tags = [t.strip() for t in match.group(2).split(",")]
        kind = next((t for t in tags if t in KINDS), None)
        area = next((t for t in tags if t in AREAS), None)
        if kind is None and area is None:
            continue
        rest = sense[match.end() :]
        first = re.split(r"\n\s*\n", rest.strip(), maxsplit=1)[0]
        text = _clean(first)
        if len(text.split()) < 3:
            continue
        rows.append({"term": head, "text": f"{head}, {text}", "kind": kind, "area": area})
    return rows


def parse(root: Path) -> list[Row]:
    """Return every tagged sense of ``foldoc.index`` + ``foldoc.dict.dz`` under ``root``."""
    rows: list[Row] = []
    for head, entry in read_entries(root / DICT / "foldoc.index", root / DICT / "foldoc.dict.dz"):
        rows.extend(parse_entry(head, entry))
    return rows
