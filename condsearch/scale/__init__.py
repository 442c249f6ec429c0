"""Past one machine: encoding on Ray Data (:mod:`.ray_encode`) and indexes in Milvus (:mod:`.milvus`).

Both are optional extras (``condsearch[ray]``, ``condsearch[milvus]``); nothing in the core imports
them, and each module imports its engine only when called, failing with one line when it is missing.
Front door: the names below (:func:`ray_index_conditions`, :func:`export_indexes` and
:func:`parse_store` first), each loaded on first use, so that importing this package loads neither
Ray nor pymilvus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base.front_door import lazy_names

if TYPE_CHECKING:
    from condsearch.scale.config import RayConfig, check_address
    from condsearch.scale.export import export_indexes
    from condsearch.scale.extras import MILVUS_LITE, MILVUS_SERVER, missing_extra
    from condsearch.scale.lite import check_lite_path
    from condsearch.scale.milvus import parse_store
    from condsearch.scale.ray_encode import ray_index_conditions

__all__ = [
    "MILVUS_LITE",
    "MILVUS_SERVER",
    "RayConfig",
    "check_address",
    "check_lite_path",
    "export_indexes",
    "missing_extra",
    "parse_store",
    "ray_index_conditions",
]

#: public name -> the module of this package it is imported from, when first asked for (so importing stays cheap)
_HOMES = {
    "MILVUS_LITE": "extras",
    "MILVUS_SERVER": "extras",
    "RayConfig": "config",
    "check_address": "config",
    "check_lite_path": "lite",
    "export_indexes": "export",
    "missing_extra": "extras",
    "parse_store": "milvus",
    "ray_index_conditions": "ray_encode",
}


__getattr__ = lazy_names(__name__, _HOMES)
