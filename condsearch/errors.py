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
