"""Every number a training run takes or writes is finite: configs refuse nan and ±inf, records write them as null.

A float config field set to nan slips past range checks (every comparison with nan is false) and
then trains nothing, or trains on and records ``NaN``, which is not JSON. Each training config calls
:func:`check_finite_fields`; every JSON file a run writes (checkpoint state, a model's
``finetune.json``, the summary in an artifact's config) goes through :func:`finite_record`, which
writes an undefined score (a dev set whose labels are all equal has no Spearman) as null.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any


def check_finite_fields(config: Any) -> None:
    """Raise ValueError naming the first float field of a dataclass config that holds nan or ±inf."""
    for field in fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{field.name} must be a finite number, not {value}")


def finite_record(value: Any) -> Any:
    """Return a JSON-like value (dicts, lists, tuples, scalars) with each nan or ±inf float as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite_record(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_record(v) for v in value]
    return value


def dumps_record(value: Any, *, indent: int | None = None) -> str:
    """Return value as strict JSON (no NaN or Infinity): non-finite floats become null."""
    return json.dumps(finite_record(value), indent=indent, allow_nan=False)
