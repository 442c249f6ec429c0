"""`condsearch serve` in its own process for a benchmark: a free loopback port, started, waited for, stopped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


def free_port() -> int:
    """Return a loopback port nobody listens on (at the moment of asking)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(
    args: Sequence[str], env: dict[str, str], *, timeout: float = 120
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run ``condsearch serve ARGS --port P`` until /health answers 200; yield its URL and process, then stop it.

    SystemExit when it exits or does not answer within timeout seconds. The server's stderr goes to the
    file named by $BENCH_SERVER_LOG where set (to read why a server died), else nowhere.
    """
    import httpx

    port = free_port()
    argv = [sys.executable, "-m", "condsearch", "serve", *args, "--port", str(port)]
    log_path = os.environ.get("BENCH_SERVER_LOG")
    stderr = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed below
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start (exit {server.poll()})")
            time.sleep(0.2)
        yield url, server
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        if log_path:
            stderr.close()
