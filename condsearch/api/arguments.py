"""The Python API's argument checks: what a caller passes, as the types the jobs take, or one-line refusals."""

from __future__ import annotations

import builtins
import numbers
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from condsearch.errors import CondsearchError, CorpusError
from condsearch.model.artifacts import MODES, ROUTER_AUTO, ROUTER_DEFAULT, ROUTER_NONE, Mode

#: what ``router=`` may name besides a folder (as `condsearch index --router`)
ROUTER_NAMES = (ROUTER_AUTO, ROUTER_DEFAULT, ROUTER_NONE)


def _strings(values: Iterable[object], what: str, each: str) -> list[str]:
    """Return values as a list, refusing any that is not a string or not valid UTF-8, in one line."""
    from condsearch.corpus import check_utf8

    if isinstance(values, bytes | bytearray) or not isinstance(values, Iterable):
        raise CondsearchError(f"{what} must be a list of strings, not {type(values).__name__}")
    values = list(values)
    for value in values:
        if not isinstance(value, str):
            raise CondsearchError(f"{what} must be strings, not {type(value).__name__}")
    check_utf8(values, each)
    return values  # type: ignore[return-value]


def _ids(ids: object) -> list[str | int]:
    """Return ids as a list of strings or integers (a bool is neither), refusing anything else in one line."""
    if isinstance(ids, str | bytes | bytearray) or not isinstance(ids, Iterable):
        raise CondsearchError(f"ids must be a list of strings or integers, not {type(ids).__name__}")
    out = list(ids)
    for i in out:
        if isinstance(i, bool) or not isinstance(i, str | numbers.Integral):
            raise CondsearchError(f"ids must be strings or integers, not {type(i).__name__}")
    return [i if isinstance(i, str) else int(i) for i in out]


def _metadata(metadata: object, n: int) -> builtins.list[dict[str, Any] | None] | None:
    """Return upsert's metadata as one dict (or None) per row, refusing any other shape or count in one line."""
    from condsearch.corpus import is_table

    if metadata is None:
        return None
    if is_table(metadata):
        import pyarrow as pa

        table = metadata if isinstance(metadata, pa.Table | pa.RecordBatch) else pa.Table.from_pandas(metadata)
        metadata = table.to_pylist()
    if isinstance(metadata, dict | str | bytes) or not isinstance(metadata, Iterable):
        raise CondsearchError(f"metadata must be a list of dicts, one per text, not {type(metadata).__name__}")
    rows = builtins.list(metadata)
    if len(rows) != n:
        raise CondsearchError(f"{len(rows)} metadata entries for {n} texts: give one per text")
    for row in rows:
        if row is not None and not (isinstance(row, dict) and all(isinstance(c, str) for c in row)):
            raise CondsearchError(f"metadata entries must be dicts by column name (or None), not {type(row).__name__}")
    return rows


def _condition(condition: object, what: str = "the condition must be a string") -> str:
    """Return a condition stripped, refusing one that is not a string, is blank or invisible or is not valid UTF-8.

    Not yet normalised: finding an index normalises it, and building one checks it as given first.
    """
    from condsearch.store import check_condition

    if not isinstance(condition, str):
        raise CondsearchError(f"{what}, not {type(condition).__name__}")
    try:
        condition.encode("utf-8")
    except UnicodeEncodeError:
        raise CorpusError(f"the condition {ascii(condition[:60])} is not valid UTF-8") from None
    check_condition(condition)
    return condition.strip()


def _conditions(conditions: object) -> list[str]:
    """Return the conditions to index under: one string or a list of them, at least one, each one a new index takes."""
    from condsearch.store import check_new_condition

    if isinstance(conditions, str):
        return [check_new_condition(_condition(conditions))]
    if not isinstance(conditions, Sequence):
        raise CondsearchError(f"conditions must be strings, not {type(conditions).__name__}")
    if not conditions:
        raise CondsearchError("no condition given: name at least one to index under")
    return [check_new_condition(_condition(c, "conditions must be strings")) for c in conditions]


def _k(k: object) -> int:
    """Return k as an int: any integer (numpy's too) but a bool; a float or anything else is refused."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise CondsearchError(f"k must be an integer, not {type(k).__name__} {k!r}")
    return int(k)


def _mode(mode: object, model: str | None, *, profile: bool, router: bool, kept: Mode | None = None) -> Mode:
    """Return the mode named, or the front ends' default's (auto: as ``index --mode auto`` resolves it).

    Anything but 'auto', 'case' or 'csr' is refused in one line.
    """
    from condsearch.model.artifacts import DEFAULT_MODE, MODE_AUTO, resolve_mode

    if mode is None:
        mode = DEFAULT_MODE  # read when called: the one home of the default, which the CLI reads too
    if not isinstance(mode, str) or mode not in (MODE_AUTO, *MODES):
        raise CondsearchError(f"mode must be 'auto', {' or '.join(repr(m) for m in MODES)}, not {mode!r}")
    return resolve_mode(mode, model, case_settings=profile, router=router, kept=kept)


def _router(router: object) -> str | None:
    """Return router as a string (a folder's path), None for none given; other types and blanks are refused."""
    if router is None:
        return None
    names = ", ".join(repr(n) for n in ROUTER_NAMES)
    if isinstance(router, Path):
        return str(router)
    if not isinstance(router, str):
        raise CondsearchError(f"router must be {names} or a router folder, not {type(router).__name__}")
    if not router.strip():
        raise CondsearchError(f"router must be {names} or a router folder, not {router!r}")
    return router
