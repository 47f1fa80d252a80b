"""HEAD answered as GET without its body (RFC 9110 §9.3.2), on every path that answers GET.

FastAPI routes declare GET only, so a HEAD was 405: an uptime check that sends HEAD to
``/healthz`` (a common default) saw the service down. This layer runs the request as GET and
passes on the answer's status and headers (``Content-Length`` included, as GET would send
it) with an empty body. For a stream (a log follow, Server-Sent Events) the headers are the
whole answer: at its first body message the layer ends the answer and stops the route by
raising from ``send``, caught here, so a follow never runs on for a HEAD. A path without GET
still answers 405, its ``Allow`` naming HEAD only beside GET (app/api/problems.py).

It sits inside the guard (app/api/asgi.py), which would otherwise log the stop as an error.
"""

from __future__ import annotations

from app.api.asgi import ASGIApp, Message, Receive, Scope, Send


class _Answered(Exception):
    """The HEAD answer is complete: the route is stopped here (never seen outside)."""


class HeadAsGet:
    """Pure ASGI: a HEAD request runs as GET; only the status and the headers go out."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        answered = False

        async def head_send(message: Message) -> None:
            nonlocal answered
            if answered:
                raise _Answered
            if message["type"] != "http.response.body":
                await send(message)
                return
            answered = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if message.get("more_body", False):
                raise _Answered  # a stream: stop producing it

        try:
            await self.app({**scope, "method": "GET"}, receive, head_send)
        except _Answered:
            return
        except BaseExceptionGroup as group:  # a route's task group may wrap the stop
            rest = group.subgroup(lambda exc: not isinstance(exc, _Answered))
            if rest is not None:
                raise rest from None
