"""What one request may cost the server: its body's size and how long it may take to arrive.

:class:`BodyLimit` is plain ASGI middleware (no framework): it reads the whole body before the app
sees it, refusing one that declares or reaches more than ``max_bytes`` (413) or that has not all
arrived within ``timeout_s`` (408). So a request holds at most ``max_bytes`` of memory, and the
JSON parser and the model never see an oversize one. The socket-level limits (request head size,
head and keep-alive timeouts) are uvicorn's, set in ``condsearch.serve.server``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    """Hand the app a request's body only once it has all arrived, within max_bytes and timeout_s."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, timeout_s: float) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"the request body is too large (more than {self.max_bytes} bytes)"
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            # refused before a byte of it is read; uvicorn discards the rest as it arrives
            await refuse(send, 413, too_large)
            return
        try:
            body = await asyncio.wait_for(self._read(receive), self.timeout_s)
        except asyncio.TimeoutError:
            # the rest of the body may never come: answer, then close the connection
            await refuse(send, 408, f"the request body arrived too slowly (over {self.timeout_s:g} s)", close=True)
            return
        if body is None:  # the client went away
            return
        if len(body) > self.max_bytes:
            await refuse(send, 413, too_large)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes | None:
        """Return the body (stopping once past max_bytes), or None when the client disconnected."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_bytes or not message.get("more_body", False):
                return b"".join(chunks)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP layer refuses it
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """Return a receive that gives body once, then waits on the client (for its disconnect)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


async def refuse(send: Send, status: int, message: str, *, close: bool = False) -> None:
    payload = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
