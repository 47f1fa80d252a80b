"""Pure ASGI guard: one body framing, chunked alone (400), body limit (413), no content coding
(415), UTF-8 bodies, a bare 500; and, outside CORS, ``Connection: close`` on every response of
a retiring process (``RetiringClose``, app/api/retirement.py).

Bodies are refused from ``Content-Length`` before any byte is read, or while streaming as
soon as the count passes the limit: the app never sees more than ``max_body`` bytes. A body
is read only from a client whose bearer token is valid (401 first, the body unread): no
route without a token takes one, and a trickled body must not hold a connection for free.
Requests without a body (GET, SSE follows) pass straight through with the original
``receive``, so disconnects still reach streaming responses.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from starlette.requests import Request

from app.api import retirement
from app.api.auth import GUARD_PRINCIPAL, bearer_principal
from app.api.problems import (
    INTERNAL_ERROR,
    MALFORMED_JSON,
    MALFORMED_REQUEST,
    PAYLOAD_TOO_LARGE,
    PROBLEM_MEDIA_TYPE,
    STORAGE_RETRY_AFTER_S,
    UNSUPPORTED_MEDIA_TYPE,
    ApiProblem,
    problem_bytes,
    storage_unavailable,
)
from app.domain.errors import NotMigrated, StorageUnavailable

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 1024 * 1024
# Request headers read as one value: sent twice, the request is refused (400), never one of
# them picked. (Authorization twice is the route's 401, app/api/auth.py; If-Match and
# If-None-Match are lists, their lines read as one, RFC 9110 §5.3.)
_ONCE_ONLY = (b"content-type", b"idempotency-key", b"range", b"last-event-id")
log = logging.getLogger("qinglong.api")


class _Disconnected(Exception):
    pass


class RetiringClose:
    """``Connection: close`` on every response that starts while the process retires
    (app/api/retirement.py). Outside CORS, so its own answers (preflights) close too."""

    def __init__(self, app: ASGIApp, retiring: Callable[[], bool] = retirement.retiring) -> None:
        self.app = app
        self.retiring = retiring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and self.retiring():
                message = _closing(message)
            await send(message)

        await self.app(scope, receive, closing_send)


class GuardMiddleware:
    """Wraps the whole app; see the module docstring."""

    def __init__(self, app: ASGIApp, max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            receive_for_app = await self._checked_body(scope, receive, send)
            if receive_for_app is None:
                return
            await self.app(scope, receive_for_app, tracking_send)
        except _Disconnected:
            return
        except Exception as exc:
            # Type and route only: messages may quote SQL parameters or other internals.
            route = getattr(scope.get("route"), "path", "?")
            log.error("unhandled %s on %s %s", type(exc).__name__, scope.get("method"), route)
            if not started:
                await _problem(send, 500, INTERNAL_ERROR, "an internal error occurred")

    async def _checked_body(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        names = [k.lower() for k, _ in scope.get("headers", [])]
        for name in _ONCE_ONLY:
            if names.count(name) > 1:
                # A proxy may read the last where the service reads the first (the body's
                # type, which write an Idempotency-Key stands for): neither is picked, as for
                # two Authorization headers (app/api/auth.py).
                said = f"send one {name.decode('latin-1').title()} header, not several"
                await _problem(send, 400, MALFORMED_REQUEST, said)
                return None
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        length = headers.get(b"content-length")
        transfer = b"transfer-encoding" in headers
        if length is None and not transfer:
            return receive
        if length is not None and transfer:
            # Two framings: a proxy may honour the other one (request smuggling). h11 lets
            # such a request through (chunked wins); httptools refuses it itself.
            await _problem(send, 400, MALFORMED_REQUEST, "Content-Length with Transfer-Encoding")
            return None
        if transfer and _transfer_codings(scope) != ["chunked"]:
            # httptools takes "gzip, chunked" as chunked and leaves the gzip undone: the bytes
            # read would not be the body a proxy that decodes it judged (as for a
            # Content-Encoding, below). h11 refuses every such request itself.
            said = "Transfer-Encoding must be chunked alone: no other transfer coding is taken"
            await _problem(send, 400, MALFORMED_REQUEST, said)
            return None
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = -1
            if declared < 0:
                await _problem(send, 400, MALFORMED_REQUEST, "Content-Length is not valid")
                return None
            if declared > self.max_body:
                await _problem(send, 413, PAYLOAD_TOO_LARGE, _too_large(self.max_body))
                return None
            if declared == 0:
                return _replay(b"", receive)
        coding = _content_coding(scope)
        if coding is not None:
            # The service decodes no coding: read as plain bytes, a coded body is not the one
            # a proxy or WAF that decodes it judged. Refused from the head alone, before a
            # byte is read, then closed; Accept-Encoding says what is taken (RFC 9110 §15.5.16).
            said = (
                f"the body's Content-Encoding{coding} is not accepted: send it uncoded "
                "(identity is the only content coding taken)"
            )
            accept = {"Accept-Encoding": "identity"}
            await _problem(send, 415, UNSUPPORTED_MEDIA_TYPE, said, headers=accept)
            return None
        try:
            refusal = await _unauthenticated(scope)
        except StorageUnavailable as exc:
            # The token cannot be checked now: the route's 503 (counted, logged once, with
            # Retry-After), the body unread, as for a refused token: during an outage a
            # client without a token must not hold a connection with a trickled body either.
            outage = storage_unavailable(Request(scope), exc)
            outage.headers["connection"] = "close"
            await outage(scope, receive, send)
            return None
        if refusal is not None:
            # Never a byte of a body from a client without a valid token: trickled a byte just
            # inside each stall timeout, its request would stay in progress and hold a place
            # in the connection bound as long as it liked (docs/http-limits.md). No route
            # without a token takes a body; the connection closes with the body unread.
            await _problem(
                send, refusal.status, refusal.code, refusal.detail, headers=refusal.headers
            )
            return None
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            body += message.get("body", b"")
            more = bool(message.get("more_body", False))
            if len(body) > self.max_body:
                await _problem(send, 413, PAYLOAD_TOO_LARGE, _too_large(self.max_body))
                return None
        if body and is_json(headers.get(b"content-type", b"").decode("latin-1")):
            try:
                bytes(body).decode("utf-8", errors="strict")
            except UnicodeDecodeError:
                await _problem(send, 400, MALFORMED_JSON, "the body is not valid UTF-8")
                return None
        return _replay(bytes(body), receive)


def _transfer_codings(scope: Scope) -> list[str]:
    """The codings a request's ``Transfer-Encoding`` lines name, in order, lowercased (lines
    are one list, RFC 9110 §5.3)."""
    lines = [v for k, v in scope.get("headers", []) if k.lower() == b"transfer-encoding"]
    items = b",".join(lines).decode("latin-1").split(",")
    return [item.strip().lower() for item in items if item.strip()]


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}")  # a coding's name (RFC 9110 §5.6.2)


def _content_coding(scope: Scope) -> str | None:
    """The first coding other than ``identity`` a request's ``Content-Encoding`` names, as the
    detail quotes it (`` "gzip"``; empty if it is not a plain token, never echoed), or None
    when its lines name only ``identity`` or there are none (lines are one list)."""
    for key, value in scope.get("headers", []):
        if key.lower() != b"content-encoding":
            continue
        for item in value.decode("latin-1").split(","):
            coding = item.strip()
            if coding and coding.lower() != "identity":
                return f' "{coding}"' if _TOKEN.fullmatch(coding) else ""
    return None


async def _unauthenticated(scope: Scope) -> ApiProblem | None:
    """The refusal of a request whose token is not known valid now, or None (a valid token):
    401 for a refused one, 503 ``NOT_MIGRATED`` for a database not migrated, as the route
    would answer. Raises StorageUnavailable when the database cannot tell now."""
    facade = getattr(scope["app"].state, "facade", None) if "app" in scope else None
    if facade is None:
        return None
    values = [v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"authorization"]
    try:
        principal = await bearer_principal(facade, values)
    except ApiProblem as problem:
        return problem
    except NotMigrated as exc:
        retry = {"Retry-After": str(STORAGE_RETRY_AFTER_S)}
        return ApiProblem(503, str(exc.code), exc.detail, headers=retry)
    scope.setdefault("state", {})[GUARD_PRINCIPAL] = principal  # the route's, not again
    return None


def _closing(start: Message) -> Message:
    """The response start with ``Connection: close`` (the server then closes after it)."""
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"connection"]
    return {**start, "headers": [*headers, (b"connection", b"close")]}


def _too_large(limit: int) -> str:
    return f"the request body is larger than {limit} bytes"


def is_json(content_type: str | None) -> bool:
    """A media type FastAPI parses as JSON: ``application/json`` or ``application/*+json``
    (parameters such as ``charset`` aside). Without one FastAPI does not parse the body
    either (its strict content type, the default): the route answers 415
    (app/api/strict_json.py), and the guard checks UTF-8 only of what FastAPI will parse."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    main, _, sub = media.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _problem(
    send: Send, status: int, code: str, detail: str, *, headers: Mapping[str, str] | None = None
) -> None:
    raw = problem_bytes(status, code, detail)
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                (b"content-length", str(len(raw)).encode()),
                *extra,
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": raw})
