"""The Host header of a keyless server's loopback connections: this machine's names only (DNS rebinding, issue 58).

A web page whose name the attacker re-points at 127.0.0.1 ("DNS rebinding") makes the visitor's browser
send it requests that reach a server on loopback, but under the page's own name in ``Host``; the
browser lets the page read the answers, since to it they come from the page's origin. A server with an
API key refuses such requests anyway (the page does not have the key); a keyless one answers
:class:`HostCheck`'s 421 to any request that arrived on a loopback address whose ``Host`` is not
``localhost``, ``127.0.0.1`` or ``[::1]`` (or the loopback address it was bound to), with the port
the connection arrived on (none for port 80). Connections on other addresses are not checked: a
server bound beyond loopback is reached under names it cannot know (and warns when keyless).
"""

from __future__ import annotations

import ipaddress

from condsearch.serve.limits import ASGIApp, Receive, Scope, Send, refuse

#: the names a browser on this machine reaches a loopback server by (with the port)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def _is_loopback_address(address: object) -> bool:
    try:
        return ipaddress.ip_address(str(address)).is_loopback
    except ValueError:
        return False


def allowed_hosts(address: str, port: int) -> frozenset[str]:
    """Return the Host values a loopback connection to address:port may carry (lower case)."""
    own = f"[{address}]" if ":" in address else address
    names = {*LOOPBACK_NAMES, own.lower()}
    with_port = {f"{name}:{port}" for name in names}
    return frozenset(with_port | (names if port == 80 else set()))


class HostCheck:
    """Answer 421 to a loopback connection's request whose Host names another site (for a keyless server)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if scope["type"] != "http" or not server or server[1] is None or not _is_loopback_address(server[0]):
            await self.app(scope, receive, send)
            return
        host = next((value for name, value in scope.get("headers", ()) if name.lower() == b"host"), b"")
        if host.decode("latin-1").strip().lower() not in allowed_hosts(str(server[0]), int(server[1])):
            shown = host[:60].decode("latin-1")
            await refuse(
                send,
                421,
                f"this server answers requests for localhost only (Host {shown!r} names another site); "
                f"use http://127.0.0.1:{server[1]}/ or start it with --api-key",
            )
            return
        await self.app(scope, receive, send)
