"""The HTTP API as a FastAPI app: POST /query, POST /v1/embeddings, GET /indexes, GET /health.

OpenAPI docs are at /docs and the search page at /.

:func:`create_app` builds the app around a :class:`~condsearch.query.resident.Resident`; it opens
no socket (``condsearch.serve.server`` runs it under uvicorn). Every error answers
``{"error": "one line"}`` with a 4xx or 5xx status, and none stops the server.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from condsearch.base import DEFAULT_SEARCH_THREADS, WALK_SEARCH_THREADS
from condsearch.errors import (
    AmbiguousCondition,
    CaseVariant,
    CondsearchError,
    FilterError,
    NotBuildable,
    StoreError,
    UnknownCondition,
    first_line,
)
from condsearch.query import Background, QueryJob, Resident, index_summary, query_answer, split_job
from condsearch.serve.access import RequestLog
from condsearch.serve.batching import Lanes
from condsearch.serve.builds import Builds, OnDemandFull, TooManyBuilds, add_builds, build_or_accept
from condsearch.serve.config import API_KEY_HEADER, REQUEST_ID_HEADER, ServeConfig
from condsearch.serve.drops import drop_route
from condsearch.serve.embeddings import EmbedJob, add_embeddings, answer_jobs
from condsearch.serve.headers import SecurityHeaders
from condsearch.serve.hosts import HostCheck
from condsearch.serve.limits import BodyLimit
from condsearch.serve.page import PAGE_PATHS, add_page
from condsearch.serve.paths import hide_paths
from condsearch.serve.refusals import MAX_K, ErrorResponse, RequestError, check_request_condition, check_text
from condsearch.serve.statuses import error_responses
from condsearch.serve.telemetry import ServeMetrics, add_metrics
from condsearch.store import IndexStore, Manifest
from condsearch.version import __version__

log = logging.getLogger(__name__)

#: answered without the API key (GET) unless the server has private_health: probes and scrapers, no data
OPS_PATHS = frozenset({"/health", "/metrics"})


class QueryRequest(BaseModel):
    """One query (``query``) or several (``queries``) under a condition.

    Strict: every text is a JSON string and k a JSON integer (``true``, ``"5"`` and ``5.0`` are
    refused, not converted).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    query: str | None = Field(None, description="One query text; or give `queries`.")
    queries: list[str] | None = Field(None, description="Several query texts, answered in order.")
    condition: str = Field(description="The condition whose index to search.")
    k: int = Field(
        ServeConfig.k, ge=1, le=MAX_K, description="Results per query; more than the index holds returns every row."
    )
    corpus: str | None = Field(None, description="Corpus name, when several corpora share the condition.")
    calibrated: bool = Field(
        False,
        description="Also give each result's `z`: its score's standard score against the index's background "
        "(its rows' pair scores, recorded when it was written). An index that records none gets a 409.",
    )
    where: str | None = Field(
        None,
        description="A SQL condition on the index's kept columns (`index --keep-columns`), e.g. "
        "\"lang = 'en' AND year >= 2020\": only the rows it keeps are ranked. A bad one gets a 422.",
    )
    force: bool = Field(
        False,
        description="Build `condition` on demand even where the corpus is indexed under a condition that differs "
        "from it only in case (a cased model's); without it such a build gets a 409 naming that one (`existing`).",
    )

    @field_validator("query", "corpus")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return value if value is None else check_text(value)

    @field_validator("condition")
    @classmethod
    def _condition(cls, value: str) -> str:
        return check_request_condition(value)

    @field_validator("queries")
    @classmethod
    def _texts(cls, value: list[str] | None) -> list[str] | None:
        return value if value is None else [check_text(t) for t in value]

    @model_validator(mode="after")
    def _one_kind_of_query(self) -> QueryRequest:
        given = self.model_fields_set  # "query": null beside "queries" is both given, not one
        if ("query" in given) == ("queries" in given) or (self.query is None) == (self.queries is None):
            raise ValueError('give exactly one of "query" or "queries"')
        texts = [self.query] if self.query is not None else self.queries or []
        if not texts:
            raise ValueError('"queries" is empty')
        if any(not t.strip() for t in texts):
            raise ValueError("a query is empty")
        return self

    @property
    def texts(self) -> list[str]:
        return [self.query] if self.query is not None else list(self.queries or [])


class Hit(BaseModel):
    rank: int
    id: str | int
    score: float
    z: float | None = Field(None, description="With `calibrated`: (score - mean) / std of the index's background.")
    text: str
    metadata: dict[str, Any] | None = Field(None, description="The row's kept columns, where its index keeps any.")


class QueryAnswer(BaseModel):
    """The same object `condsearch query --json` prints for one query."""

    query: str
    condition: str
    results: list[Hit]


class QueryResponse(BaseModel):
    index: str = Field(description="The index directory answered from.")
    corpus: str
    k: int = Field(description="The most results any query got (at most k_requested and the index's rows).")
    k_requested: int
    k_capped: bool = Field(
        description="True when a query got fewer than k_requested results: k was larger than the index "
        "(every row is returned), or an approximate index found fewer."
    )
    rows: int = Field(description="Rows in the index.")
    results: list[QueryAnswer]
    unknown_tokens: list[float | None] = Field(
        description="Per query, the share of its tokens the model's vocabulary lacks (read as [UNK]; null where "
        "not counted). Near 1 (Chinese or emoji for an English model), the model cannot read the query."
    )


def _error(status: int, reason: BaseException | str, **extra: Any) -> JSONResponse:
    # no path of this machine in an answer (issue 58): a damaged store's or a full disk's error names files
    body = hide_paths({"error": first_line(reason) or "error", **extra})
    return JSONResponse(_printable(body), status_code=status)


def _printable(value: Any) -> Any:
    """Return value with every string made encodable as UTF-8: an error may quote what a client sent."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_printable(v) for v in value]
    return value


def _validation_message(exc: RequestValidationError) -> tuple[int, str]:
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return 400, "malformed JSON body"
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    msg = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if first.get("type") == "missing" and not loc:
        return 422, "the body must be a JSON object with a query and a condition"
    if first.get("type") == "model_attributes_type":
        return 422, "the body must be a JSON object"
    return 422, f"{'.'.join(loc)}: {msg}" if loc else msg


def _without_paths(summary: dict[str, Any]) -> dict[str, Any]:
    """Return an index's summary with the folders it names (a local model's, a profile's, a router's) cut to their
    last part, as every answer names them (:mod:`condsearch.serve.paths`)."""
    return {k: hide_paths(v) if k in ("model", "head", "router", "error") else v for k, v in summary.items()}


def _background(manifest: Manifest) -> Background:
    """Return the background a calibrated request needs; a 409 where the index records none."""
    try:
        return Background.of(manifest, name_paths=False)
    except CondsearchError as exc:
        raise RequestError(409, str(exc)) from exc


def _given_key(request: Request) -> bytes:
    headers = {name.lower(): value for name, value in request.headers.raw}
    given = headers.get(API_KEY_HEADER.lower().encode(), b"")
    auth = headers.get(b"authorization", b"")
    if not given and auth[:7].lower() == b"bearer ":
        given = auth[7:].strip()
    return given


class _SecuredApp(FastAPI):
    """FastAPI with :class:`~condsearch.serve.headers.SecurityHeaders` outside every other layer, then
    :class:`~condsearch.serve.access.RequestLog` (request ids, metrics, access lines), so every answer has both.

    ``add_middleware`` would put it inside Starlette's error middleware, whose 500s would then go out bare.
    """

    #: whether requests on a loopback connection must name this machine in Host (:mod:`condsearch.serve.hosts`)
    check_hosts = False
    #: what counts the requests (:mod:`condsearch.serve.telemetry`)
    metrics: ServeMetrics | None = None

    def build_middleware_stack(self) -> Any:
        stack = super().build_middleware_stack()
        return SecurityHeaders(RequestLog(HostCheck(stack) if self.check_hosts else stack, self.metrics))


def create_app(resident: Resident, config: ServeConfig) -> FastAPI:
    """Return the app answering from resident; config supplies limits, batching and the API key."""
    metrics = ServeMetrics(lambda: resident.n_indexes, lambda: resident.n_models)
    # /query's jobs and /v1/embeddings' (an Answer or an array each): light ones on the quick lane, the rest
    # taking turns on the niced bulk lane
    batcher: Lanes[QueryJob | EmbedJob, Any] = Lanes(
        metrics.counting_batches(partial(answer_jobs, resident), lambda job: len(job.queries)),
        max_batch=config.max_batch,
        window_s=config.batch_window_ms / 1000,
        size=lambda job: len(job.queries),
        cost=lambda job: job.n_tokens,
        max_cost=config.max_batch_tokens,
        light_cost=config.light_request_tokens,
    )

    builds = Builds.of(resident.store, config)
    if builds is not None:
        builds.on_event = metrics.build_event

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if builds is not None:
            builds.close()
        batcher.close()
        resident.close()

    app = _SecuredApp(
        title="condsearch",
        version=__version__,
        description="Conditional semantic search: rank an index's rows for queries under its condition.",
        lifespan=lifespan,
        docs_url=None,  # the page's own /docs (condsearch.serve.page): Swagger UI's comes from a CDN
        redoc_url=None,
    )
    app.state.resident, app.state.batcher, app.state.config = resident, batcher, config
    app.state.builds, app.state.metrics, app.metrics = builds, metrics, metrics
    # a keyless server's loopback connections answer this machine's names only (DNS rebinding)
    app.check_hosts = not config.api_key

    # outermost last: the key is checked before the body is read
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, timeout_s=config.body_timeout_s)
    if config.api_key:
        # compared as bytes: the key's UTF-8 (an argv or environment that is not UTF-8 gives its own
        # bytes back) against the header's raw bytes, which ASGI hands over undecoded
        expected = config.api_key.encode("utf-8", "surrogateescape")
        open_ops = not config.private_health

        @app.middleware("http")
        async def require_key(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            if request.method in ("GET", "HEAD") and request.scope["path"] in PAGE_PATHS:
                return await call_next(request)  # the page holds no data; what it fetches needs the key
            if open_ops and request.method == "GET" and request.scope["path"] in OPS_PATHS:
                return await call_next(request)  # probes and scrapers (--private-health asks the key of them too)
            if not hmac.compare_digest(_given_key(request), expected):
                response = _error(401, f"missing or wrong API key (send it as {API_KEY_HEADER} or a Bearer token)")
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
            return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(*_validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestError)
    async def _refused(_: Request, exc: RequestError) -> JSONResponse:
        return _error(exc.status, exc, **exc.extra)

    @app.exception_handler(UnknownCondition)
    async def _unknown(_: Request, exc: UnknownCondition) -> JSONResponse:
        return _error(404, exc, conditions=exc.conditions)

    @app.exception_handler(AmbiguousCondition)
    async def _ambiguous(_: Request, exc: AmbiguousCondition) -> JSONResponse:
        return _error(409, exc, corpora=exc.corpora)

    @app.exception_handler(FilterError)
    async def _bad_filter(_: Request, exc: FilterError) -> JSONResponse:
        return _error(422, exc)  # "where": a syntax error, an unknown column, a type mismatch

    @app.exception_handler(CondsearchError)
    async def _unservable(_: Request, exc: CondsearchError) -> JSONResponse:
        # a damaged index, a model that changed since indexing: the server's state, not the request
        return _error(500, exc)

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error", exc_info=exc)
        return _error(500, f"internal error ({type(exc).__name__})")

    errors = error_responses(202, 400, 404, 409, 422, 429, 503, 507, model=ErrorResponse)

    @app.post("/query", response_model=QueryResponse, responses=errors)
    async def query(body: QueryRequest, request: Request) -> JSONResponse:
        """Rank the index of `condition` for each query; one answer per query, in order."""
        texts = body.texts
        if len(texts) > config.max_queries:
            raise RequestError(422, f"at most {config.max_queries} queries per request, got {len(texts)}")
        for name, text in [("condition", body.condition), *(("query", t) for t in texts)]:
            if len(text) > config.max_text_chars:
                raise RequestError(422, f"{name}: longer than {config.max_text_chars:,} characters ({len(text):,})")
        # found, and each query cut to the tokens its model reads, on a worker thread: not the batcher's
        try:
            job = await run_in_threadpool(resident.job, body.condition, body.corpus, texts, body.k, body.where)
        except UnknownCondition as unknown:
            if builds is None:
                raise _unbuilt(unknown) from None
            # a router corpus builds the condition on demand (condsearch.serve.builds)
            client = request.client.host if request.client else ""
            accepted = await _build(builds, body.condition, body.corpus, unknown, client, force=body.force)
            if accepted is not None:
                return accepted
            await run_in_threadpool(partial(resident.listing, fresh=True))  # the index just published
            job = await run_in_threadpool(resident.job, body.condition, body.corpus, texts, body.k, body.where)
        entry = job.index
        background = _background(entry.manifest) if body.calibrated else None
        # a large request is answered in parts, in turn with others (condsearch.serve.batching)
        future = batcher.submit_parts(split_job(job, config.max_batch, config.max_batch_tokens))
        try:
            parts = await asyncio.wait_for(asyncio.wrap_future(future), config.request_timeout_s)
        except asyncio.TimeoutError as exc:
            raise RequestError(503, "the server is too busy; try again") from exc
        found = [h for part in parts for h in part.hits]
        hits = [background.calibrate(h) for h in found] if background else found
        # what was found, not what was asked: an approximate index may return fewer than k
        counts = [len(h) for h in hits]
        return JSONResponse(
            {
                "index": entry.name,
                "corpus": entry.manifest.corpus_name,
                "k": max(counts),
                "k_requested": body.k,
                "k_capped": min(counts) < body.k,
                "rows": parts[0].n_rows,
                "results": [query_answer(h) for h in hits],
                "unknown_tokens": list(job.unknown) if job.unknown is not None else [None] * len(texts),
            }
        )

    def _unbuilt(unknown: UnknownCondition) -> UnknownCondition:
        """Return the refusal of an unknown condition, saying why it was not built where builds are closed."""
        if not config.build or config.builds_open or not isinstance(resident.store, IndexStore):
            return unknown
        why = "a server without an API key bound beyond loopback builds no condition on demand: start it with "
        why += "--api-key, or --open-builds"
        return UnknownCondition(f"{first_line(unknown)}; {why}", unknown.conditions)

    async def _build(
        builds: Builds, condition: str, corpus: str | None, unknown: UnknownCondition, client: str, *, force: bool
    ) -> Any:
        try:
            listing = resident.listing()  # as find read it: one listing per unknown condition, not four
            return await build_or_accept(
                builds, condition, corpus, unknown, config, client=client, listing=listing, case_variants=force
            )
        except (UnknownCondition, AmbiguousCondition):
            raise
        except CaseVariant as exc:  # a second index under another case of one (issue 59): only when forced
            message = f'{exc}; query under that one, or send "force": true to build {condition!r} as well'
            raise RequestError(409, message, existing=exc.existing, conditions=unknown.conditions) from exc
        except TooManyBuilds as exc:
            raise RequestError(exc.status, str(exc), conditions=unknown.conditions) from exc
        except OnDemandFull as exc:
            raise RequestError(507, str(exc), conditions=unknown.conditions) from exc
        except CondsearchError as exc:
            # a CASE corpus has no index for it and cannot build one (404, as before builds on demand); several
            # models or a changed router (409); a bad condition (422)
            status = 404 if isinstance(exc, NotBuildable) else 409 if isinstance(exc, StoreError) else 422
            raise RequestError(status, str(exc), conditions=unknown.conditions) from exc

    @app.get("/indexes", responses=error_responses())
    def indexes() -> dict[str, list[dict[str, Any]]]:
        """List the stored indexes, as `condsearch list --json` does."""
        # a folder name or error may hold bytes that are not UTF-8 (surrogate-escaped)
        listed = [_without_paths(index_summary(name, m)) for name, m in resident.listing(fresh=True)]
        return _printable({"indexes": listed})

    @app.delete("/indexes/{corpus}", responses=error_responses(404, 405, 409, 422))
    def drop_indexes(corpus: str, condition: str | None = None) -> dict[str, Any]:
        """Remove a corpus's indexes, or only ``condition``'s (issue 59); 409 while a build of the corpus runs."""
        return drop_route(resident, corpus, condition)

    @app.get("/health", responses=error_responses())
    def health() -> dict[str, Any]:
        """Say the server is up, and what it holds (open without the API key unless started with --private-health)."""
        stats = batcher.stats
        return {
            "status": "ok",
            "version": __version__,
            "indexes_loaded": resident.n_indexes,
            "models_loaded": resident.n_models,
            "models": hide_paths(resident.models()),
            "backend": config.backend,
            "threads": {
                "encode": config.encode_threads,
                "search": config.search_threads or DEFAULT_SEARCH_THREADS,  # an exact index's
                "search_ivf_hnsw": config.search_threads or WALK_SEARCH_THREADS,  # an IVF or HNSW index's
            },
            "batches": {"n": stats.n_batches, "requests": stats.n_items, "largest": stats.largest},
        }

    add_metrics(app, metrics, error_responses())
    add_embeddings(app, resident, batcher, config)
    if config.cors_origins:  # outside the key: a browser's preflight carries none
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Content-Type", "Authorization", API_KEY_HEADER, REQUEST_ID_HEADER],
            expose_headers=[REQUEST_ID_HEADER],
        )
    add_builds(app, builds)
    add_page(app)
    return app
