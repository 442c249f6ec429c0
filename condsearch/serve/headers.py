"""Security headers on every answer of the server: no MIME sniffing, no framing, no referrer.

:class:`SecurityHeaders` is plain ASGI middleware wrapped around the whole app, outside Starlette's
error middleware, so that JSON answers, every 4xx and 5xx (a crash's 500 included), the OpenAPI
docs and the page all carry :data:`SECURITY_HEADERS`. A response that sets one of them itself keeps
its own (the page sends a stricter Content-Security-Policy, which also forbids framing).
uvicorn's own 400, for a request it cannot parse, is answered before any app runs:
``condsearch.serve.server`` adds the same headers there.
"""

from __future__ import annotations

from collections.abc import Iterable

from condsearch.serve.limits import ASGIApp, Message, Receive, Scope, Send

#: on every answer: a browser must not sniff a JSON answer into HTML, nor let another site frame
#: anything the server sends (both the old header and the CSP directive), nor leak the address on
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}

_RAW = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in SECURITY_HEADERS.items()]


def with_security_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Return raw headers with each security header added that they do not already set."""
    given = [(bytes(name), bytes(value)) for name, value in headers]
    present = {name.lower() for name, _ in given}
    return given + [(name, value) for name, value in _RAW if name not in present]


class SecurityHeaders:
    """Add :data:`SECURITY_HEADERS` to every HTTP response of app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": with_security_headers(message.get("headers", ()))}
            await send(message)

        await self.app(scope, receive, send_secured)
