"""`condsearch serve`: the HTTP query server's command (the server itself is condsearch.serve)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from condsearch.cli.common import CONTEXT, fail
from condsearch.cli.options import (
    FiniteFloatRange,
    backend_option,
    device_option,
    index_dir_option,
    quantize_check_option,
    read_store_option,
    refuse_index_dir_beside_store,
    threads_option,
    trust_option,
)
from condsearch.errors import CondsearchError
from condsearch.serve import API_KEY_ENV, LOG_FORMATS, ServeConfig, check_cors_origin, is_loopback


def _memory(value: str) -> str:
    """Return a memory size as given, once it parses (a usage error otherwise)."""
    from condsearch.base import parse_memory

    try:
        parse_memory(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def _origins(values: tuple[str, ...]) -> tuple[str, ...]:
    """Return --cors-origin's values as given, once each is an origin (a usage error otherwise)."""
    try:
        return tuple(check_cors_origin(v) for v in values)
    except CondsearchError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("serve", context_settings=CONTEXT)
@click.option(
    "--host",
    default=ServeConfig.host,
    show_default=True,
    help="Address to listen on (one that is not loopback prints a warning).",
)
@click.option("--port", default=ServeConfig.port, show_default=True, type=click.IntRange(1, 65535), help="TCP port.")
@click.option(
    "--api-key",
    envvar=API_KEY_ENV,
    default=None,
    help=f"Require this key on every request (header X-API-Key or a Bearer token); prefer env {API_KEY_ENV}.",
)
@click.option(
    "--max-batch",
    default=ServeConfig.max_batch,
    show_default=True,
    type=click.IntRange(min=1),
    help="Queries encoded together at most (requests that arrive together share one forward pass).",
)
@click.option(
    "--max-batch-tokens",
    default=ServeConfig.max_batch_tokens,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tokens encoded together at most: a larger request is answered in parts, in turn with other "
    "requests, so that it holds none of them up for longer than one part.",
)
@click.option(
    "--batch-window-ms",
    default=ServeConfig.batch_window_ms,
    show_default=True,
    type=FiniteFloatRange(min=0),
    help="How long a batch waits for more requests after its first.",
)
@click.option(
    "--max-body-bytes",
    default=ServeConfig.max_body_bytes,
    show_default=True,
    type=click.IntRange(min=1),
    help="A request body larger than this gets a 413 before it is read.",
)
@click.option(
    "--build/--no-build",
    default=ServeConfig.build,
    show_default=True,
    help="Build a condition that a router (--mode csr) corpus has no index for when a query asks for it, "
    "from the corpus's rows and cached sentence states (an index folder only; --no-build answers 404).",
)
@click.option(
    "--max-builds",
    default=ServeConfig.max_builds,
    show_default=True,
    type=click.IntRange(min=1),
    help="Conditions built at once, each on its own thread and copy of the model; others wait their turn.",
)
@click.option(
    "--max-pending-builds",
    default=ServeConfig.max_pending_builds,
    show_default=True,
    type=click.IntRange(min=1),
    help="Builds running or waiting at most; past it a query under a new condition gets a 503.",
)
@click.option(
    "--max-pending-builds-per-client",
    default=ServeConfig.max_pending_builds_per_client,
    show_default=True,
    type=click.IntRange(min=1),
    help="Builds running or waiting at most that one client address asked for; past it a 429.",
)
@click.option(
    "--max-on-demand-indexes",
    default=ServeConfig.max_on_demand_indexes,
    show_default=True,
    type=click.IntRange(min=0),
    help="Indexes built on demand that the store may hold (counted across restarts); past it a new condition "
    "gets a 507. Delete some (rm -r INDEX_DIR/NAME) or index conditions with condsearch index.",
)
@click.option(
    "--max-on-demand-bytes",
    default=ServeConfig.max_on_demand_bytes,
    show_default=True,
    callback=lambda _ctx, _param, value: _memory(value),
    help="Bytes on disk that the indexes built on demand may take (e.g. 512M, 4G); past it a 507.",
)
@click.option(
    "--open-builds/--no-open-builds",
    default=ServeConfig.open_builds,
    help="Whether a server without an API key builds conditions on demand "
    "[default: on a loopback --host, off beyond it].",
)
@click.option(
    "--max-resident-indexes",
    default=ServeConfig.max_resident_indexes,
    show_default=True,
    type=click.IntRange(min=1),
    help="Indexes kept loaded at most; past it the least recently used is unloaded (and loaded again when asked for).",
)
@click.option(
    "--build-inline-rows",
    default=ServeConfig.build_inline_rows,
    show_default=True,
    type=click.IntRange(min=0),
    help="A corpus of at most this many rows is built and answered in the request; a larger one gets a 202 "
    "naming a job to poll at GET /builds/ID.",
)
@click.option(
    "--private-health/--public-health",
    default=ServeConfig.private_health,
    show_default=True,
    help="With --api-key: whether GET /health and GET /metrics need the key too (public: probes and "
    "Prometheus scrape them without it; they hold no data).",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default=ServeConfig.log_format,
    show_default=True,
    help="Log lines as text, or as one JSON object each (time, level, message, request_id; an access line's "
    "method, path, status, ms). Every line names its request's X-Request-ID.",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    metavar="ORIGIN",
    default=ServeConfig.cors_origins,
    callback=lambda _ctx, _param, value: _origins(value),
    help="Let pages from ORIGIN (scheme://host[:port]) call the API from a browser (CORS); repeatable. "
    "[default: none, CORS off]",
)
@click.option("--preload", is_flag=True, help="Load every index and its model before answering (else on first use).")
@backend_option(
    "What runs the encoders. auto: onnxruntime on the CPU where the index's model allows it "
    "(BERT-style, on every CPU kind; `query` loads the model as the server does, so answers equal "
    "`query --json`), else torch; "
    "torch: always transformers.",
)
@quantize_check_option
@threads_option
@click.option(
    "--search-threads",
    type=click.IntRange(min=1),
    default=ServeConfig.search_threads,
    help="FAISS's threads for searching [default: every core; one for an IVF or HNSW index].",
)
@index_dir_option
@read_store_option("Serve the")
@device_option
@trust_option
def serve_cmd(
    host: str,
    port: int,
    api_key: str | None,
    max_batch: int,
    max_batch_tokens: int,
    batch_window_ms: float,
    max_body_bytes: int,
    build: bool,
    max_builds: int,
    max_pending_builds: int,
    max_pending_builds_per_client: int,
    max_on_demand_indexes: int,
    max_on_demand_bytes: str,
    open_builds: bool | None,
    max_resident_indexes: int,
    build_inline_rows: int,
    private_health: bool,
    log_format: str,
    cors_origins: tuple[str, ...],
    preload: bool,
    backend: str,
    search_threads: int | None,
    index_dir: Path,
    device: str | None,
    trust_remote_code: bool,
    quantize: str | None,
    threads: int | None,
    store_spec: str | None,
) -> None:
    """Answer queries over HTTP (JSON): POST /query, GET /indexes, GET /health, GET /metrics, POST /v1/embeddings,
    GET /v1/models, docs at /docs; a search page at /.

    Each model is loaded once and shared by the indexes built with it; indexes load on first use
    and stay resident, and an index that `condsearch index` replaces is reloaded without a restart.
    A query under a condition that a router corpus has no index for builds it first (--no-build: 404);
    a large corpus answers 202 and a job to poll at GET /builds/ID.
    """
    refuse_index_dir_beside_store(store_spec, "serve from")
    if api_key is None and os.environ.get(API_KEY_ENV) is not None:
        api_key = os.environ[API_KEY_ENV]  # click reads a variable set empty as unset: it must be refused
    if api_key is not None and not api_key.strip():
        raise click.UsageError(f"the API key is empty: give a key, or unset {API_KEY_ENV} and leave out --api-key")
    try:
        from condsearch.environment import check_environment

        check_environment()  # a bad setting fails now, not as a 500 on every query
    except CondsearchError as exc:
        raise fail(exc) from exc
    try:
        from condsearch.serve import run_server
    except ImportError as exc:
        raise click.ClickException(f"serve needs {exc.name}: pip install 'condsearch[serve]'") from exc
    config = ServeConfig(
        index_dir=index_dir,
        store=store_spec,
        host=host,
        port=port,
        api_key=api_key or None,
        device=device,
        trust_remote_code=trust_remote_code,
        max_batch=max_batch,
        max_batch_tokens=max_batch_tokens,
        batch_window_ms=batch_window_ms,
        max_body_bytes=max_body_bytes,
        build=build,
        max_builds=max_builds,
        max_pending_builds=max_pending_builds,
        max_pending_builds_per_client=max_pending_builds_per_client,
        max_on_demand_indexes=max_on_demand_indexes,
        max_on_demand_bytes=max_on_demand_bytes,
        open_builds=open_builds,
        max_resident_indexes=max_resident_indexes,
        build_inline_rows=build_inline_rows,
        private_health=private_health,
        log_format=log_format,  # type: ignore[arg-type]  # click.Choice of LOG_FORMATS
        cors_origins=tuple(cors_origins),
        preload=preload,
        quantize=quantize,
        threads=threads,
        backend=backend,  # type: ignore[arg-type]  # click.Choice of BACKEND_CHOICES
        search_threads=search_threads,
    )
    if not is_loopback(host):
        keyless = f"; set --api-key or {API_KEY_ENV}" + (
            "" if config.builds_open else " (no build on demand without one)"
        )
        click.echo(
            f"condsearch: warning: listening on {host}: other machines can query this server"
            + ("" if api_key else keyless),
            err=True,
        )
    try:
        run_server(config)
    except CondsearchError as exc:
        raise fail(exc) from exc
