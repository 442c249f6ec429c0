"""Read a dictd dictionary (``NAME.index`` + ``NAME.dict.dz``) into its entries, in file order."""

from __future__ import annotations

import gzip
from pathlib import Path

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_DIGIT = {c: i for i, c in enumerate(_B64)}


def decode_number(digits: str) -> int:
    """Decode a dictd index number (base 64, most significant digit first)."""
    value = 0
    for c in digits:
        value = value * 64 + _DIGIT[c]
    return value


def encode_number(value: int) -> str:
    """Encode a non-negative number as dictd index digits (the tests' fixtures use it)."""
    digits = ""
    while True:
        value, rest = divmod(value, 64)
        digits = _B64[rest] + digits
        if value == 0:
            return digits


def read_entries(index: Path, data: Path) -> list[tuple[str, str]]:
    """Return ``(headword, entry text)`` once per entry, in file order.

    Several headwords share one entry (same offset and length); the first one listed names it.
    The ``00-database-*`` pseudo-entries are skipped. The text is decoded as UTF-8, undecodable
    bytes replaced (GCIDE has a few stray cp1252 bytes).
    """
    blob = gzip.decompress(data.read_bytes())
    seen: set[tuple[int, int]] = set()
    spans: list[tuple[int, int, str]] = []
    for line in index.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
            continue
        key = (decode_number(parts[1]), decode_number(parts[2]))
        if key in seen:
            continue
        seen.add(key)
        spans.append((key[0], key[1], parts[0]))
    spans.sort()
    return [(head, blob[off : off + size].decode("utf-8", errors="replace")) for off, size, head in spans]
