"""``DELETE /indexes/{corpus}[?condition=]``: remove a corpus's indexes through the server (issue 59).

404 for an unknown corpus or condition, 409 while a build or change of the corpus holds its locks; the
API key, when the server has one, is checked before (as for every route). Queries under way finish on
the indexes they hold in memory; the resident copies are forgotten at once (:mod:`condsearch.store.lifecycle`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from condsearch.errors import UnknownCondition, first_line
from condsearch.serve.refusals import RequestError
from condsearch.store import CorpusBusy, IndexStore, UnknownCorpus, drop

if TYPE_CHECKING:
    from condsearch.query import Resident


def drop_route(resident: Resident, corpus: str, condition: str | None) -> dict[str, Any]:
    """Drop the corpus's indexes (or condition's) from the resident's store; return the names removed."""
    store = resident.store
    if not isinstance(store, IndexStore):
        raise RequestError(405, "this server's store is searched only: remove indexes where they are written")
    try:
        removed = drop(store, corpus, condition)
    except (UnknownCorpus, UnknownCondition) as exc:
        raise RequestError(404, first_line(exc)) from exc
    except CorpusBusy as exc:
        raise RequestError(409, first_line(exc)) from exc
    resident.listing(fresh=True)  # forget the resident copies now
    return {"deleted": removed, "corpus": corpus}
