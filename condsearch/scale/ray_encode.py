"""Encoding a corpus on Ray Data: an actor pool of encoder replicas, then indexes built from its shards.

The driver copies the corpus's kept rows into parquet shards of (pos, text) under a work folder;
``ray.data.read_parquet`` reads them, ``map_batches`` sends them through a fixed pool of actors
that each load the encoder (and head or router) once, on one GPU where the cluster has GPUs, and
encode every row under every condition; the vectors and row positions are written back as
parquet shards. The driver then puts each condition's vectors in corpus order and publishes the
index through the store exactly as a local build does (vectors and text hashes kept beside it,
so a later local re-index reuses them). The work folder must be one path that the driver and
every worker see (the index folder on one machine; a shared file system on a cluster).

One path per index, whatever runs it (issue 61, item 4): the driver resolves the path once, its CPU
kind (:func:`condsearch.base.cpu_kind.cpu_kind`) and the ``--backend`` asked for (an
:class:`EncodePath`), and every worker loads the :class:`~condsearch.model.encoders.spec.EncoderSpec` it ships
through the bulk loader a local `condsearch index` uses (``load_model_for("bulk", spec, backend=...)``)
under that kind, so that a worker on another CPU kind takes the driver's runner and precision (torch in
bfloat16 on AMX and AVX-512 BF16, the checked float32 export elsewhere) and the manifest records what a
local build on the driver records. The vectors are the local path's up to float rounding from other
batch compositions (the tests check both modes, on a forced CPU kind too). Before, the workers loaded
the plain torch model: the context router ran in float32 where a local build ran it in bfloat16 (and
recorded it), and a worker read its own CPU kind.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from condsearch.base.cpu_kind import CPU_KIND_ENV, CpuKind, check_kind, cpu_kind
from condsearch.errors import CondsearchError, first_line
from condsearch.ingest.chunks import (
    CHUNK_ROWS,
    BuildReport,
    CorpusSource,
    corpus_chunks,
    plan_index,
    publish_staged,
    write_tables,
)
from condsearch.model.encoders.base import ENCODE_BATCH_SIZE
from condsearch.model.encoders.cpu import Backend, CpuConfig
from condsearch.model.encoders.spec import EncoderSpec
from condsearch.model.identity import ModelIdentity
from condsearch.scale.config import LOCAL, RayConfig, check_address  # noqa: F401 - re-exported
from condsearch.scale.extras import missing_extra
from condsearch.store.folder import ROWS_FILE, IndexStore
from condsearch.store.listing import check_condition
from condsearch.store.rows import rows_table
from condsearch.store.vectors import VECTORS_FILE, VectorWriter

if TYPE_CHECKING:
    from condsearch.model.vectorizer import Vectorizer

log = logging.getLogger(__name__)

#: environment passed to the workers of a local instance (models offline, the same caches)
_PASSED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "CONDSEARCH_CACHE_DIR", "TOKENIZERS_PARALLELISM")


@contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the block, then put back what was there."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass(frozen=True)
class EncodePath:
    """The one path an index's vectors take: the driver's CPU kind and the backend asked for.

    Resolved once on the driver (:meth:`resolve`) and shipped to every worker, which loads its model
    under that kind (:meth:`load`): the runner and precision a local `condsearch index` on the driver
    takes (:mod:`condsearch.base.cpu_kind`'s ``PATHS``), whatever CPU the worker has.
    """

    cpu_kind: CpuKind
    backend: Backend = CpuConfig.backend

    @classmethod
    def resolve(cls, backend: Backend = CpuConfig.backend) -> EncodePath:
        """Return this machine's path (``CONDSEARCH_CPU_KIND`` when set) under ``backend``."""
        return cls(cpu_kind(), backend)

    @property
    def env_vars(self) -> dict[str, str]:
        """The environment that makes a process read this path's CPU kind."""
        return {CPU_KIND_ENV: check_kind(self.cpu_kind)}

    def load(self, spec: EncoderSpec) -> Vectorizer:
        """Load the spec's vectorizer as a local `condsearch index` on the driver does: the bulk loader, its kind."""
        from condsearch.model import load_model_for

        with _environ(self.env_vars):  # every choice of runner and dtype is made while loading
            return load_model_for("bulk", spec, backend=self.backend)


def _worker_spec(spec: EncoderSpec) -> EncoderSpec:
    """Run on the threads Ray gave this worker (``OMP_NUM_THREADS``) where the spec names none, not every core."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if spec.runtime.threads is not None or not given.isdigit() or int(given) < 1:
        return spec
    return replace(spec, runtime=replace(spec.runtime, threads=int(given)))


@dataclass(frozen=True)
class WorkerModel:
    """What the workers' model is: what its manifest records, and what runs it (torch or onnxruntime)."""

    identity: ModelIdentity
    runner: str


def describe_vectorizer(spec: EncoderSpec, path: EncodePath | None = None) -> WorkerModel:
    """Load the spec's vectorizer on ``path`` [default: this process's] and return what its manifest needs."""
    from condsearch.model import backend_of

    vec = (path or EncodePath.resolve()).load(_worker_spec(spec))
    return WorkerModel(ModelIdentity.of_vectorizer(vec), backend_of(vec))


class EncodeActor:
    """One encoder replica: a batch of (pos, text) rows in, (pos, condition number, vector) rows out.

    ``path``: the driver's (:class:`EncodePath`) [default: this process's].
    """

    def __init__(
        self, spec: EncoderSpec, conditions: Sequence[str], batch_size: int, path: EncodePath | None = None
    ) -> None:
        self.vectorizer = (path or EncodePath.resolve()).load(_worker_spec(spec))
        self.conditions = list(conditions)
        self.batch_size = batch_size

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch.column("text").to_pylist()
        pos = batch.column("pos").to_numpy()
        parts = []
        for k, condition in enumerate(self.conditions):
            vecs = self.vectorizer.encode(texts, condition, batch_size=self.batch_size)
            flat = pa.array(np.ascontiguousarray(vecs, dtype=np.float32).reshape(-1))
            parts.append(
                pa.table(
                    {
                        "pos": pa.array(pos, type=pa.int64()),
                        "condition": pa.array(np.full(len(texts), k, dtype=np.int32)),
                        "vector": pa.FixedSizeListArray.from_arrays(flat, vecs.shape[1]),
                    }
                )
            )
        return pa.concat_tables(parts)


def _ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401 - the Data library is part of the extra
    except ImportError as exc:
        raise missing_extra("ray[data]", "ray") from exc
    return ray


#: Ray's message when a local node misses its fixed start-up wait (a bare ``Exception``)
_STARTUP_TIMEOUT = "timed out during startup"


def start_ray(ray: Any, tries: int = 3, **init: Any) -> None:
    """``ray.init(**init)``, again when a local node misses Ray's fixed 30 s start-up wait.

    That wait fails on a starved machine (two cores beside a training job), not on a wrong setup;
    any other failure, or the last try's, is raised as it came.
    """
    for attempt in range(1, tries + 1):
        try:
            ray.init(**init)
            return
        except Exception as exc:  # Ray raises a bare Exception for the start-up timeout
            if _STARTUP_TIMEOUT not in str(exc) or attempt == tries:
                raise
            ray.shutdown()
            log.warning("ray: the local node's start-up timed out (try %d of %d); starting again", attempt, tries)


def _connect(ray: Any, config: RayConfig, path: EncodePath | None = None) -> bool:
    """Join the instance config names (or the one already running); return whether this call started it.

    A local instance's workers get the driver's environment (:data:`_PASSED_ENV`) and ``path``'s CPU kind.
    """
    if ray.is_initialized():
        return False
    try:
        if config.address == LOCAL:
            env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ} | (path.env_vars if path else {})
            start_ray(ray, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
        else:
            ray.init(address=config.address, log_to_driver=False)
    except Exception as exc:  # Ray's start-up failures include bare Exceptions; each is one line to the user
        ray.shutdown()  # what a failed start left running (a no-op when nothing is)
        raise CondsearchError(f"--ray {config.address}: cannot start or connect ({first_line(exc)})") from exc
    return True


def _pool(ray: Any, config: RayConfig) -> tuple[int, dict[str, float]]:
    """Return (actors, per-actor resources): one GPU each where the cluster has GPUs, else a share of the CPUs.

    CPU actors leave one CPU to Ray Data's own file listing, reading and writing tasks, which
    would otherwise wait for ever behind actors that hold every CPU.
    """
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), float(resources.get("CPU", 1))
    if gpus:
        return config.actors or gpus, {"num_gpus": 1}
    actors = config.actors or max(1, int(cpus) - 1)
    return actors, {"num_cpus": min(1.0, max(cpus - 1, 0.5) / actors)}


@dataclass(frozen=True)
class RayBuild:
    """What :func:`ray_index_conditions` did: each index's report, and what ran the workers' model."""

    reports: list[BuildReport]
    runner: str


def ray_index_conditions(
    corpus: CorpusSource,
    conditions: Sequence[str],
    spec: EncoderSpec,
    store: IndexStore,
    *,
    corpus_name: str,
    factory: str,
    search_params: str,
    max_index_memory: str,
    batch_size: int = ENCODE_BATCH_SIZE,
    backend: Backend = CpuConfig.backend,
    config: RayConfig = RayConfig(),  # noqa: B008 - frozen
) -> RayBuild:
    """Encode corpus under each condition on Ray and publish one index each; return what each did.

    Every row is encoded (the local path's reuse of unchanged rows does not apply). The workers take
    the path a local build here takes (:class:`EncodePath`: this machine's CPU kind, ``backend``).
    """
    conditions = list(dict.fromkeys(check_condition(c) for c in conditions))
    path = EncodePath.resolve(backend)
    ray = _ray()
    started = _connect(ray, config, path)
    work = (config.work_dir or store.root / ".ray-work") / f"{time.time_ns()}-{os.getpid()}"
    try:
        actors, resources = _pool(ray, config)
        remote = ray.remote(**resources)(describe_vectorizer)
        model: WorkerModel = ray.get(remote.remote(spec, path))
        info = model.identity
        plans = [plan_index(len(corpus), info.dim, factory, search_params, max_index_memory) for _ in conditions]
        n_shards = _write_input(corpus, work / "input", actors, config.batch_rows)
        log.info(
            "ray: %d shard(s), %d actor(s) with %s, on %s (the %s CPU kind's path)",
            n_shards,
            actors,
            resources,
            model.runner,
            path.cpu_kind,
        )
        dataset = ray.data.read_parquet(str(work / "input"))
        encoded = dataset.map_batches(
            EncodeActor,
            fn_constructor_args=(spec, conditions, batch_size, path),
            batch_size=config.batch_rows,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=actors),
            **resources,
        )
        encoded.write_parquet(str(work / "vectors"))
        reports = [
            _publish(corpus, k, c, info, store, corpus_name, plan, work / "vectors")
            for k, (c, plan) in enumerate(zip(conditions, plans, strict=True))
        ]
        return RayBuild(reports, model.runner)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if started:
            ray.shutdown()


def _write_input(corpus: CorpusSource, folder: Path, actors: int, batch_rows: int) -> int:
    """Copy the corpus's kept rows as (pos, text) shards, enough of them to keep every actor busy."""
    folder.mkdir(parents=True)
    rows = min(CHUNK_ROWS, max(batch_rows, math.ceil(len(corpus) / (4 * actors))))
    pos = 0
    for k, (_ids, texts) in enumerate(corpus.batches(rows)):
        table = pa.table({"pos": pa.array(range(pos, pos + len(texts)), type=pa.int64()), "text": texts})
        pq.write_table(table, folder / f"part-{k:06d}.parquet")
        pos += len(texts)
    return k + 1 if pos else 0


def _publish(
    corpus: CorpusSource,
    k: int,
    condition: str,
    info: ModelIdentity,
    store: IndexStore,
    corpus_name: str,
    plan: tuple[str, str],
    shards: Path,
) -> BuildReport:
    """Put condition k's vectors from the shards in corpus order and publish its index."""
    n, (factory, search_params) = len(corpus), plan
    with store.writing(corpus_name, condition) as draft:
        draft.discard_staging()
        draft.staging.mkdir(parents=True)
        writer = VectorWriter(draft.staging / VECTORS_FILE, (n, info.dim))
        seen = np.zeros(n, dtype=bool)
        try:
            for part in sorted(shards.glob("*.parquet")):
                table = pq.read_table(part, filters=[("condition", "=", k)])
                pos = table.column("pos").to_numpy()
                flat = table.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
                vecs = flat.reshape(len(pos), info.dim)
                order = np.argsort(pos)  # runs of consecutive rows, written at once
                for run in np.split(order, np.flatnonzero(np.diff(pos[order]) != 1) + 1):
                    if len(run):
                        writer.write(int(pos[run[0]]), vecs[run])
                seen[pos] = True
        finally:
            writer.close()
        if not seen.all():
            raise CondsearchError(f"ray: {int((~seen).sum())} row(s) of {condition!r} came back without a vector")
        rows = (rows_table(ids, texts, kept) for ids, texts, kept in corpus_chunks(corpus, CHUNK_ROWS))
        write_tables(draft.staging / ROWS_FILE, rows)
        publish_staged(draft, corpus, corpus_name, info, factory=factory, search_params=search_params)
    return BuildReport(draft.name, n, n, 0, 0, factory, search_params)
