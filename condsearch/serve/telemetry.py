"""``GET /metrics``: the server's counters in Prometheus's text format, through ``prometheus-client``.

Each app has its own :class:`~prometheus_client.CollectorRegistry` (:class:`ServeMetrics`), not the
process's global one, so several apps in one process (tests, benchmarks) count apart. What is counted:

- ``condsearch_http_requests_total{route, method, status}``: every answer, the refusals of the outer
  layers (401, 408, 413, 421) included; ``route`` is the route's template (``/builds/{job_id}``),
  ``other`` for a path no route serves, so strangers cannot add label values;
- ``condsearch_http_request_duration_seconds{route}``: how long each took, as a histogram;
- ``condsearch_batch_queries``: queries and texts per batch the batcher ran (one forward pass per
  model and condition in it);
- ``condsearch_builds_total{event}``: builds on demand ``started``, ``finished`` and ``failed``;
- ``condsearch_indexes_resident`` and ``condsearch_models_resident``: what is loaded now.

Counted by :class:`condsearch.serve.access.RequestLog`, which wraps the whole app.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

#: the route label of a request that no route answered (a 404, or a refusal before routing)
OTHER_ROUTE = "other"
#: the methods counted by name; any other is counted as "other"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
BUILD_EVENTS = ("started", "finished", "failed")
#: seconds: from a health check's fraction of a millisecond to a build answered in the request
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
#: queries per batch, up to a request's most (max_queries' default, 256)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

T = TypeVar("T")
R = TypeVar("R")


class ServeMetrics:
    """One app's metrics in a registry of its own.

    ``n_indexes`` and ``n_models`` are read at each scrape (the resident's counts).
    """

    def __init__(self, n_indexes: Callable[[], int] = lambda: 0, n_models: Callable[[], int] = lambda: 0) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "condsearch_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "condsearch_http_request_duration_seconds",
            "Seconds from a request's arrival to the end of its answer, by route template.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_queries = Histogram(
            "condsearch_batch_queries",
            "Queries and texts per batch the batcher ran (requests that arrive together share it).",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.builds = Counter(
            "condsearch_builds",
            "Builds on demand, by event: started, finished, failed.",
            ["event"],
            registry=self.registry,
        )
        for event in BUILD_EVENTS:
            self.builds.labels(event)  # shown at 0 before the first build
        indexes = Gauge("condsearch_indexes_resident", "Indexes loaded now.", registry=self.registry)
        indexes.set_function(n_indexes)
        models = Gauge("condsearch_models_resident", "Models loaded now.", registry=self.registry)
        models.set_function(n_models)

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one answered request."""
        method = method if method in METHODS else "other"
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def build_event(self, event: str) -> None:
        """Count a build on demand's event (one of :data:`BUILD_EVENTS`)."""
        self.builds.labels(event).inc()

    def counting_batches(
        self, run: Callable[[list[T]], Sequence[R | BaseException]], size: Callable[[T], int]
    ) -> Callable[[list[T]], Sequence[R | BaseException]]:
        """Return the batcher's run function, each batch's queries (the sum of size over its items) observed first."""

        def counted(items: list[T]) -> Sequence[R | BaseException]:
            self.batch_queries.observe(sum(size(item) for item in items))
            return run(items)

        return counted

    def exposition(self) -> bytes:
        """Return the registry in Prometheus's text format."""
        return generate_latest(self.registry)


def add_metrics(app: FastAPI, metrics: ServeMetrics, responses: dict[int | str, dict[str, Any]]) -> None:
    """Serve ``GET /metrics`` from metrics."""

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}, **responses},
    )
    def scrape() -> Response:
        """The server's counters and histograms in Prometheus's text format (open without the API key unless
        the server was started with --private-health)."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
