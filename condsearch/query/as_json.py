"""The JSON shapes that `query --json`, `list --json` and the server share, built in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from condsearch.artifacts.profiles import MODE_CSR

if TYPE_CHECKING:
    from condsearch.query.hits import Hits
    from condsearch.store.manifest import Manifest


from condsearch.query.hits import SCORE_PLACES, Z_PLACES


def query_answer(hits: Hits) -> dict[str, Any]:
    """Return one query's answer: ``{query, condition, results: [{rank, id, score, text}]}``, scores to 6 places.

    Calibrated hits add ``z`` (4 places) to each result, after ``score``.
    """
    results = []
    for r, h in enumerate(hits):
        result: dict[str, Any] = {"rank": r + 1, "id": h.id, "score": round(h.score, SCORE_PLACES)}
        if hits.calibrated and h.z is not None:
            result["z"] = round(h.z, Z_PLACES)
        results.append({**result, "text": h.text})
    return {"query": hits.query, "condition": hits.condition, "results": results}


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
        # what makes a csr index's vectors, as its head does a CASE index's ('none', 'default' or a folder)
        "router": _router(m),
        "dim": m.dim,
        "factory": m.factory,
        "score_background": m.score_background,  # {}: none recorded (condsearch.query.calibration)
    }


def _router(manifest: Manifest) -> str | None:
    """Return the router a csr index records ('none', 'default' or a folder); None for a CASE index."""
    router = manifest.encoder.get("router")
    return router if manifest.mode == MODE_CSR and isinstance(router, str) else None
