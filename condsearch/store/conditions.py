"""What a condition is: its one normal form, which names and finds an index, and what a new index is refused for.

Two spellings that a reader (and an uncased model) cannot tell apart name one index (issue 58):
:func:`normalize_condition` composes characters (NFC), drops format characters (category Cf: zero-width
spaces and joiners, the byte-order mark, bidirectional marks), reads every space character (NBSP, the
ideographic space, a tab on lookup) as one space, collapses runs of them and strips the ends; for a
model whose tokenizer lower-cases its input (the default MiniLM) it lower-cases too
(:func:`condsearch.base.model_sources.model_lowercases`). An index is written under the normal form and found by
it (:func:`condsearch.store.listing.find_index` normalises both sides, so an index written before, under
another spelling, is still found). Every front end, the CLI, the Python API and the server, goes through
these functions.

A condition names an aspect in a short phrase (C-STS's are 3 to 55 characters long). A new index is
refused, in one line, for a condition that is empty or holds only invisible characters, holds a control
character (a tab, a newline, an escape: ``unicodedata`` category Cc) or is longer than
:data:`MAX_CONDITION_CHARS` once normalised; the server refuses a longer condition on every endpoint.
"""

from __future__ import annotations

import re
import unicodedata

from condsearch.errors import CondsearchError

#: the longest condition, in characters once normalised, that an index is built under or a server reads
MAX_CONDITION_CHARS = 200

_SPACES = re.compile(r"\s+")


def normalize_condition(condition: str, *, lowercase: bool = False) -> str:
    """Return condition's normal form: NFC, no format characters, single spaces, no surrounding space.

    ``lowercase``: also lower-case it, for a model whose tokenizer does (an uncased model reads both alike).
    """
    text = unicodedata.normalize("NFC", condition)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    text = _SPACES.sub(" ", text).strip()  # \s is Unicode-aware: NBSP, U+2000-200A, U+3000, tabs
    return text.lower() if lowercase else text


def check_condition(condition: str) -> str:
    """Return condition's normal form (not lower-cased), refusing one that is empty or only invisible characters."""
    text = normalize_condition(condition)
    if not text:
        invisible = ", ".join(f"U+{ord(c):04X}" for c in condition.strip()[:4])
        raise CondsearchError(
            f"the condition holds only invisible characters ({invisible})" if invisible else "the condition is empty"
        )
    return text


def check_new_condition(condition: str) -> str:
    """Return the normal form of a condition to build an index under; refuse it empty, too long or with control
    characters."""
    stripped = condition.strip()
    for at, char in enumerate(stripped):
        if unicodedata.category(char) == "Cc":
            raise CondsearchError(
                f"the condition has a control character (U+{ord(char):04X}) at position {at + 1}: {stripped[:60]!r}"
            )
    text = check_condition(stripped)
    check_condition_length(text)
    return text


def check_condition_length(text: str) -> None:
    """Refuse a condition longer than :data:`MAX_CONDITION_CHARS`, in one line."""
    if len(text) > MAX_CONDITION_CHARS:
        raise CondsearchError(
            f"the condition is {len(text)} characters long; at most {MAX_CONDITION_CHARS} are allowed "
            f"(it names an aspect in a short phrase): {text[:40]!r}…"
        )


#: characters of a condition a refusal quotes at most
SHOWN_CHARS = 60


def shown_condition(condition: str) -> str:
    """Return condition quoted for a message: whole when short, else its first :data:`SHOWN_CHARS` characters and
    "…" (a refusal of a condition of 10,000 characters is still one readable line)."""
    if len(condition) <= MAX_CONDITION_CHARS // 2:
        return repr(condition)
    return f"{condition[:SHOWN_CHARS]!r}… ({len(condition):,} characters)"


def new_condition_problem(condition: str) -> str | None:
    """Return why no index can be built under condition (:func:`check_new_condition`'s refusal), or None."""
    try:
        check_new_condition(condition)
    except CondsearchError as exc:
        return str(exc)
    return None
