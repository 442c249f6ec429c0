"""Small text helpers the parsers share."""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[A-Z\"'(])")


def squash(text: str) -> str:
    """Collapse runs of whitespace into one space and strip the ends."""
    return re.sub(r"\s+", " ", text).strip()


def first_sentences(text: str, max_chars: int) -> str:
    """Return the longest run of whole leading sentences that fits ``max_chars`` (the first one, cut, if none does)."""
    text = squash(text)
    if len(text) <= max_chars:
        return text
    out = ""
    for sentence in _SENTENCE_END.split(text):
        candidate = f"{out} {sentence}".strip()
        if len(candidate) > max_chars:
            break
        out = candidate
    if out:
        return out
    cut = text[:max_chars].rsplit(" ", 1)[0]
    return cut.rstrip(",;:") + "…"
