"""condsearch: conditional semantic search with condition-aware sentence embeddings (CASE)."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
