"""A tokenizer that tokenizes for one thread at a time.

transformers' fast tokenizers set truncation and padding on their shared backend at each call, then
encode; two threads tokenizing at once mix each other's settings (a padded batch came back unpadded
when the server's two lanes first ran one model at once: issue 58). Tokenizing is short beside the
forward pass that follows, so one call at a time costs the forward passes nothing of running at once.
"""

from __future__ import annotations

import threading
from typing import Any


class SerialTokenizer:
    """Wrap a tokenizer: calls to it run one at a time; every other attribute is the tokenizer's own."""

    __slots__ = ("_lock", "_tokenizer")

    def __init__(self, tokenizer: Any) -> None:
        if isinstance(tokenizer, SerialTokenizer):
            tokenizer = tokenizer.unwrapped
        object.__setattr__(self, "_tokenizer", tokenizer)
        object.__setattr__(self, "_lock", threading.Lock())

    @property
    def unwrapped(self) -> Any:
        """Return the tokenizer wrapped."""
        return self._tokenizer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._tokenizer, name, value)

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return SerialTokenizer, (self._tokenizer,)  # a copy (a Ray worker's) gets a lock of its own

    def __repr__(self) -> str:
        return f"SerialTokenizer({self._tokenizer!r})"
