"""Temporary, for benchmarks/on_demand.py alone: delete when that script moves into a group.

on_demand.py still runs as ``python benchmarks/on_demand.py`` and imports ``common`` as a sibling module; the
shared code now lives in benchmarks/_lib/common.py (``from benchmarks._lib.common import ...`` once it moves).
"""

from _lib.common import log, read_texts, run_info, write_json

__all__ = ["log", "read_texts", "run_info", "write_json"]
