"""Where the front ends (CLI, server, Python API) and the store look for indexes by default, held once.

Free of imports beyond the standard library, so that the CLI reads it for --help without loading
numpy or FAISS. Every other default lives with the config or module of its concept, and the CLI
reads it from there: the index type in :class:`condsearch.base.ann.IndexConfig`, the server's in
:class:`condsearch.serve.config.ServeConfig` (its reload interval too), pairs per forward pass in
:data:`condsearch.model.encoders.base.ENCODE_BATCH_SIZE`, the index modes (case, csr) in
:data:`condsearch.model.artifacts.profiles.MODES`, a query's k in
:class:`condsearch.query.config.QueryConfig`, the router variants in :mod:`condsearch.model.csr.variants`,
training's in its config dataclasses.
"""

from __future__ import annotations

import os
from pathlib import Path

#: the environment variable naming the index folder
INDEX_DIR_ENV = "CONDSEARCH_INDEX_DIR"
#: the index folder when the environment names none (relative: under the current folder)
DEFAULT_INDEX_DIR = Path("indexes")


def default_index_dir() -> Path:
    """Return ``$CONDSEARCH_INDEX_DIR`` or ``./indexes``."""
    return Path(os.environ.get(INDEX_DIR_ENV) or DEFAULT_INDEX_DIR)
