"""The web UI at ``/ui``: static files shipped in the package, and the security headers.

The UI is one more client of the public REST API (docs/ui.md): plain HTML, CSS and
JavaScript modules from ``app/ui/static`` (package data), no build step, nothing fetched from
anywhere but this origin. Every response of the app carries ``X-Content-Type-Options:
nosniff`` and ``Referrer-Policy: no-referrer``; those under ``/ui`` also carry a strict
Content-Security-Policy (no inline script or style, ``frame-ancestors 'none'``); ``/docs``
carries its own (app/api/api_docs.py).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette._utils import get_route_path

from app.api.api_docs import DOCS_CSP, DOCS_PATH
from app.api.asgi import ASGIApp, Message, Receive, Scope, Send

STATIC_DIR = Path(__file__).resolve().parent.parent / "ui" / "static"
UI_PREFIX = "/ui"

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
_EVERY_RESPONSE = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
_UI_RESPONSES = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    # Revalidate every time (ETag / Last-Modified answer 304): an upgrade shows at once.
    (b"cache-control", b"no-cache"),
]
_DOCS_RESPONSES = [  # /docs: its own policy (app/api/api_docs.py)
    (b"content-security-policy", DOCS_CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


class SecurityHeaders:
    """Adds the headers above to every HTTP response start (pure ASGI, streams untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Behind a proxy's prefix uvicorn keeps it in the path: the path the router matches,
        # by the router's own function, so the two never disagree (a root of "/d" leaves
        # "/docs" whole; a root of "/p/" makes "/p//ui/x" "/ui/x").
        path = get_route_path(scope)
        extra = list(_EVERY_RESPONSE)
        if path == UI_PREFIX or path.startswith(UI_PREFIX + "/"):
            extra += _UI_RESPONSES
        elif path == DOCS_PATH:
            extra += _DOCS_RESPONSES

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in extra}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": [*kept, *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


def install_ui(app: FastAPI) -> None:
    """Serve the UI at ``/ui/`` (``/ui`` redirects there, and so does ``/``: the address a
    person opens first); outside the OpenAPI document."""

    async def ui_root(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{UI_PREFIX}/", status_code=308)

    async def site_root(request: Request) -> RedirectResponse:
        # Temporary (307): a browser does not remember it, so the root stays free.
        return RedirectResponse(f"{UI_PREFIX}/", status_code=307)

    # Plain Starlette routes, like the docs routes: API routes are all StrictJSONRoute.
    app.add_route(UI_PREFIX, ui_root, methods=["GET", "HEAD"], include_in_schema=False)
    app.add_route("/", site_root, methods=["GET", "HEAD"], include_in_schema=False)
    app.mount(UI_PREFIX, StaticFiles(directory=STATIC_DIR, html=True), name="ui")
