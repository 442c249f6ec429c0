"""fortune's quotations (Debian ``fortunes`` + ``fortunes-min``): theme (the file) and author (the ``--`` line).

The attribution is cut from the text, so a quotation never names its own author.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.studies.anytext.sources import Row

FORTUNES = Path("usr/share/games/fortunes")

#: files that are pictures or foreign-language text, not English prose
SKIPPED = frozenset({"ascii-art", "translate-me"})

#: attributions that name no person ("-- Seen on a wall", "-- Anonymous")
NOT_AUTHORS = frozenset({"seen", "found", "overheard", "heard", "graffiti", "sign", "unknown", "anonymous", "anon"})

_ATTRIBUTION = re.compile(r"^\s*--\s*(.+)$")


def _author(attribution: str) -> str | None:
    """Return who an attribution names: "Mark Twain, "Pudd'nhead Wilson"" -> "Mark Twain"."""
    name = re.split(r",|\(|\[|:|;| in | on | about ", attribution, maxsplit=1)[0]
    name = re.sub(r"\s+", " ", name).strip(" .\"'")
    if not name or len(name) > 40 or not name[:1].isupper() or name.split()[0].lower() in NOT_AUTHORS:
        return None
    return name


def parse_cookie(text: str, theme: str) -> list[Row]:
    """Return one row per fortune of a cookie file (fortunes split on lines holding ``%``)."""
    rows: list[Row] = []
    for chunk in re.split(r"^%\s*$", text, flags=re.MULTILINE):
        lines = [line.rstrip() for line in chunk.strip("\n").splitlines()]
        while lines and not lines[-1].strip():
            lines.pop()
        if not lines:
            continue
        author = None
        for i in range(len(lines) - 1, max(len(lines) - 4, 0) - 1, -1):
            match = _ATTRIBUTION.match(lines[i])
            if match:
                attribution = " ".join([match.group(1), *(line.strip() for line in lines[i + 1 :])])
                author = _author(attribution)
                lines = lines[:i]
                break
        body = re.sub(r"\s+", " ", " ".join(lines)).strip()
        if body:
            rows.append({"text": body, "theme": theme, "author": author})
    return rows


def parse(root: Path) -> list[Row]:
    """Return every fortune under ``root``'s fortunes folder; the theme is its file's name."""
    rows: list[Row] = []
    folder = root / FORTUNES
    for path in sorted(folder.iterdir()):
        if path.suffix in {".dat", ".u8"} or path.is_symlink() or not path.is_file() or path.name in SKIPPED:
            continue
        rows.extend(parse_cookie(path.read_text(encoding="utf-8", errors="replace"), path.name))
    return rows
