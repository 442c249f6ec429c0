"""Two Bible translations aligned by verse (Debian ``sword-text-kjv`` + ``sword-text-web``): paraphrase pairs.

A SWORD zText module stores each testament as three files: ``.bzs`` (12-byte ``<III`` records:
offset, compressed size, uncompressed size of each zlib block), ``.bzv`` (10-byte ``<IIH`` records:
block, start, size of each verse slot) and ``.bzz`` (the blocks). Slots run in versification order
with a slot before each book and chapter; those header slots carry ``<div type="book" osisID=..>``
and ``<chapter osisID=..>`` milestones, so a verse's reference is read from the module itself.

The two modules use different versifications (KJV, NRSVA), so a chapter is aligned only when both
have the same number of verses in it, and a verse pair only when the two share enough of their
Strong's numbers (the original-language words tagged in both). The text is the OSIS markup with
``<note>`` and ``<title>`` elements dropped, then every tag.
"""

from __future__ import annotations

import html
import random
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from benchmarks.studies.anytext.text import squash

MODULES = Path("usr/share/sword/modules/texts/ztext")
KJV = "engKJV2006eb"
WEB = "engWEB2015eb"

_BOOK_ID = re.compile(r"<div\b(?=[^>]*\btype=\"book\")[^>]*\bosisID=\"([^\"]+)\"")
_CHAPTER_ID = re.compile(r"<chapter\b(?=[^>]*\bsID=)[^>]*\bosisID=\"([^\"]+)\"")
_STRONGS = re.compile(r"strong:([GH]\d+)")
_DROPPED = re.compile(r"<(note|title)\b[^>]*?(?<!/)>.*?</\1>", re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
_WORD = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class Verse:
    """One verse: its reference ("Matt.1.1"), plain text and the Strong's numbers tagged in it."""

    ref: str
    text: str
    strongs: frozenset[str]


def read_slots(bzs: bytes, bzv: bytes, bzz: bytes) -> list[str]:
    """Return every slot of one testament of a zText module, decoded ("" for an empty slot)."""
    blocks = [struct.unpack_from("<III", bzs, i) for i in range(0, len(bzs) - len(bzs) % 12, 12)]
    cache: dict[int, bytes] = {}
    slots: list[str] = []
    for i in range(0, len(bzv) - len(bzv) % 10, 10):
        block, start, size = struct.unpack_from("<IIH", bzv, i)
        if size == 0 or block >= len(blocks):
            slots.append("")
            continue
        if block not in cache:
            offset, compressed, _ = blocks[block]
            cache[block] = zlib.decompress(bzz[offset : offset + compressed])
        slots.append(cache[block][start : start + size].decode("utf-8", errors="replace"))
    return slots


def plain_text(osis: str) -> str:
    """Return a verse's words: notes and headings dropped, then every tag, entities decoded."""
    return squash(html.unescape(_TAG.sub("", _DROPPED.sub(" ", osis))))


def verses(slots: list[str]) -> list[Verse]:
    """Return the verses of one testament's slots, each named by the book and chapter headers before it.

    A slot holding a chapter milestone starts that chapter's verse count; the slots after it are
    verses 1, 2, ... until the next book or chapter header.
    """
    out: list[Verse] = []
    chapter: str | None = None
    number = 0
    for slot in slots:
        chapter_id = _CHAPTER_ID.search(slot)
        if chapter_id:
            chapter, number = chapter_id.group(1), 0
            continue
        if _BOOK_ID.search(slot):
            chapter = None
            continue
        if chapter is None:
            continue
        number += 1
        text = plain_text(slot)
        if text:
            out.append(Verse(f"{chapter}.{number}", text, frozenset(_STRONGS.findall(slot))))
    return out


def read_module(root: Path, name: str) -> list[Verse]:
    """Return the verses of both testaments of the zText module ``name`` under ``root``."""
    folder = root / MODULES / name
    out: list[Verse] = []
    for testament in ("ot", "nt"):
        files = [folder / f"{testament}.{ext}" for ext in ("bzs", "bzv", "bzz")]
        if all(f.is_file() for f in files):
            out.extend(verses(read_slots(*(f.read_bytes() for f in files))))
    return out


def _jaccard(a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def _chapter_sizes(verses_: list[Verse]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for verse in verses_:
        chapter, number = verse.ref.rsplit(".", 1)
        sizes[chapter] = max(sizes.get(chapter, 0), int(number))
    return sizes


def align(first: list[Verse], second: list[Verse], min_strongs: float = 0.3) -> list[tuple[Verse, Verse]]:
    """Pair the verses of two translations that share a reference in a chapter of the same length.

    Where both verses are tagged with Strong's numbers, a pair is kept only when they overlap by at
    least ``min_strongs`` (Jaccard), which drops verses that a versification difference shifted.
    """
    sizes_a, sizes_b = _chapter_sizes(first), _chapter_sizes(second)
    by_ref = {v.ref: v for v in second}
    pairs: list[tuple[Verse, Verse]] = []
    for verse in first:
        other = by_ref.get(verse.ref)
        chapter = verse.ref.rsplit(".", 1)[0]
        if other is None or sizes_a.get(chapter) != sizes_b.get(chapter):
            continue
        if verse.strongs and other.strongs and _jaccard(verse.strongs, other.strongs) < min_strongs:
            continue
        pairs.append((verse, other))
    return pairs


def paraphrase_rows(pairs: list[tuple[Verse, Verse]], min_chars: int, max_chars: int) -> list[dict[str, str]]:
    """Return the aligned pairs as rows (ref, sentence1 = KJV, sentence2 = WEB), one per distinct KJV text.

    Pairs whose two sides are the same words, or whose either side is outside the length bounds, are dropped.
    """
    seen: set[str] = set()
    rows: list[dict[str, str]] = []
    for a, b in pairs:
        key = " ".join(_WORD.findall(a.text.lower()))
        if key in seen or key == " ".join(_WORD.findall(b.text.lower())):
            continue
        if not (min_chars <= len(a.text) <= max_chars and min_chars <= len(b.text) <= max_chars):
            continue
        seen.add(key)
        rows.append({"ref": a.ref, "sentence1": a.text, "sentence2": b.text})
    return rows


def mismatched_rows(rows: list[dict[str, str]], n: int, seed: int, max_overlap: float = 0.2) -> list[dict[str, str]]:
    """Return ``n`` pairs of verses from different books that share few words: unlikely paraphrases.

    A KJV verse is paired with the WEB side of another row, never from the same book, and only when
    their words overlap by less than ``max_overlap`` (Jaccard) and neither's other translation
    overlaps the other by more (so repeated formulas and parallel passages are not taken).
    """
    rng = random.Random(seed)
    words = [(_words(r["sentence1"]), _words(r["sentence2"])) for r in rows]
    books = [r["ref"].split(".", 1)[0] for r in rows]
    out: list[dict[str, str]] = []
    tries = 0
    while len(out) < n and tries < 20 * n and len(rows) > 1:
        tries += 1
        i, j = rng.randrange(len(rows)), rng.randrange(len(rows))
        if books[i] == books[j]:
            continue
        if max(_jaccard(words[i][0], words[j][1]), _jaccard(words[i][0], words[j][0])) >= max_overlap:
            continue
        out.append(
            {
                "ref": f"{rows[i]['ref']}|{rows[j]['ref']}",
                "sentence1": rows[i]["sentence1"],
                "sentence2": rows[j]["sentence2"],
            }
        )
    return out


def parse_pairs(root: Path) -> list[tuple[Verse, Verse]]:
    """Return the aligned (KJV, WEB) verse pairs of the two modules under ``root``."""
    return align(read_module(root, KJV), read_module(root, WEB))
