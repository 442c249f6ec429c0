"""The search page at ``/``: static files shipped in ``condsearch/serve/static`` (HTML, vanilla JS, CSS).

There is no build step and nothing is fetched from elsewhere: the page is a client of the JSON
API (``GET /indexes``, ``POST /query``) like any other, sending the API key the user gives it; so is
``/docs``, which lists the operations of ``/openapi.json``.
Its files hold no data, so they are the only paths served without the key. Each is answered
with a Content-Security-Policy that lets the page load only these files and talk only to this
server, and that forbids inline scripts, so text from an index can never run as code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

from condsearch.serve.headers import SECURITY_HEADERS

#: what the page may load and talk to: its own files and this server, nothing inline, no frames
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {**SECURITY_HEADERS, "Content-Security-Policy": CONTENT_SECURITY_POLICY, "Cache-Control": "no-cache"}


@dataclass(frozen=True)
class PageFile:
    """One file of the page: where it is served, its name in ``static/``, its media type."""

    path: str
    name: str
    media_type: str


PAGE_FILES = (
    PageFile("/", "index.html", "text/html; charset=utf-8"),
    PageFile("/static/search.js", "search.js", "text/javascript; charset=utf-8"),
    PageFile("/static/search.css", "search.css", "text/css; charset=utf-8"),
    # the API docs, rendered from /openapi.json (which needs the key) by the page's own script:
    # Swagger UI's /docs loads its code from a CDN, so it was blank offline
    PageFile("/docs", "docs.html", "text/html; charset=utf-8"),
    PageFile("/static/docs.js", "docs.js", "text/javascript; charset=utf-8"),
    PageFile("/favicon.ico", "favicon.ico", "image/x-icon"),  # asked for on every load: a 404 each time
)
#: the paths a server with an API key answers without it (GET and HEAD only): the page, never data
PAGE_PATHS = frozenset(f.path for f in PAGE_FILES)


def read_page_file(name: str) -> bytes:
    """Return a file of the page as shipped in the package."""
    return resources.files("condsearch.serve").joinpath("static").joinpath(name).read_bytes()


def add_page(app: FastAPI) -> None:
    """Serve the page's files on app, read once now; they stay out of the OpenAPI schema."""
    for page_file in PAGE_FILES:
        # HEAD too (a monitor's or a link checker's): its headers, no body (issue 59)
        app.add_api_route(page_file.path, _responder(page_file), methods=["GET", "HEAD"], include_in_schema=False)


def _responder(page_file: PageFile) -> Callable[[], Response]:
    # a closure, not default arguments: FastAPI would read those from the query string
    body = read_page_file(page_file.name)

    def serve_file() -> Response:
        return Response(body, media_type=page_file.media_type, headers=HEADERS)

    return serve_file
