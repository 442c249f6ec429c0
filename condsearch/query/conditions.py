"""What a condition may be when an index is built under it: `index`, `Store.index` and a build on demand.

A condition names an aspect in a short phrase (C-STS's are 3 to 55 characters long). A new index is
refused, in one line, for a condition that is empty, holds a control character (a tab, a newline,
an escape: ``unicodedata`` category Cc) or is longer than :data:`MAX_CONDITION_CHARS`. Queries of
indexes built before these checks are answered as before: only building is checked.
"""

from __future__ import annotations

import unicodedata

from condsearch.errors import CondsearchError
from condsearch.store.listing import check_condition

#: the longest condition, in characters (after stripping surrounding space), that a new index is built under
MAX_CONDITION_CHARS = 200


def check_new_condition(condition: str) -> str:
    """Return a condition stripped of surrounding space; refuse it empty, too long or with control characters."""
    text = check_condition(condition)
    if len(text) > MAX_CONDITION_CHARS:
        raise CondsearchError(
            f"the condition is {len(text)} characters long; at most {MAX_CONDITION_CHARS} are allowed "
            f"(it names an aspect in a short phrase): {text[:40]!r}…"
        )
    for at, char in enumerate(text):
        if unicodedata.category(char) == "Cc":
            raise CondsearchError(
                f"the condition has a control character (U+{ord(char):04X}) at position {at + 1}: {text[:60]!r}"
            )
    return text
