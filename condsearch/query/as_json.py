"""The JSON shapes that `query --json`, `list --json` and the server share, built in one place."""

from __future__ import annotations

import datetime
import math
from typing import TYPE_CHECKING, Any

from condsearch.model.artifacts.profiles import MODE_CSR

if TYPE_CHECKING:
    from condsearch.query.hits import Hits
    from condsearch.store.manifest import Manifest


from condsearch.query.hits import METADATA_COLUMN, SCORE_PLACES, Z_PLACES


def query_answer(hits: Hits) -> dict[str, Any]:
    """Return one query's answer: ``{query, condition, results: [{rank, id, score, text}]}``, scores to 6 places.

    Calibrated hits add ``z`` (4 places) to each result, after ``score``; an index that keeps columns adds
    ``metadata`` after ``text``, each value as :func:`json_value` writes it.
    """
    results = []
    for h in hits:
        result: dict[str, Any] = {"rank": h.rank, "id": h.id, "score": round(h.score, SCORE_PLACES)}
        if hits.calibrated and h.z is not None:
            result["z"] = round(h.z, Z_PLACES)
        result["text"] = h.text
        if hits.metadata_columns:
            result[METADATA_COLUMN] = {name: json_value(value) for name, value in h.metadata.items()}
        results.append(result)
    return {"query": hits.query, "condition": hits.condition, "results": results}


def json_value(value: Any) -> Any:
    """Return a kept column's value as JSON carries it: dates and times in ISO 8601, decimals and bytes as strings,
    a NaN or an infinity as null (JSON has none); lists and dicts value by value."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime.date | datetime.time):  # a datetime is a date
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return str(value)  # Decimal and the like: exactly as written


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
