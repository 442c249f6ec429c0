"""The JSON shapes that `query --json`, `list --json` and the server share, built in one place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from condsearch.store import Manifest


def capped_k(k: int, n_rows: int) -> int:
    """Return the k a search can honour: every row when k is larger than the index (as
    sentence-transformers' ``semantic_search`` does), never an error."""
    return max(0, min(k, n_rows))


def k_notice(k: int, n_rows: int) -> str | None:
    """Return the one-line notice for a k larger than the index, or None."""
    if k <= n_rows:
        return None
    return f"k={k} is larger than the index ({n_rows} rows); returning all {n_rows}"


def query_answer(
    query: str,
    condition: str,
    scores: np.ndarray,
    rows: np.ndarray,
    ids: Sequence[str | int],
    texts: Sequence[str],
) -> dict[str, Any]:
    """Return one query's answer: ``{query, condition, results: [{rank, id, score, text}]}``.

    scores, rows: (k,) for this query, best first; rows are row numbers (-1 pads past the index).
    """
    results = [
        {"rank": r + 1, "id": ids[i], "score": round(float(s), 6), "text": texts[i]}
        for r, (s, i) in enumerate(zip(scores.tolist(), rows.tolist(), strict=True))
        if i >= 0
    ]
    return {"query": query, "condition": condition, "results": results}


def index_summary(name: str, manifest: Manifest | Exception) -> dict[str, Any]:
    """Return one index as `list --json` shows it (``{index, error}`` for one that cannot be read)."""
    if isinstance(manifest, Exception):
        return {"index": name, "error": str(manifest)}
    m = manifest
    return {
        "index": name,
        "condition": m.condition,
        "corpus": m.corpus_name,
        "mode": m.mode,
        "rows": m.n_vectors,
        "model": m.model_id,
        "head": m.head,
        "dim": m.dim,
        "factory": m.factory,
    }
