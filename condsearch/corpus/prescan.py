"""Byte-level checks of a CSV or JSON lines file, made before pyarrow parses it.

pyarrow's JSON reader recurses once per level of nesting and ends the process (SIGSEGV) on a line
nested some thousands deep, even in a column never read; it also passes invalid UTF-8 through to
the strings it returns. Its CSV reader takes a quote left open at the end of the file as a value
that runs to the end, so the rest of the file becomes one row. Each check streams the file in
blocks of whole lines (regular expressions and numpy do the per-byte work, in C) and raises
CorpusError in one line.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from condsearch.errors import CorpusError

#: deepest nesting of arrays and objects a JSON line may have (pyarrow crashes in the thousands)
MAX_JSON_DEPTH = 64
#: bytes read at a time; a line longer than that is read whole, the block growing to hold it
BLOCK_BYTES = 1 << 22
_BOM = codecs.BOM_UTF8

# Nesting is counted on a JSON lines block reduced to its quotes, newlines and brackets: escaped
# backslashes and escaped quotes are dropped first (left to right, as a parser pairs them), so that
# every quote left opens or closes a string. A string holds no raw newline, so the quotes of each
# line pair up on their own: a bracket is in a string where an odd number of quotes precede it on
# its line (after a quote never closed, the rest of the line: the parser stops at that quote).
_STRUCTURE = b'"\n[]{}'
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in _STRUCTURE)
_QUOTE, _NEWLINE = ord('"'), ord("\n")
_BRACKETS = tuple(b"[{]}")

# pyarrow's CSV quoting: a field is quoted when it starts with '"'; inside, '""' is a quote and
# a lone '"' ends it; what follows up to the delimiter is kept as is, quotes too. Possessive
# repeats keep the match linear; it stops at the start of the first record not ended by a newline.
_FIELD = rb'(?:"[^"]*+(?:""[^"]*+)*+"[^,\r\n]*+|[^,\r\n"][^,\r\n]*+)?+'
_RECORD = _FIELD + rb"(?:," + _FIELD + rb")*+"
_CSV_RECORDS = re.compile(rb"(?:" + _RECORD + rb"(?:\r\n|\n|\r))*+")
_CSV_LAST_RECORD = re.compile(_RECORD)


def check_text_file(path: Path, fmt: str) -> None:
    """Refuse a CSV file that ends inside a quoted value, and a JSON lines file pyarrow would crash on or misread.

    A JSON lines file must be valid UTF-8 and nest arrays and objects at most :data:`MAX_JSON_DEPTH` deep.
    """
    if fmt == "csv":
        _check_csv_quotes(path)
    elif fmt == "jsonl":
        _check_json_lines(path)


def _line_blocks(path: Path) -> Iterator[tuple[int, bytes]]:
    """Yield (byte offset, block) of whole lines but the last block's, which ends the file."""
    with open(path, "rb") as fh:
        carry, offset, size = b"", 0, BLOCK_BYTES
        while True:
            chunk = fh.read(size)
            if not chunk:
                break
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # no line ends here: read on, in larger blocks so that a long line costs linear time
                carry, size = data, max(size, len(data))
                continue
            yield offset, data[:cut]
            offset += cut
            carry, size = data[cut:], BLOCK_BYTES
        if carry:
            yield offset, carry


def _check_json_lines(path: Path) -> None:
    depth = 0  # carried from line to line: a value may span lines within one of pyarrow's blocks
    line = 1
    for offset, block in _line_blocks(path):
        try:
            if not block.isascii():
                block.decode("utf-8")
        except UnicodeDecodeError as exc:
            at = line + block.count(b"\n", 0, exc.start)
            raise CorpusError(f"{path}: line {at} is not valid UTF-8 (byte {offset + exc.start})") from None
        chars, steps = _bracket_steps(block)
        levels = _clamped_levels(depth, steps)
        if len(levels) and int(levels.max()) > MAX_JSON_DEPTH:
            deepest = int(np.argmax(levels > MAX_JSON_DEPTH))
            at = line + int(np.count_nonzero(chars[:deepest] == _NEWLINE))
            deep = f"nests arrays and objects deeper than {MAX_JSON_DEPTH} levels"
            raise CorpusError(f"{path}: line {at} {deep}; refusing to parse it")
        depth = int(levels[-1]) if len(levels) else depth
        line += block.count(b"\n")


def _bracket_steps(block: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Return a block reduced to quotes, newlines and brackets, and per byte +1 (opens), -1 (closes) or 0.

    Brackets inside strings are 0. The reduced block is short (its text gone), so numpy's passes over it are cheap.
    """
    reduced = block.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    chars = np.frombuffer(reduced, np.uint8)
    quotes = np.cumsum(chars == _QUOTE, dtype=np.int32)
    newlines = chars == _NEWLINE
    line_of = np.cumsum(newlines, dtype=np.int32) - newlines  # the line each byte is on (a newline ends its own)
    quotes_before_line = np.concatenate((np.zeros(1, np.int32), quotes[newlines]))[line_of]
    inside = ((quotes - quotes_before_line) & 1).astype(bool)
    opens = (chars == _BRACKETS[0]) | (chars == _BRACKETS[1])
    closes = (chars == _BRACKETS[2]) | (chars == _BRACKETS[3])
    return chars, np.where(inside, 0, opens.astype(np.int32) - closes)


def _clamped_levels(depth: int, steps: np.ndarray) -> np.ndarray:
    """Return the nesting level after each step (+1 opens, -1 closes) from depth; a close at level 0 stays there.

    The parser stops at such a close (the line is invalid), so it must not hide nesting that follows.
    """
    levels = depth + np.cumsum(steps)
    return levels - np.minimum(np.minimum.accumulate(levels), 0)


def _check_csv_quotes(path: Path) -> None:
    line = 1
    carry = b""
    first = True
    with open(path, "rb") as fh:
        size = BLOCK_BYTES
        while True:
            chunk = fh.read(size)
            if first and chunk.startswith(_BOM):  # pyarrow skips a byte order mark
                chunk = chunk[len(_BOM) :]
            first = False
            if not chunk:
                break
            data = carry + chunk
            done = _CSV_RECORDS.match(data)
            end = done.end() if done else 0
            line += data.count(b"\n", 0, end)
            carry = data[end:]
            # a record longer than a block is matched again with the next one: grow the block so that costs linear time
            size = max(BLOCK_BYTES, len(carry))
    if carry and not _CSV_LAST_RECORD.fullmatch(carry):
        raise CorpusError(
            f"{path}: a quote opened on line {line} is never closed; the rest of the file would be read as one value"
        )
