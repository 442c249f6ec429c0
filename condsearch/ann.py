"""Approximate indexes: which one to build for a corpus, what to train it on, how to search it.

Pure functions on sizes, strings and FAISS index objects; no files. The choice of
``--index-factory auto`` follows the usual trade-off (exact search while it is cheap, a graph
while the full vectors fit the memory budget, inverted lists over compressed codes past that);
its thresholds are this project's own and are measured in ``benchmarks/ann.py``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import faiss
    import numpy as np

AUTO = "auto"
#: search parameters FAISS's ParameterSpace knows for the index types condsearch builds
SEARCH_PARAMS = ("nprobe", "efSearch", "ht", "max_codes")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class IndexConfig:
    """How an index is chosen and searched; the CLI's defaults are read from here."""

    factory: str = "Flat"
    search_params: str = ""
    max_index_memory: str = "4G"
    #: up to this many rows, exact search is fast enough that ``auto`` keeps it
    exact_rows: int = 100_000
    #: graph degree of the HNSW index ``auto`` builds, and the efSearch it searches with
    hnsw_m: int = 32
    hnsw_ef_search: int = 128
    #: rows per IVF list that ``auto`` aims at, and the share of lists it probes
    rows_per_list: int = 1_000
    probe_share: float = 1 / 32
    #: training rows per IVF centroid (FAISS warns below 39) and at least this many for PQ
    train_per_list: int = 64
    train_min: int = 1 << 16


@dataclass(frozen=True)
class IndexPlan:
    """A factory string and the search parameters to record with it."""

    factory: str
    search_params: str


def parse_memory(text: str) -> int:
    """Return bytes for '512M', '4G', '1.5g' or a plain byte count; raise ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)i?[bB]?\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"not a memory size: {text!r} (use e.g. 512M or 4G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_search_params(text: str) -> dict[str, float]:
    """Parse 'nprobe=32,efSearch=64' into a dict; raise ValueError for anything else."""
    params: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in SEARCH_PARAMS:
            raise ValueError(f"search parameter {part!r}: use name=value with a name among {', '.join(SEARCH_PARAMS)}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"search parameter {part!r}: {value.strip()!r} is not a number") from None
        if number <= 0 or number != int(number):
            raise ValueError(f"search parameter {part!r}: the value must be a positive whole number")
        params[name] = number
    return params


def format_search_params(params: dict[str, float]) -> str:
    """Return the canonical text of parsed search parameters (recorded in manifests)."""
    return ",".join(f"{k}={int(v)}" for k, v in params.items())


def apply_search_params(index: faiss.Index, text: str) -> faiss.Index:
    """Set search parameters on an index with FAISS's ParameterSpace; raise ValueError if it has none such."""
    import faiss  # lazily: the CLI reads IndexConfig for --help

    space = faiss.ParameterSpace()
    for name, value in parse_search_params(text).items():
        try:
            space.set_index_parameter(index, name, value)
        except RuntimeError:
            raise ValueError(f"search parameter {name!r} does not apply to this index type") from None
    return index


def flat_bytes(n: int, d: int) -> int:
    """Return the memory of an exact index: 4 bytes per component."""
    return 4 * n * d


def hnsw_bytes(n: int, d: int, m: int) -> int:
    """Return about the memory of HNSW{m}: the vectors, 2m level-0 links and the upper levels' share."""
    return n * (4 * d + 4 * 2 * m + 4 * m // 2 + 8)


def ivf_pq_bytes(n: int, d: int, nlist: int, code: int) -> int:
    """Return about the memory of IVF{nlist},PQ{code}: codes and ids per row, centroids and codebooks."""
    return n * (code + 8) + 4 * nlist * d + 4 * 256 * d


def _pq_codes(d: int) -> list[int]:
    """Return PQ code sizes (bytes per vector) that split d evenly, largest first."""
    return [m for m in (64, 48, 32, 24, 16, 12, 8, 4) if m <= d and d % m == 0]


def choose_index(n: int, d: int, max_bytes: int, config: IndexConfig = IndexConfig()) -> IndexPlan:
    """Choose Flat, HNSW or IVF-PQ for n vectors of d dimensions within max_bytes; raise ValueError if none fits."""
    if n <= config.exact_rows and flat_bytes(n, d) <= max_bytes:
        return IndexPlan("Flat", "")
    if hnsw_bytes(n, d, config.hnsw_m) <= max_bytes:
        return IndexPlan(f"HNSW{config.hnsw_m}", f"efSearch={config.hnsw_ef_search}")
    nlist = ivf_nlist(n, config)
    for code in _pq_codes(d):
        if ivf_pq_bytes(n, d, nlist, code) <= max_bytes:
            nprobe = max(1, min(nlist, round(nlist * config.probe_share)))
            return IndexPlan(f"IVF{nlist},PQ{code}", f"nprobe={nprobe}")
    raise ValueError(f"no index of {n} {d}-d vectors fits in {max_bytes} bytes; raise --max-index-memory")


def ivf_nlist(n: int, config: IndexConfig) -> int:
    """Return a power of two near both n / rows_per_list and 4·sqrt(n), so lists are neither huge nor tiny."""
    target = max(16.0, min(n / config.rows_per_list, 4 * math.sqrt(n)) if n else 16.0)
    return int(2 ** round(math.log2(target)))


def ivf_lists(factory: str) -> int:
    """Return the number of inverted lists a factory string asks for (0 for non-IVF indexes)."""
    match = re.search(r"IVF(\d+)", factory)
    return int(match.group(1)) if match else 0


def train_rows(n: int, factory: str, config: IndexConfig = IndexConfig()) -> int:
    """Return how many rows to train an index on: enough per IVF list and for PQ codebooks, at most n."""
    return min(n, max(config.train_min, config.train_per_list * ivf_lists(factory)))


def sample_rows(n: int, size: int, seed: int = 0) -> np.ndarray:
    """Return sorted distinct row numbers, a seeded uniform sample of size out of n."""
    import numpy as np

    if size >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False)).astype(np.int64)
