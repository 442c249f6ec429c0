"""`condsearch serve`: an HTTP JSON query server with resident models and indexes, and a search page.

It loads each model once, keeps indexes resident (from a folder or Milvus), batches queries that
arrive together, limits what a request may cost and serves a search page at ``/`` (``page``, the
files in ``static/``: HTML, JavaScript, CSS).

Importing this package is cheap; FastAPI, uvicorn, torch and FAISS load only in the modules that
need them (``app``, ``page``, ``server``); the resident indexes and models are
:class:`condsearch.query.Resident`. Front door: the names below, each loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base import lazy_names

if TYPE_CHECKING:
    from condsearch.serve.config import API_KEY_ENV, LOG_FORMATS, ServeConfig, check_cors_origin, is_loopback
    from condsearch.serve.server import BackgroundServer, build_app, run_server

__all__ = [
    "API_KEY_ENV",
    "LOG_FORMATS",
    "BackgroundServer",
    "ServeConfig",
    "build_app",
    "check_cors_origin",
    "is_loopback",
    "run_server",
]

#: public name -> the module of this package it is imported from, when first asked for (so importing stays cheap)
_HOMES = {
    "API_KEY_ENV": "config",
    "BackgroundServer": "server",
    "LOG_FORMATS": "config",
    "ServeConfig": "config",
    "build_app": "server",
    "check_cors_origin": "config",
    "is_loopback": "config",
    "run_server": "server",
}


__getattr__ = lazy_names(__name__, _HOMES)
