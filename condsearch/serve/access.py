"""Each request's id (``X-Request-ID``), its access line, and the server's log lines as text or JSON.

:class:`RequestLog` wraps the whole app (inside only the security headers): it names every request,
echoing a client's ``X-Request-ID`` when it is short and printable (:func:`request_id`) and making one
(uuid4, hex) otherwise, puts that id on the answer, counts the answer (:mod:`condsearch.serve.telemetry`)
and writes one access line for it. The id is held in a context variable for as long as the request
runs, so any line the server logs meanwhile (on a worker thread too: they copy the context) carries it
(:class:`RequestIdFilter`).

:func:`log_config` is the logging setup `condsearch serve` runs uvicorn with: one line per record, as
text or as one JSON object (:class:`JsonFormatter`); uvicorn's own access lines are off, since they
know no request id.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from condsearch.serve.config import REQUEST_ID_HEADER, LogFormat
from condsearch.serve.limits import ASGIApp, Message, Receive, Scope, Send
from condsearch.serve.telemetry import OTHER_ROUTE, ServeMetrics

#: the request being answered, for log lines written meanwhile ("-" outside a request)
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("condsearch_request_id", default="-")
#: a client's id is kept when it is this: 1 to 128 visible ASCII characters (no space, no control character)
_GIVEN_ID = re.compile(rb"[\x21-\x7e]{1,128}")
_HEADER = REQUEST_ID_HEADER.lower().encode("latin-1")
#: what a JSON line carries besides time, level, logger, message and request_id, when a record has it
EXTRA_FIELDS = ("method", "path", "status", "ms", "client")
#: an access line shows at most this much of a path
PATH_CHARS = 300

access_log = logging.getLogger("condsearch.serve.access")


def request_id(scope: Scope) -> str:
    """Return the id of a request: the client's X-Request-ID when it fits, else a new uuid4 in hex."""
    given = next((value for name, value in scope.get("headers", ()) if name.lower() == _HEADER), b"")
    if _GIVEN_ID.fullmatch(given):
        return given.decode("ascii")
    return uuid.uuid4().hex


def route_of(scope: Scope) -> str:
    """Return the template of the route that answered (``/builds/{job_id}``), else :data:`OTHER_ROUTE`."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else OTHER_ROUTE


def _shown(path: str) -> str:
    """Return a path as an access line shows it: control characters escaped (no forged lines), cut short."""
    cut = path[:PATH_CHARS] + ("…" if len(path) > PATH_CHARS else "")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)


class RequestLog:
    """Name, time, count and log every HTTP request of app (see the module's docstring)."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics | None = None) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)
        token = REQUEST_ID.set(rid)
        started = time.perf_counter()
        status = 500  # what the server's error layer answers where the app raised before answering
        raw_id = rid.encode("ascii")

        async def send_named(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != _HEADER]
                message = {**message, "headers": [*headers, (_HEADER, raw_id)]}
            await send(message)

        try:
            await self.app(scope, receive, send_named)
        finally:
            seconds = time.perf_counter() - started
            method, path = str(scope.get("method", "")), str(scope.get("path", ""))
            if self.metrics is not None:
                self.metrics.observe_request(route_of(scope), method, status, seconds)
            client = scope.get("client")
            ms = round(seconds * 1000, 3)
            access_log.info(
                "%s %s %d %.1f ms",
                method,
                _shown(path),
                status,
                ms,
                extra={
                    "method": method,
                    "path": path[:PATH_CHARS],
                    "status": status,
                    "ms": ms,
                    "client": client[0] if client else None,
                },
            )
            REQUEST_ID.reset(token)


class RequestIdFilter(logging.Filter):
    """Give every record the id of the request it was logged in (``request_id``; "-" outside one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, request_id, and
    :data:`EXTRA_FIELDS` where the record has them (an access line: method, path, status, ms, client)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", REQUEST_ID.get()),
        }
        for name in EXTRA_FIELDS:
            if hasattr(record, name):
                line[name] = getattr(record, name)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


#: a text line: time, level, logger, [request id], message
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


def log_config(log_format: LogFormat) -> dict[str, Any]:
    """Return the :func:`logging.config.dictConfig` setup of `condsearch serve`: condsearch's and uvicorn's lines on
    stderr, as text or JSON, each naming its request."""
    formatter: dict[str, Any] = {"()": f"{__name__}.JsonFormatter"} if log_format == "json" else {"format": TEXT_FORMAT}
    handler = {
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
        "formatter": "condsearch",
        "filters": ["request_id"],
    }
    logger = {"handlers": ["condsearch"], "level": "INFO", "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": f"{__name__}.RequestIdFilter"}},
        "formatters": {"condsearch": formatter},
        "handlers": {"condsearch": handler},
        "loggers": {"condsearch": logger, "uvicorn": logger, "uvicorn.access": {**logger, "handlers": []}},
    }
