"""How an endpoint refuses a request: the check every text field gets, the error raised, the body answered.

``POST /query`` (:mod:`condsearch.serve.app`) and ``POST /v1/embeddings``
(:mod:`condsearch.serve.embeddings`) share these; the app turns a :class:`RequestError` into
``{"error": "one line"}`` (:class:`ErrorResponse`) with its status.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from condsearch.errors import CondsearchError
from condsearch.store import check_new_condition

#: the most results per query POST /query answers (the page's k box says so too)
MAX_K = 1000


class ErrorResponse(BaseModel):
    error: str


class RequestError(Exception):
    """A request the server refuses with a status and a one-line reason."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.extra = status, extra


def check_text(text: str) -> str:
    """Return text if a tokenizer can take it; a ValueError (a 422 from a validator) naming why not."""
    # JSON can carry a lone surrogate (\ud800), which no tokenizer takes; NUL is in no real text
    # and ends strings in C libraries
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode (it holds a lone surrogate, such as \\ud800)") from None
    if "\x00" in text:
        raise ValueError("holds a NUL character")
    return text


def check_request_condition(condition: str) -> str:
    """Return a request's condition in its normal form (:func:`condsearch.store.conditions.normalize_condition`);
    a ValueError (a 422 from a validator) where it is not text, empty, only invisible characters, holds a
    control character or is too long: what no index is built under.

    One limit on every endpoint: the embeddings endpoint encodes no condition that an index could not have
    (a router's code of a 9,900-character condition weighed 1.5 MB, issue 58).
    """
    try:
        text = check_new_condition(check_text(condition))
    except CondsearchError as exc:
        raise ValueError(str(exc)) from None
    return text
