"""HEAD answered as GET without its body (RFC 9110 §9.3.2), on every path that answers GET.

FastAPI routes declare GET only, so a HEAD was 405: an uptime check that sends HEAD to
``/healthz`` (a common default) saw the service down. This layer runs the request as GET and
passes on the answer's status and headers (``Content-Length`` included, as GET would send
it), then ends the answer with an empty body at once and cancels the route: a stream (a log
follow, Server-Sent Events) is never produced for a HEAD, even one with nothing to send yet.
A path without GET still answers 405, its ``Allow`` naming HEAD only beside GET
(app/api/problems.py).

It sits inside the guard (app/api/asgi.py), which logs a failure with the route the router
found: that is copied back from the GET's scope.
"""

from __future__ import annotations

import anyio

from app.api.asgi import ASGIApp, Message, Receive, Scope, Send

_FOUND = ("route", "endpoint", "path_params")  # what routing adds to the scope


class HeadAsGet:
    """Pure ASGI: a HEAD request runs as GET; only the status and the headers go out."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        as_get = {**scope, "method": "GET"}  # a copy: the server logs the request as HEAD
        answered = False
        with anyio.CancelScope() as route:

            async def head_send(message: Message) -> None:
                nonlocal answered
                if answered:
                    return  # the body a GET would get: not for a HEAD
                await send(message)
                if message["type"] == "http.response.start":
                    answered = True
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    route.cancel()  # the route has nothing more to give a HEAD

            try:
                await self.app(as_get, receive, head_send)
            finally:
                scope.update({key: as_get[key] for key in _FOUND if key in as_get})
