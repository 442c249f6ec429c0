"""The statuses each route answers, as the OpenAPI schema lists them (FastAPI's ``responses=``).

Every route may get the outer layers' refusals before its own code runs (:data:`OUTER`): a missing
key (401), a body too slow or too large (408, 413), a Host that is not this machine's (421) and the
500 of a crash; each route adds its own (:func:`error_responses`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from condsearch.serve.refusals import ErrorResponse

Responses = dict[int | str, dict[str, Any]]

DESCRIPTIONS = {
    202: "Accepted: the condition is being built on demand; poll the job named (GET /builds/ID).",
    400: "A malformed request (bad JSON; on /v1, what OpenAI refuses with a 400).",
    401: "Missing or wrong API key (a server started with --api-key).",
    404: "Not found: no such index, corpus, condition, model or build.",
    405: "Not allowed on this server's store (a Milvus store is searched only).",
    408: "The request body arrived too slowly.",
    409: "A conflict: several corpora or models match, the index records no background, or a build holds the corpus.",
    413: "The request body is too large.",
    421: "A keyless server on loopback answers requests for its own names only (Host).",
    422: "A request that parses but is refused: a field's type or value, too many or too long texts.",
    429: "Too many builds on demand asked for by this client.",
    500: "An internal error (a damaged index, a model that changed since indexing).",
    503: "Too busy: the request waited too long for its batch, or too many builds are pending.",
    507: "The indexes built on demand reached the server's cap.",
}
OUTER = (401, 408, 413, 421, 500)


def error_responses(*statuses: int, model: type[BaseModel] = ErrorResponse) -> Responses:
    """Return ``responses=`` for a route that answers statuses itself, besides :data:`OUTER`'s."""
    return {
        status: {"description": DESCRIPTIONS[status], **({"model": model} if status >= 400 else {})}
        for status in sorted({*OUTER, *statuses})
    }
