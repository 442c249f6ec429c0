"""Running the app under uvicorn: in the foreground (`condsearch serve`) or on a thread (tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

import uvicorn
from fastapi import FastAPI

from condsearch.serve.app import create_app
from condsearch.serve.config import ServeConfig
from condsearch.serve.engine import Resident
from condsearch.store import IndexStore


def build_app(config: ServeConfig, resident: Resident | None = None) -> FastAPI:
    """Return the app for config, over the index folder it names."""
    resident = resident or Resident(
        IndexStore(config.index_dir),
        reload_interval_s=config.reload_interval_s,
        device=config.device,
        trust_remote_code=config.trust_remote_code,
        quantize=config.quantize,
        threads=config.threads,
    )
    if config.preload:
        resident.preload()
    return create_app(resident, config)


def run_server(config: ServeConfig, *, log_level: str = "info") -> None:
    """Serve until interrupted (Ctrl-C)."""
    uvicorn.run(build_app(config), host=config.host, port=config.port, log_level=log_level)


class BackgroundServer:
    """Uvicorn on a thread, on a free port of a loopback address; ``url`` once entered.

    with BackgroundServer(app) as server:
        httpx.get(server.url + "/health")
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", *, log_level: str = "warning") -> None:
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        port = self._socket.getsockname()[1]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))
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
