"""Errors that condsearch raises for bad input; the CLI turns them into one-line messages."""

from __future__ import annotations


class CondsearchError(Exception):
    """A problem with the user's input or files, reported without a traceback."""


class CorpusError(CondsearchError):
    """The corpus file cannot be read or does not have the expected shape."""


class StoreError(CondsearchError):
    """An index on disk is missing, corrupt, foreign or incompatible."""


class ModelError(CondsearchError):
    """A model or head cannot be resolved or loaded."""

    @classmethod
    def cannot_load(cls, model_id: str, exc: BaseException) -> ModelError:
        """Return the error for a model that transformers could not load, naming its first line."""
        return cls(f"cannot load model {model_id!r}: {first_line(exc)}")


def first_line(exc: BaseException) -> str:
    """Return the first non-blank line of an exception's message, or its type's name when there is none."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
