"""Errors that condsearch raises for bad input; the CLI turns them into one-line messages."""

from __future__ import annotations


class CondsearchError(Exception):
    """A problem with the user's input or files, reported without a traceback."""


class CorpusError(CondsearchError):
    """The corpus file cannot be read or does not have the expected shape."""


class StoreError(CondsearchError):
    """An index on disk is missing, corrupt, foreign or incompatible."""


class NotBuildable(StoreError):
    """A condition cannot be built on demand for this corpus: it was indexed in CASE mode (a 404 in the server)."""


class FilterError(CondsearchError):
    """A query's filter (``--where``) cannot be read or applied: a syntax error, an unknown column, a type mismatch."""


class ModelError(CondsearchError):
    """A model or head cannot be resolved or loaded."""

    @classmethod
    def cannot_load(cls, model_id: str, exc: BaseException) -> ModelError:
        """Return the error for a model that transformers could not load, naming its first line."""
        return cls(f"cannot load model {model_id!r}: {first_line(exc)}")


def first_line(message: BaseException | str) -> str:
    """Return the first non-blank line of a message, stripped.

    An exception whose message has none gives its type's name; a blank string gives "".
    """
    for line in str(message).splitlines():
        if line.strip():
            return line.strip()
    return type(message).__name__ if isinstance(message, BaseException) else ""


def os_reason(exc: OSError) -> str:
    """Return why an operating-system call failed, in a few words ("Permission denied", "No space left on device")."""
    return exc.strerror or first_line(exc)


class UnknownCondition(StoreError):
    """No index holds the condition (and corpus) asked for; ``conditions`` lists those indexed."""

    def __init__(self, message: str, conditions: list[str]) -> None:
        super().__init__(message)
        self.conditions = conditions


class CaseVariant(CondsearchError):
    """A build under a condition that differs from one of the corpus's indexed conditions only in case (a cased
    model's: an uncased one reads both alike and names one index); ``existing`` is that indexed condition,
    ``condition`` the one asked for (normalised)."""

    def __init__(self, message: str, existing: str, condition: str) -> None:
        super().__init__(message)
        self.existing, self.condition = existing, condition


class AmbiguousCondition(StoreError):
    """Several corpora are indexed under the condition and none was named; ``corpora`` lists them."""

    def __init__(self, message: str, corpora: list[str]) -> None:
        super().__init__(message)
        self.corpora = corpora
