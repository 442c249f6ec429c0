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

# A JSON string, or the rest of the line after a quote never closed (as good as a string: the
# parser stops there). A JSON lines value holds no raw newline, so no match crosses one.
_JSON_STRING = re.compile(rb'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+(?:"|$)', re.M)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_OPENING = np.frombuffer(b"[{", np.uint8)
_CLOSING = np.frombuffer(b"]}", np.uint8)

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
        brackets = np.frombuffer(_JSON_STRING.sub(b"", block).translate(None, _NOT_BRACKETS), np.uint8)
        if len(brackets):
            levels = _clamped_levels(depth, np.where(np.isin(brackets, _OPENING), 1, -1))
            if int(levels.max()) > MAX_JSON_DEPTH:
                at = line + _lines_before_depth(block, depth)
                deep = f"nests arrays and objects deeper than {MAX_JSON_DEPTH} levels"
                raise CorpusError(f"{path}: line {at} {deep}; refusing to parse it")
            depth = int(levels[-1])
        line += block.count(b"\n")


def _lines_before_depth(block: bytes, depth: int) -> int:
    """Return how many newlines come before the place in block where nesting first passes the limit (for messages)."""
    blanked = _JSON_STRING.sub(lambda m: b" " * len(m[0]), block)  # strings blanked, so positions are the block's
    chars = np.frombuffer(blanked, np.uint8)
    steps = np.where(np.isin(chars, _OPENING), 1, 0) - np.where(np.isin(chars, _CLOSING), 1, 0)
    levels = _clamped_levels(depth, steps)
    return block.count(b"\n", 0, int(np.argmax(levels > MAX_JSON_DEPTH)))


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
