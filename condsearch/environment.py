"""The environment settings condsearch reads, each checked at once: a long-running command refuses a bad one at start.

A server that started with ``CONDSEARCH_CPU_KIND=amx2`` said it was healthy and answered every query 500
(issue 58). `condsearch serve` calls :func:`check_environment` before it listens, and exits with its one
line. Each setting is read where it is used (:func:`condsearch.base.cpu_kind.cpu_kind`,
:func:`condsearch.base.output_cache.default_cache_dir`, the CLI's ``envvar`` options; the API key's,
``CONDSEARCH_API_KEY``, is checked with the flag it stands for, by ``serve``); this module only checks them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from condsearch.base.cpu_kind import CPU_KIND_ENV, check_kind
from condsearch.base.output_cache import CACHE_DIR_ENV
from condsearch.errors import CondsearchError


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse, in one line (CondsearchError), an environment setting condsearch would fail on later."""
    env = os.environ if environ is None else environ
    kind = env.get(CPU_KIND_ENV)
    if kind:
        check_kind(kind)
    folder = env.get(CACHE_DIR_ENV)  # CONDSEARCH_INDEX_DIR is --index-dir's, checked by click as the flag is
    if folder and Path(folder).exists() and not Path(folder).is_dir():
        raise CondsearchError(f"{CACHE_DIR_ENV}={folder!r} is not a folder")
