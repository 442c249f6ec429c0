"""Finding vectors: FAISS indexes over L2-normalised vectors, and an exact reference search."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import faiss
import numpy as np

from condsearch.base.ann import IndexConfig, apply_search_params, check_factory, sample_rows, train_rows
from condsearch.errors import first_line


class Rows(Protocol):
    """An (n, d) float32 file of vectors read by rows (:class:`condsearch.store.vectors.VectorFile`)."""

    shape: tuple[int, int]

    def __getitem__(self, rows: slice) -> np.ndarray: ...

    def take(self, rows: Sequence[int] | np.ndarray, axis: int = 0) -> np.ndarray: ...


DEFAULT_FACTORY = IndexConfig.factory  # exact search; the home of this default is IndexConfig

#: from this many queries in one search, FAISS's exact search scores them by one matrix product (BLAS)
#: instead of one scan of the rows per query (FAISS 1.15 waits for 128,000). condsearch's own searches of a CPU
#: flat inner-product index go through :func:`_blas_top_k` whatever the count; this covers FAISS's product
#: where it still runs (an L2 flat index, or a caller's own ``index.search``). The scores can differ from a
#: scan's in the last bits of float32, as two BLAS builds' do.
FLAT_BLAS_MIN_QUERIES = 8
faiss.cvar.distance_compute_blas_threshold = FLAT_BLAS_MIN_QUERIES
#: FAISS's own thread count (every core, or OMP_NUM_THREADS), read on import before anything sets it
DEFAULT_SEARCH_THREADS = int(faiss.omp_get_max_threads())
#: the threads a server gives an IVF or HNSW index unless asked: FAISS walks one query's lists or graph on one
#: thread, and more only contended with the encoder's (1M rows, IVF: p50 10-12 against 21-31 ms; benchmarks/systems)
WALK_SEARCH_THREADS = 1


@dataclass(frozen=True)
class SearchResult:
    """Batched neighbours: scores (n_queries, k) float32, higher is better; ids (n_queries, k) int64 row numbers.

    From :func:`search`, k is min(k asked, rows indexed) and every id is a row. An id of -1 (FAISS's
    "none") is left only by an index type that :func:`search` cannot search exhaustively (none that
    condsearch builds on the CPU); :attr:`n_found` counts the others, per query.
    """

    scores: np.ndarray
    ids: np.ndarray

    @property
    def n_found(self) -> np.ndarray:
        """Return the results each query got: (n_queries,) int64, ids other than -1."""
        return (self.ids >= 0).sum(axis=1)


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Return float32 copies of the rows scaled to unit length (zero rows stay zero)."""
    out = np.array(vectors, dtype=np.float32, order="C", copy=True)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


def build_index(
    vectors: np.ndarray | Rows,
    factory: str = DEFAULT_FACTORY,
    *,
    search_params: str = "",
    train_size: int | None = None,
    chunk_rows: int = 1 << 16,
) -> faiss.Index:
    """Build an inner-product index over already normalised (n, d) float32 vectors.

    ``vectors`` is an array or anything with ``shape``, row slicing and ``take(rows, axis=0)``
    (a file of vectors read by rows): an index that needs training is trained on a seeded sample
    of ``train_size`` rows [default: :func:`condsearch.base.ann.train_rows`], then rows are added
    ``chunk_rows`` at a time, so no copy of all vectors is made. ``search_params`` (e.g.
    ``nprobe=32``) are set with FAISS's ParameterSpace.

    Raises ValueError for a factory string of another form than :data:`condsearch.base.ann.FACTORY_FORMS`
    (checked before FAISS sees it), a training set too small for it, search parameters that do not
    apply or are out of range, and anything else FAISS refuses.
    """
    n, d = vectors.shape
    check_factory(factory, n, d)
    try:
        index = faiss.index_factory(d, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise ValueError(f"FAISS rejects index factory {factory!r}") from exc
    apply_search_params(index, search_params)
    if not index.is_trained:
        sample = sample_rows(n, train_size if train_size is not None else train_rows(n, factory))
        try:
            index.train(np.ascontiguousarray(vectors.take(sample, axis=0), dtype=np.float32))
        except RuntimeError as exc:
            raise ValueError(f"cannot train {factory!r} on {len(sample)} vectors: too few for this index") from exc
    try:
        for start in range(0, n, chunk_rows):
            index.add(np.ascontiguousarray(vectors[start : start + chunk_rows], dtype=np.float32))
    except RuntimeError as exc:
        raise ValueError(f"FAISS cannot build {factory!r}: {first_line(exc)}") from exc
    return index


def gpu_available() -> bool:
    """Return whether this FAISS build can place indexes on a CUDA device."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class TorchFlatIndex:
    """Exact inner-product search with torch on one device, standing in for a flat FAISS index.

    Used on CUDA machines whose FAISS build has no GPU support. Like FAISS, it pads results
    past the corpus size with id -1 and score -3.4e38.
    """

    def __init__(self, vectors: np.ndarray, device: str) -> None:
        import torch

        self.device = torch.device(device)
        self.vectors = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(self.device)
        self.ntotal, self.d = self.vectors.shape

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (scores, ids), each (n_queries, k), as FAISS ``Index.search`` does."""
        import torch

        n = queries.shape[0]
        scores = np.full((n, k), -np.finfo(np.float32).max, dtype=np.float32)
        ids = np.full((n, k), -1, dtype=np.int64)
        top = min(k, self.ntotal)
        # Bound the (rows, ntotal) similarity block to about 256 MB of float32.
        step = max(1, (1 << 26) // max(1, self.ntotal))
        with torch.inference_mode():
            for start in range(0, n, step):
                q = torch.from_numpy(np.ascontiguousarray(queries[start : start + step], dtype=np.float32))
                best = torch.topk(q.to(self.device) @ self.vectors.T, top, dim=1)
                scores[start : start + step, :top] = best.values.cpu().numpy()
                ids[start : start + step, :top] = best.indices.cpu().numpy()
        return scores, ids


def torch_flat_index(index: faiss.Index, device: str) -> TorchFlatIndex | None:
    """Return a torch copy of a flat inner-product index on device, or None for other index types."""
    flat = faiss.downcast_index(index)
    if not isinstance(flat, faiss.IndexFlat) or flat.metric_type != faiss.METRIC_INNER_PRODUCT:
        return None
    return TorchFlatIndex(flat.reconstruct_n(0, flat.ntotal), device)


#: the largest k FAISS's GPU indexes select (its k-selection kernels); larger k searches the CPU copy
GPU_MAX_K = 2048
_gpu_resources: list[Any] = []  # one StandardGpuResources for the process, made on first use
_gpu_lock = threading.Lock()


def _shared_gpu_resources() -> Any:
    """Return the process's one ``faiss.StandardGpuResources`` (its scratch memory and streams), made once."""
    with _gpu_lock:
        if not _gpu_resources:
            _gpu_resources.append(faiss.StandardGpuResources())
        return _gpu_resources[0]


def to_search_device(index: faiss.Index) -> faiss.Index | TorchFlatIndex:
    """Move an index to the GPU: FAISS's GPU index when that build is installed, else torch for flat indexes.

    Every FAISS GPU copy shares one ``StandardGpuResources``, so a store of many indexes reserves
    the card's scratch memory once. Index types with no GPU version (HNSW) stay on the CPU.
    """
    if not gpu_available():
        import torch

        if torch.cuda.is_available():
            return torch_flat_index(index, "cuda") or index
        return index
    try:
        return faiss.index_cpu_to_gpu(_shared_gpu_resources(), 0, index)
    except RuntimeError:
        return index  # some index types have no GPU version; search on the CPU


def on_gpu(index: object) -> bool:
    """Return whether index is one of FAISS's GPU indexes."""
    return type(index).__name__.startswith("GpuIndex")


def search_threads(threads: int | None = None) -> int:
    """Set FAISS's OpenMP threads when given (>= 1); return the count now in force.

    OpenMP keeps the setting per calling thread (threads started otherwise use the process's default,
    every core or ``OMP_NUM_THREADS``): call it on the thread that searches.
    """
    if threads is not None:
        if threads < 1:
            raise ValueError(f"search threads must be at least 1, got {threads}")
        faiss.omp_set_num_threads(threads)
    return int(faiss.omp_get_max_threads())


def search(index: faiss.Index | TorchFlatIndex, queries: np.ndarray, k: int) -> SearchResult:
    """Return the k best rows for each normalised query, every row when k is at least their number.

    An approximate index can find fewer than k rows for a query (an HNSW graph from its entry point,
    IVF in the lists it probes); such a query is searched again over every row, so results are never
    short and never padded: the result has min(k, index.ntotal) columns.
    """
    if k <= 0:
        raise ValueError("k must be positive")
    k = min(k, index.ntotal)
    x = np.ascontiguousarray(queries, dtype=np.float32)
    if k == 0:  # an empty index: FAISS asserts k > 0
        return SearchResult(np.empty((len(x), 0), dtype=np.float32), np.empty((len(x), 0), dtype=np.int64))
    flat = _cpu_flat_ip(index)
    scores, ids = _blas_top_k(flat, x, k) if flat is not None else index.search(x, k)
    short = (ids < 0).any(axis=1)
    if short.any():
        again = _search_every_row(index, x[short], k)
        if again is not None:
            scores[short], ids[short] = again
    if flat is None:  # rows that score the same in row order, as _blas_top_k gives them, whatever the batch
        order = np.lexsort((ids, -scores))
        scores, ids = np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)
    return SearchResult(scores, ids)


def _cpu_flat_ip(index: faiss.Index | TorchFlatIndex) -> faiss.IndexFlat | None:
    """Return index as a CPU flat inner-product index (searched by :func:`_blas_top_k`), else None."""
    if isinstance(index, TorchFlatIndex):
        return None
    flat = faiss.downcast_index(index)
    if isinstance(flat, faiss.IndexFlat) and flat.metric_type == faiss.METRIC_INNER_PRODUCT:
        return flat
    return None


#: the most similarity scores one step of :func:`_blas_top_k` holds (float32: 64 MiB)
BLAS_BLOCK = 1 << 24


def _blas_top_k(flat: faiss.IndexFlat, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (scores, ids) of the k best rows of a flat inner-product index: one matrix product over its rows.

    NumPy's product runs on every BLAS thread, where FAISS scanned the rows once per query (one query
    to a thread) below FLAT_BLAS_MIN_QUERIES and, from there, used the BLAS bundled in its wheel (an
    OpenBLAS that runs its generic kernels on CPUs newer than itself, as on the Xeons measured). 100,000
    rows of 384 dims on 2 cores: one query 7.1-8.4 ms against FAISS's 13.7-17.2 (issue 61); a batch,
    benchmarks/systems/serving.md. The k-th best score of each query comes from FAISS's heaps over the
    scores (a pass, where a partition of every row cost 1.3 ms a query at 100,000 rows); the rows above
    it, and the first of the rows tied with it, are the answer. The rows are FAISS's own (no copy); scores
    equal FAISS's up to float32 rounding. Ties come in row order (:func:`search` puts an approximate index's
    answers in that order too), so a query gets the same rows alone and in a batch. Steps of queries keep
    the scores held to BLAS_BLOCK.
    """
    rows = faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)
    n = len(queries)
    scores = np.empty((n, k), dtype=np.float32)
    ids = np.empty((n, k), dtype=np.int64)
    step = max(1, BLAS_BLOCK // flat.ntotal)
    for start in range(0, n, step):
        # rows by queries, then turned: BLAS packs the few queries, not the many rows (2-8 queries: 15 ms
        # against 21-23 for queries by rows, 100,000 rows on 2 cores)
        sims = np.ascontiguousarray((rows @ queries[start : start + step].T).T)
        kth = _kth_best(sims, k) if k < flat.ntotal else None
        for i, row in enumerate(sims):
            if kth is not None:  # the k best; of the rows tied with the k-th best, the first ones, as FAISS keeps
                above = np.flatnonzero(row > kth[i])
                chosen = np.concatenate([above, np.flatnonzero(row == kth[i])[: k - len(above)]])
            else:
                chosen = np.arange(flat.ntotal)
            order = np.lexsort((chosen, -row[chosen]))  # best first; ties in row order
            scores[start + i], ids[start + i] = row[chosen[order]], chosen[order]
    return scores, ids


def _kth_best(sims: np.ndarray, k: int) -> np.ndarray:
    """Return each row's k-th largest value (k at most the row's length): FAISS's heap, one pass over each row.

    One heap call a row, each on one thread: FAISS's calls over many rows wake its OpenMP threads, which on
    2 cores wait on NumPy's BLAS threads from the product before (5 ms a search of 2,000 rows, against
    0.02 ms for the pass itself). The heap starts empty (every slot below any score) rather than by
    FAISS's heapify, for the same reason.
    """
    n, width = sims.shape
    best = np.full((n, k), -np.inf, dtype=np.float32)
    at = np.full((n, k), -1, dtype=np.int64)
    for i in range(n):
        heap = faiss.float_minheap_array_t()  # a min-heap keeps the largest; its top is the k-th largest
        heap.k, heap.nh = k, 1
        heap.val, heap.ids = faiss.swig_ptr(best[i]), faiss.swig_ptr(at[i])
        heap.addn(width, faiss.swig_ptr(sims[i]))
    return best[:, 0].copy()


def _search_every_row(
    index: faiss.Index | TorchFlatIndex, queries: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Search an approximate index exhaustively, over the same stored codes; None for an exhaustive one.

    HNSW: its storage (every row, as Flat, SQ or PQ codes). IVF: every list, with no cap on codes.
    """
    if isinstance(index, TorchFlatIndex):
        return None
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexHNSW):
        return inner.storage.search(queries, k)
    try:
        lists = faiss.extract_index_ivf(index).nlist
    except RuntimeError:
        return None
    every_list = faiss.SearchParametersIVF()
    every_list.nprobe, every_list.max_codes = lists, 0  # 0: no cap on codes scanned
    return index.search(queries, k, params=every_list)


def exact_search(corpus: np.ndarray, queries: np.ndarray, k: int) -> SearchResult:
    """Brute-force inner-product search, the reference FAISS results are checked against."""
    sims = queries.astype(np.float32) @ corpus.astype(np.float32).T
    k = min(k, corpus.shape[0])
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return SearchResult(np.take_along_axis(sims, order, axis=1), order.astype(np.int64))
