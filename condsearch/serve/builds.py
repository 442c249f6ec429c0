"""Conditions built on demand by the server: one job per (corpus, condition), on a bounded pool of threads.

A query under a condition that a router corpus has no index for starts a build
(:func:`condsearch.query.on_demand.build_on_demand`); requests for the same condition while it runs share
it. A build loads its own copy of the corpus's model on a worker thread, so the batcher that answers
queries is never waiting on it, on threads niced by :data:`condsearch.serve.priority.BACKGROUND_NICE` (so a
build takes the CPU the queries leave); ``max_builds`` builds run at once, the rest wait their turn
(``queued``), and past ``max_pending_builds`` a new one is refused (503). A small corpus (at most
``build_inline_rows`` rows) is answered in the request that asked; a larger one gets a 202 naming
the job, which ``GET /builds/{id}`` reports on until it is done or has failed (in one line). A failed
job is not reused: the next request starts another.

What strangers can make the server write is bounded (issue 58): one client (by address) has at most
``max_pending_builds_per_client`` builds running or waiting (429 past it), so it cannot take every
slot; and the indexes built on demand (:mod:`condsearch.store.built_on_demand`, counted across
restarts) number at most ``max_on_demand_indexes`` and weigh at most ``max_on_demand_bytes`` on
disk, builds under way included (507 past it: index the condition with `condsearch index`, or delete
some). A keyless server builds only where ``open_builds`` allows (:meth:`ServeConfig.builds_open`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from condsearch.base import parse_memory
from condsearch.errors import CondsearchError, UnknownCondition, first_line
from condsearch.model.encoders import Runtime
from condsearch.progress import RowCount
from condsearch.query import OnDemand, build_on_demand, plan_on_demand
from condsearch.serve.config import Backend, ServeConfig
from condsearch.serve.paths import hide_paths
from condsearch.serve.priority import lower_thread_priority
from condsearch.serve.statuses import error_responses
from condsearch.store import (
    IndexStore,
    Listing,
    Manifest,
    check_condition,
    index_name,
    mark_built_on_demand,
    on_demand_sizes,
)

log = logging.getLogger(__name__)

Status = Literal["queued", "building", "done", "failed"]
#: finished jobs kept for GET /builds/{id}, newest last
KEEP_FINISHED = 256


@dataclass
class BuildJob:
    """One build on demand: what it builds, how far it is, and how it ended."""

    id: str
    condition: str
    corpus: str
    rows: int
    status: Status = "queued"
    #: rows indexed so far, and in all: told by the build itself (a RowCount, not a callback into this module)
    count: RowCount = field(default_factory=RowCount)
    #: one line, once failed
    error: str | None = None
    #: what the build raised, once failed
    exception: BaseException | None = None
    #: the address of the client whose request started it (what the per-client cap counts)
    client: str = ""
    created: float = field(default_factory=time.monotonic)
    finished: float | None = None
    future: Future[OnDemand] = field(default_factory=Future)

    @property
    def seconds(self) -> float:
        """Return the seconds since the job was asked for, until it finished."""
        return round((self.finished if self.finished is not None else time.monotonic()) - self.created, 3)

    def describe(self) -> dict[str, Any]:
        """Return the job as the API shows it."""
        described: dict[str, Any] = {
            "job": self.id,
            "status": self.status,
            "condition": self.condition,
            "corpus": self.corpus,
            "rows": self.count.total or self.rows,
            "rows_done": self.count.done,
            "seconds": self.seconds,
            "poll": f"/builds/{self.id}",
        }
        if self.error is not None:
            described["error"] = hide_paths(self.error)  # as every answer: no path of this machine
        return described


class TooManyBuilds(CondsearchError):
    """More builds are waiting than the server takes (``status`` 503), or than it takes from one client (429)."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


class OnDemandFull(CondsearchError):
    """The indexes built on demand reached the server's cap (count or bytes): no more are built."""


class Builds:
    """The server's builds on demand: started, shared while they run, and reported on."""

    def __init__(
        self,
        store: IndexStore,
        *,
        max_builds: int = ServeConfig.max_builds,
        max_pending: int = ServeConfig.max_pending_builds,
        max_pending_per_client: int = ServeConfig.max_pending_builds_per_client,
        max_indexes: int = ServeConfig.max_on_demand_indexes,
        max_bytes: int | None = None,
        runtime: Runtime = Runtime(),  # noqa: B008 - frozen
        backend: Backend = ServeConfig.backend,
        corpus_option: str = '"corpus"',
        build: Callable[..., OnDemand] | None = None,
    ) -> None:
        self.store, self.runtime, self.backend, self.corpus_option = store, runtime, backend, corpus_option
        self.max_pending, self.max_pending_per_client = max_pending, max_pending_per_client
        self.max_indexes = max_indexes
        self.max_bytes = parse_memory(ServeConfig.max_on_demand_bytes) if max_bytes is None else max_bytes
        self._build = build or build_on_demand  # looked up now: a test may put another in its place
        self._pool = ThreadPoolExecutor(
            max_builds, thread_name_prefix="condsearch-build", initializer=lower_thread_priority
        )
        self._jobs: dict[str, BuildJob] = {}
        self._running: dict[tuple[str, str], BuildJob] = {}
        self._lock = threading.Lock()
        #: told each build's "started", then "finished" or "failed" (the server's metrics count them)
        self.on_event: Callable[[str], None] = lambda _event: None

    @classmethod
    def of(cls, store: object, config: ServeConfig) -> Builds | None:
        """Return the builds of config's server, or None where it builds nothing (--no-build, a Milvus store, a
        keyless server whose builds are not open)."""
        if not config.build or not isinstance(store, IndexStore) or not config.builds_open:
            return None
        runtime = Runtime(device=config.device, threads=config.threads, trust_remote_code=config.trust_remote_code)
        return cls(
            store,
            max_builds=config.max_builds,
            max_pending=config.max_pending_builds,
            max_pending_per_client=config.max_pending_builds_per_client,
            max_indexes=config.max_on_demand_indexes,
            max_bytes=parse_memory(config.max_on_demand_bytes),
            runtime=runtime,
            backend=config.backend,
        )

    def start(
        self,
        condition: str,
        corpus: str | None,
        unknown: UnknownCondition,
        *,
        client: str = "",
        listing: Listing = (),
        case_variants: bool = True,
    ) -> BuildJob:
        """Return the running job that builds condition for corpus, started now unless one runs.

        Refuses what :func:`condsearch.query.on_demand.plan_on_demand` refuses, in one line after unknown's,
        before anything starts; a build past ``max_pending`` or past client's ``max_pending_per_client``
        (TooManyBuilds), and one past the cap on indexes built on demand (OnDemandFull). ``listing``: the
        store's, as the caller last read it (read afresh where empty). ``case_variants`` False refuses a condition
        that differs from one the corpus is indexed under only in case (:class:`~condsearch.errors.CaseVariant`).
        """
        listing = listing or self.store.manifests()
        if self._damaged(condition, corpus, listing):
            raise unknown  # its index is there but damaged (the refusal names it): repaired by hand, not rebuilt
        with self._lock:
            if not self._running:  # no build to join: a server at its cap refuses before planning (3,000 indexes:
                self._check_room(unknown, client, listing)  # the plan reads every sibling's model)
        # the server names no path of its machine (store, corpus file, router folder) in an answer
        plan = plan_on_demand(
            self.store,
            condition,
            corpus,
            corpus_option=self.corpus_option,
            unknown=unknown,
            name_paths=False,
            listing=listing,
            case_variants=case_variants,
        )
        key = (plan.corpus_name, plan.condition)
        with self._lock:
            job = self._running.get(key)
            if job is not None:
                return job
            self._check_room(unknown, client, listing)
            job = BuildJob(secrets.token_hex(8), plan.condition, plan.corpus_name, plan.n_rows, client=client)
            self._running[key] = job
            self._jobs[job.id] = job
            self._forget_finished()
            self._pool.submit(self._run, job, unknown)
        self.on_event("started")
        log.info("building %r for corpus %r on demand (job %s, %d rows)", job.condition, job.corpus, job.id, job.rows)
        return job

    def _check_room(self, unknown: UnknownCondition, client: str, listing: Listing) -> None:
        """Refuse another build past the pending caps (global, the client's) or the cap on indexes built on demand."""
        asked = first_line(unknown)
        if len(self._running) >= self.max_pending:
            raise TooManyBuilds(f"{asked}; {len(self._running)} conditions are being built already: try again later")
        mine = sum(job.client == client for job in self._running.values())
        if mine >= self.max_pending_per_client:
            raise TooManyBuilds(
                f"{asked}; {mine} conditions you asked for are being built already: try again when they are done",
                status=429,
            )
        built = on_demand_sizes(self.store, listing)
        count, size = len(built) + len(self._running), sum(built.values())
        if count >= self.max_indexes or size >= self.max_bytes:
            held = f"{count} indexes, {size / 2**20:,.1f} MiB"
            raise OnDemandFull(
                f"{asked}; this server has built all the indexes on demand it builds ({held}; at most "
                f"{self.max_indexes} and {self.max_bytes / 2**20:,.0f} MiB): index the condition with condsearch index"
            )

    def _damaged(self, condition: str, corpus: str | None, listing: Listing) -> bool:
        """Return whether an index of condition (in corpus, or any corpus) is stored with an unreadable manifest."""
        damaged = {name for name, m in listing if not isinstance(m, Manifest)}
        if not damaged:
            return False
        corpora = {corpus} if corpus is not None else {m.corpus_name for _, m in listing if isinstance(m, Manifest)}
        try:
            text = check_condition(condition)
        except CondsearchError:
            return False  # refused by the plan, in its words
        return any(index_name(c, t) in damaged for c in corpora for t in (text, text.lower()))

    def get(self, job_id: str) -> BuildJob | None:
        """Return the job of that id, if it runs or finished lately."""
        with self._lock:
            return self._jobs.get(job_id)

    def close(self) -> None:
        """Stop taking builds; the one running finishes (its index is published whole or not at all)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self, job: BuildJob, unknown: UnknownCondition) -> None:
        job.status = "building"
        job.count.total = job.rows
        try:
            made = self._build(
                self.store,
                job.condition,
                job.corpus,
                runtime=self.runtime,
                backend=self.backend,
                corpus_option=self.corpus_option,
                unknown=unknown,
                on_rows=job.count,
                name_paths=False,
            )
        except BaseException as exc:  # reported by the job; the pool's thread goes on
            if not isinstance(exc, CondsearchError):
                log.error("building %r on demand failed", job.condition, exc_info=exc)
            job.exception, job.error = exc, first_line(exc) or type(exc).__name__
            self._finish(job, "failed")
            self.on_event("failed")
            job.future.set_exception(exc)
            return
        job.count(made.n_rows, made.n_rows)
        job.rows = made.n_rows
        if made.built:
            try:
                mark_built_on_demand(self.store, made.name)
            except OSError as exc:  # the index is there; only the cap's count misses it
                log.warning("cannot mark %s as built on demand (%s)", made.name, exc.strerror)
        self._finish(job, "done")
        self.on_event("finished")
        log.info(
            "built %r for corpus %r on demand: %d rows in %.1f s", job.condition, job.corpus, made.n_rows, job.seconds
        )
        job.future.set_result(made)

    def _finish(self, job: BuildJob, status: Status) -> None:
        job.finished = time.monotonic()
        with self._lock:
            job.status = status
            self._running.pop((job.corpus, job.condition), None)

    def _forget_finished(self) -> None:
        finished = [i for i, j in self._jobs.items() if j.finished is not None]
        for job_id in finished[: max(0, len(finished) - KEEP_FINISHED)]:
            del self._jobs[job_id]


async def build_or_accept(
    builds: Builds,
    condition: str,
    corpus: str | None,
    unknown: UnknownCondition,
    config: ServeConfig,
    *,
    client: str = "",
    listing: Listing = (),
    case_variants: bool = True,
) -> JSONResponse | None:
    """Start or join the build of condition; return None once it is built, else the 202 that names its job.

    A corpus of at most ``config.build_inline_rows`` rows is waited for (up to ``request_timeout_s``,
    then answered 202 as well); a build that fails raises what it raised. ``case_variants``: as
    :meth:`Builds.start`.
    """
    start = partial(builds.start, condition, corpus, unknown, client=client, listing=listing)
    job = await run_in_threadpool(partial(start, case_variants=case_variants))
    if job.rows <= config.build_inline_rows:
        # shielded: a client that leaves, or a timeout, must not cancel a build others share
        waiting = asyncio.shield(asyncio.wrap_future(job.future))
        try:
            await asyncio.wait_for(waiting, config.request_timeout_s)
            return None
        except asyncio.TimeoutError:
            pass
    return JSONResponse(job.describe(), status_code=202)


def add_builds(app: FastAPI, builds: Builds | None) -> None:
    """Serve ``GET /builds/{id}``: a build's status, rows done of its rows, seconds, and its error once failed."""

    @app.get("/builds/{job_id}", responses=error_responses(404))
    def build_status(job_id: str) -> JSONResponse:
        """Report on a build on demand that a query started (its 202 named it)."""
        job = builds.get(job_id) if builds is not None else None
        if job is None:
            return JSONResponse({"error": f"no build {job_id[:40]!r} (finished builds are kept a while)"}, 404)
        return JSONResponse(job.describe())
