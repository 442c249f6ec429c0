"""Running the app under uvicorn: in the foreground (`condsearch serve`) or on a thread (tests, benchmarks).

Socket-level limits live here: uvicorn caps a request's head (``max_head_bytes``) and closes idle
keep-alive connections (``keep_alive_s``), but it has no timeout for a request head that never
finishes arriving, so :class:`_HeadTimeoutProtocol` adds one (``head_timeout_s``).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from types import TracebackType
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from condsearch.query import Resident, open_source
from condsearch.serve.access import log_config
from condsearch.serve.app import create_app
from condsearch.serve.config import ServeConfig
from condsearch.serve.headers import with_security_headers


def build_app(config: ServeConfig, resident: Resident | None = None) -> FastAPI:
    """Return the app for config, over the index folder or Milvus store it names."""
    resident = resident or Resident(
        open_source(config.store or config.index_dir),
        reload_interval_s=config.reload_interval_s,
        device=config.device,
        trust_remote_code=config.trust_remote_code,
        quantize=config.quantize,
        threads=config.encode_threads,
        backend=config.backend,
        search_threads=config.search_threads,
        max_indexes=config.max_resident_indexes,
    )
    if config.preload:
        resident.preload()
    return create_app(resident, config)


def run_server(config: ServeConfig, *, log_level: str = "info") -> None:
    """Serve until interrupted (Ctrl-C), logging as config's ``log_format`` says, each line naming its request."""
    uvicorn.run(
        build_app(config),
        host=config.host,
        port=config.port,
        log_level=log_level,
        log_config=log_config(config.log_format),
        access_log=False,  # condsearch.serve.access writes each request's line, with its X-Request-ID
        **uvicorn_limits(config),
    )


def uvicorn_limits(config: ServeConfig) -> dict[str, Any]:
    """Return uvicorn's settings for config's limits on request heads and idle connections."""
    return {
        "http": _head_timeout_protocol(config.head_timeout_s),
        "timeout_keep_alive": config.keep_alive_s,
        "h11_max_incomplete_event_size": config.max_head_bytes,
    }


def _head_timeout_protocol(head_timeout_s: float) -> type[H11Protocol]:
    class Protocol(_HeadTimeoutProtocol):
        timeout_s = head_timeout_s

    return Protocol


class _HeadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, its own 400s carrying the security headers, and closing a connection
    that is answering nothing ``timeout_s`` after it opened or after its last answer: a request head
    that never completes, or a refused body that never ends, holds a socket for that long at most
    (uvicorn's keep-alive timer stops at the first byte of a request)."""

    timeout_s: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # uvicorn's own answer to a request it cannot parse, before any app runs: the same
        # security headers as every other answer (condsearch.serve.headers)
        headers = with_security_headers([(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")])
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=msg.encode("ascii", "replace")),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _arm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.timeout_s, self._head_timed_out)

    def _head_timed_out(self) -> None:
        if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
            return  # a request is being answered: the app's own timeouts bound it
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:
            pass
        self.transport.close()


class BackgroundServer:
    """Uvicorn on a thread, on a free port of a loopback address; ``url`` once entered.

    with BackgroundServer(app) as server:
        httpx.get(server.url + "/health")
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", *, log_level: str = "warning") -> None:
        config: ServeConfig = getattr(app.state, "config", None) or ServeConfig()
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        port = self._socket.getsockname()[1]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on", **uvicorn_limits(config)))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._socket.close()
