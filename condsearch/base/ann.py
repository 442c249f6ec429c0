"""Approximate indexes: which one to build for a corpus, what to train it on, how to search it.

Pure functions on sizes, strings and FAISS index objects; no files. The choice of
``--index-factory auto`` follows the usual trade-off (exact search while it is cheap, a graph
while the full vectors fit the memory budget, inverted lists over compressed codes past that);
its thresholds are this project's own and are measured in ``benchmarks/systems/ann.py``.
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
SEARCH_PARAMS = ("nprobe", "efSearch", "max_codes")
#: the largest value of each: FAISS stores them in C ints and sizes its search heaps by them, so a
#: bigger one wraps negative or makes every later query fail to allocate (nprobe is also at most nlist)
SEARCH_PARAM_MAX = {"nprobe": 1 << 20, "efSearch": 1 << 16, "max_codes": 1 << 40}
#: the factory strings condsearch builds, checked before FAISS sees them: FAISS aborts the process on
#: some others (HNSW0, PQ4x0) and cannot add rows to others (IDMap, NSG) the way the store does
FACTORY_FORMS = (
    "Flat, HNSW<M>[,Flat|,SQ<t>|,PQ<m>], IVF<lists>,Flat|SQ<t>|PQ<m>[x<bits>], PQ<m>[x<bits>], SQ<t> or auto"
)
HNSW_M_RANGE = (2, 256)
IVF_LISTS_MAX = 1 << 20
PQ_BITS_RANGE = (1, 16)
SQ_TYPES = ("4", "6", "8", "fp16")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_NUMBER = r"[0-9]{1,9}"  # more digits are out of every range, and FAISS would wrap them
_STRUCTURE = re.compile(rf"HNSW(?P<hnsw_m>{_NUMBER})|IVF(?P<nlist>{_NUMBER})")
_CODES = re.compile(rf"Flat|SQ(?P<sq>[0-9a-z]{{1,9}})|PQ(?P<pq_m>{_NUMBER})(?:x(?P<pq_bits>{_NUMBER}))?")


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


@dataclass(frozen=True)
class FactorySpec:
    """A factory string condsearch builds, parsed: its graph or inverted lists, and how it codes rows."""

    factory: str
    hnsw_m: int = 0  # graph degree of HNSW; 0: no graph
    nlist: int = 0  # inverted lists of IVF; 0: none
    pq_m: int = 0  # product quantizer: sub-vectors per row (bytes at 8 bits); 0: none
    pq_bits: int = 0
    sq: str = ""  # scalar quantizer: bits per component, or fp16


def parse_factory(text: object) -> FactorySpec:
    """Parse a factory string of the forms in :data:`FACTORY_FORMS`; raise ValueError for any other.

    Checks what needs no corpus: the form and the ranges of its numbers (``auto`` is not a factory).
    """
    head, comma, rest = text.partition(",") if isinstance(text, str) else ("", "", "")
    structure = _STRUCTURE.fullmatch(head)
    if structure is None:  # codes alone: Flat, PQ, SQ
        codes = _CODES.fullmatch(text) if isinstance(text, str) else None
    else:  # HNSW's codes default to Flat; IVF names its own
        codes = _CODES.fullmatch(rest if comma or structure["nlist"] is not None else "Flat")
    if codes is None:
        raise ValueError(f"index factory {text!r} is not supported; use {FACTORY_FORMS}")
    found = {k: v for m in (structure, codes) if m is not None for k, v in m.groupdict().items() if v is not None}
    spec = FactorySpec(
        str(text),
        hnsw_m=int(found.get("hnsw_m", 0)),
        nlist=int(found.get("nlist", 0)),
        pq_m=int(found.get("pq_m", 0)),
        pq_bits=int(found.get("pq_bits", 8)) if "pq_m" in found else 0,
        sq=found.get("sq", ""),
    )
    low, high = HNSW_M_RANGE
    if "hnsw_m" in found and not low <= spec.hnsw_m <= high:
        raise ValueError(f"index factory {text!r}: HNSW's M must be {low} to {high}")
    if "nlist" in found and not 1 <= spec.nlist <= IVF_LISTS_MAX:
        raise ValueError(f"index factory {text!r}: IVF's lists must be 1 to {IVF_LISTS_MAX}")
    low, high = PQ_BITS_RANGE
    if "pq_m" in found and (spec.pq_m < 1 or not low <= spec.pq_bits <= high):
        raise ValueError(f"index factory {text!r}: PQ<m>x<bits> needs m at least 1 and bits {low} to {high}")
    if "sq" in found and spec.sq not in SQ_TYPES:
        raise ValueError(f"index factory {text!r}: SQ<t> takes t among {', '.join(SQ_TYPES)}")
    return spec


def walks_lists_or_graph(factory: str) -> bool:
    """Return whether an index of this factory answers a query by probing IVF lists or walking an HNSW graph.

    FAISS does one query's walk on one thread, so a server gives such an index one search thread
    (:class:`condsearch.query.resident.Resident`); an unparsable string (a Milvus index) is not one.
    """
    try:
        spec = parse_factory(factory)
    except ValueError:
        return False
    return bool(spec.nlist or spec.hnsw_m)


def check_factory(text: object, n: int, d: int) -> FactorySpec:
    """Parse a factory string and check it fits n vectors of d dimensions; raise ValueError if not.

    Nothing reaches FAISS unchecked: some factory strings end the process inside it.
    """
    spec = parse_factory(text)
    if spec.pq_m and d % spec.pq_m:
        raise ValueError(f"index factory {text!r}: PQ's {spec.pq_m} sub-vectors must divide the dimension {d}")
    too_few_for_pq = spec.pq_m > 0 and (1 << spec.pq_bits) > n  # each of its codebooks has 2**bits centroids
    if spec.nlist > n or too_few_for_pq:
        raise ValueError(f"cannot train {text!r} on {n} vectors: too few for this index")
    return spec


def parse_search_params(text: object) -> dict[str, int]:
    """Parse 'nprobe=32,efSearch=64' into a dict of whole numbers in range; raise ValueError for anything else."""
    if not isinstance(text, str):
        raise ValueError(f"search parameters {text!r} are not text such as 'nprobe=32'")
    params: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = (s.strip() for s in part.partition("="))
        if not sep or name not in SEARCH_PARAMS:
            raise ValueError(f"search parameter {part!r}: use name=value with a name among {', '.join(SEARCH_PARAMS)}")
        if not re.fullmatch(r"[0-9]+", value) or not value.strip("0"):
            raise ValueError(f"search parameter {part[:40]!r}: the value must be a positive whole number")
        if len(value.lstrip("0")) > 15 or int(value) > SEARCH_PARAM_MAX[name]:
            raise ValueError(f"search parameter {part[:40]!r}: {name} is at most {SEARCH_PARAM_MAX[name]}")
        params[name] = int(value)
    return params


def check_index_options(factory: str, search_params: str) -> None:
    """Refuse a factory string or search parameters of an unsupported form (ValueError), before any model loads."""
    if factory != AUTO:
        parse_factory(factory)
    parse_search_params(search_params)


def format_search_params(params: dict[str, int]) -> str:
    """Return the canonical text of parsed search parameters (recorded in manifests)."""
    return ",".join(f"{k}={int(v)}" for k, v in params.items())


def apply_search_params(index: faiss.Index, text: object) -> faiss.Index:
    """Set checked search parameters on an index with FAISS's ParameterSpace; raise ValueError if any cannot be.

    Refuses a parameter out of range (:func:`parse_search_params`; nprobe above the index's lists) or
    one the index type has no use for.
    """
    import faiss  # lazily: the CLI reads IndexConfig for --help

    space = faiss.ParameterSpace()
    for name, value in parse_search_params(text).items():
        if name == "nprobe":
            nlist = _nlist(index)
            if nlist and value > nlist:
                raise ValueError(f"search parameter nprobe={value}: this index has only {nlist} lists")
        try:
            space.set_index_parameter(index, name, float(value))
        except RuntimeError:
            raise ValueError(f"search parameter {name!r} does not apply to this index type") from None
    return index


def _nlist(index: faiss.Index) -> int:
    """Return the inverted lists of an IVF index, 0 for other types."""
    import faiss

    try:
        return int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:
        return 0


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
