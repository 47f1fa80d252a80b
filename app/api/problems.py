"""RFC 9457 problem details for every 4xx/5xx, and the mapping of domain errors at the edge."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from http import HTTPMethod
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Mount

from app.context.metrics import DATABASE_UNAVAILABLE
from app.domain.errors import (
    Conflict,
    DomainError,
    Gone,
    LogHostUnavailable,
    NotFound,
    NotMigrated,
    PreconditionFailed,
    QueueFull,
    StorageUnavailable,
    ValidationFailed,
    VersionConflict,
)
from app.domain.validation import NAME_PATTERN, name_rule_broken

log = logging.getLogger("qinglong.api")

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:qinglong:problem:"

# Codes the HTTP layer adds to the domain's ErrorCode values.
UNAUTHENTICATED = "UNAUTHENTICATED"
FORBIDDEN = "FORBIDDEN"
NOT_FOUND = "NOT_FOUND"
METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
MALFORMED_JSON = "MALFORMED_JSON"
PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
RANGE_NOT_SATISFIABLE = "RANGE_NOT_SATISFIABLE"
NOT_READY = "NOT_READY"
INTERNAL_ERROR = "INTERNAL_ERROR"
VALIDATION_FAILED = "VALIDATION_FAILED"
# How long a client should wait before retrying a write the database could not store: long
# enough for an operator (or a log rotation) to free space, short enough to notice it.
STORAGE_RETRY_AFTER_S = 10
# An outage answers every request 503: the log says so once per code and this long.
OUTAGE_LOG_EVERY_S = 10.0
_outage_logged_at: dict[str, float] = {}
DUPLICATE_KEY = "DUPLICATE_KEY"
INVALID_NAME = "INVALID_NAME"  # as app.domain.validation says it of a name in a body
UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
MALFORMED_REQUEST = "MALFORMED_REQUEST"  # HTTP framing: Content-Length, chunks, request line
# Written by the HTTP protocol itself, before a request reaches the app (app/api/http_limits.py).
HEADERS_TOO_LARGE = "HEADERS_TOO_LARGE"
REQUEST_TIMEOUT = "REQUEST_TIMEOUT"
TOO_MANY_CONNECTIONS = "TOO_MANY_CONNECTIONS"

_STATUS_CODES: Mapping[int, str] = {
    400: "BAD_REQUEST",
    401: UNAUTHENTICATED,
    403: FORBIDDEN,
    404: NOT_FOUND,
    405: METHOD_NOT_ALLOWED,
    406: "NOT_ACCEPTABLE",
    413: PAYLOAD_TOO_LARGE,
    415: UNSUPPORTED_MEDIA_TYPE,
    416: RANGE_NOT_SATISFIABLE,
    422: VALIDATION_FAILED,
    503: NOT_READY,
}


class ApiProblem(Exception):
    """Raise from a route or dependency to answer with a problem document."""

    def __init__(
        self, status: int, code: str, detail: str, *, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(f"{code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = dict(headers or {})


class DuplicateKey(StarletteHTTPException):
    """A JSON body names one key twice in an object (app/api/strict_json.py).

    An ``HTTPException`` because FastAPI re-raises those from body parsing (any other
    exception there becomes its generic 400); its own handler below gives it its code.
    """

    def __init__(self) -> None:
        super().__init__(422, "a JSON object in the body has the same key twice")


def title_of(code: str) -> str:
    """A stable human title per code: ``REVISION_CONFLICT`` → ``Revision conflict``."""
    return code.replace("_", " ").capitalize()


def problem_body(status: int, code: str, detail: str) -> dict[str, Any]:
    """The problem document for ``status`` and ``code``: every problem answer carries it."""
    return {
        "type": TYPE_PREFIX + code,
        "title": title_of(code),
        "status": status,
        "detail": detail,
        "code": code,
    }


def problem_bytes(status: int, code: str, detail: str) -> bytes:
    """``problem_body`` as the bytes an answer written below FastAPI sends (ASGI, transport)."""
    return json.dumps(problem_body(status, code, detail)).encode()


def problem_response(
    status: int, code: str, detail: str, headers: Mapping[str, str] | None = None
) -> Response:
    """The problem+json response for ``status`` and ``code``."""
    return JSONResponse(
        problem_body(status, code, detail),
        status_code=status,
        headers=dict(headers or {}),
        media_type=PROBLEM_MEDIA_TYPE,
    )


def status_for(exc: DomainError) -> int:
    """HTTP status of a domain refusal: 422 invalid, 404 missing, 409 conflict, 429 queue full
    (docs/api.md §2)."""
    if isinstance(exc, ValidationFailed):
        return 422
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Gone):
        return 410
    if isinstance(exc, Conflict | VersionConflict):  # InvalidTransition is a Conflict
        return 409
    if isinstance(exc, QueueFull):
        return 429
    if isinstance(exc, PreconditionFailed):
        return 412
    if isinstance(exc, LogHostUnavailable | NotMigrated):
        return 503
    return 400


def _validation_detail(exc: RequestValidationError) -> tuple[int, str, str]:
    errors = exc.errors()
    for err in errors:
        if err.get("type") == "json_invalid":
            return 400, MALFORMED_JSON, "the body is not valid JSON"
    if not errors:
        return 422, VALIDATION_FAILED, "the request is not valid"
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    if (
        loc[:1] in (("path",), ("query",))
        and first.get("type") == "string_pattern_mismatch"
        and (first.get("ctx") or {}).get("pattern") == NAME_PATTERN
    ):
        # A name in the path or the query breaks the rule a name in a body is held to.
        what = str(loc[-1]).replace("_", " ")
        return 422, INVALID_NAME, name_rule_broken(what)
    where = ".".join(str(p) for p in loc if p != "body") or "request"
    if first.get("type") == "list_type":
        # Most often one string where a list is due ("cron": "0 3 * * *"): say the form.
        return 422, VALIDATION_FAILED, f'{where}: must be a JSON list, even of one item: ["..."]'
    # The message names the field and the rule; the offending input is never echoed.
    return 422, VALIDATION_FAILED, f"{where}: {first.get('msg', 'invalid')}"


def _log_outage(code: str, request: Request) -> None:
    """One warning per code and OUTAGE_LOG_EVERY_S: the code and the route's template only."""
    now = time.monotonic()
    last = _outage_logged_at.get(code)
    if last is not None and now - last < OUTAGE_LOG_EVERY_S:
        return
    _outage_logged_at[code] = now
    route = getattr(request.scope.get("route"), "path", "?")
    log.warning(
        "answered 503 %s on %s %s (one such line per %.0f s at most)",
        code, request.method, route, OUTAGE_LOG_EVERY_S,
    )  # fmt: skip


def storage_unavailable(request: Request, exc: StorageUnavailable) -> Response:
    """The 503 of a database or disk that cannot take the request now: counted by code, said
    once in the log, with ``Retry-After`` (the handler's, and the hot read's, answer)."""
    DATABASE_UNAVAILABLE.labels(code=str(exc.code)).inc()
    _log_outage(str(exc.code), request)
    headers = {"Retry-After": str(STORAGE_RETRY_AFTER_S)}
    return problem_response(503, str(exc.code), exc.detail, headers)


_METHODS = tuple(m.value for m in (HTTPMethod.DELETE, HTTPMethod.GET, HTTPMethod.PATCH,
                                    HTTPMethod.POST, HTTPMethod.PUT))  # fmt: skip


def _allowed(app: FastAPI, scope: Any) -> list[str]:
    """Every method some route of ``app`` answers for this request's path, sorted: each
    tried as the router would route it (root path, included routers, mounts). A mount (the
    UI's static files) answers GET only."""
    methods: set[str] = set()
    for method in _METHODS:
        probe = {**scope, "method": method}
        for route in app.router.routes:
            match, _child = route.matches(probe)
            if match is Match.FULL:
                if not isinstance(route, Mount) or method == "GET":
                    methods.add(method)
                break
    if "GET" in methods:
        methods.add("HEAD")  # app/api/head.py answers it wherever GET is answered
    return sorted(methods)


# A 405 a user meets looking for what is done another way: the detail says which.
_TASK_PATH = re.compile(r"/api/v1/tasks/([^/]+)")


def _method_hint(request: Request) -> str | None:
    """The detail of a 405 for ``DELETE /api/v1/tasks/{task}``: archive it instead."""
    if request.method == "DELETE" and _TASK_PATH.fullmatch(request.url.path):
        return (
            "a task is never deleted: its revisions and runs stay as history. Archive it "
            "instead (POST /api/v1/tasks/{task}/archive, or qinglong tasks archive TASK): "
            "it leaves the task list and starts no new run"
        )
    return None


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into problem+json."""

    async def on_problem(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiProblem)
        return problem_response(exc.status, exc.code, exc.detail, exc.headers)

    async def on_domain(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, DomainError)
        headers = None
        if isinstance(exc, QueueFull):
            headers = {"Retry-After": str(exc.retry_after_s)}
        elif isinstance(exc, NotMigrated):
            headers = {"Retry-After": str(STORAGE_RETRY_AFTER_S)}
        return problem_response(status_for(exc), str(exc.code), exc.detail, headers)

    async def on_storage(request: Request, exc: Exception) -> Response:
        # Every route, read or write: the unit of work and the engine raise it for any
        # transaction (a full disk, a lost connection, SQLite's lock held too long).
        assert isinstance(exc, StorageUnavailable)
        return storage_unavailable(request, exc)

    async def on_validation(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return problem_response(*_validation_detail(exc))

    async def on_duplicate_key(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, DuplicateKey)
        return problem_response(422, DUPLICATE_KEY, exc.detail)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = _STATUS_CODES.get(exc.status_code, "HTTP_ERROR")
        headers = exc.headers
        if exc.status_code == 405 and (allowed := _allowed(app, request.scope)):
            # Starlette names the methods of the first route whose path matched; a path
            # served by several routes (GET and POST /runs) allows all of theirs.
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
        if exc.status_code == 400:
            # FastAPI raises a bare 400 when it cannot decode the body at all.
            code = MALFORMED_JSON
        detail = {
            404: "no such resource",
            405: _method_hint(request) or "method not allowed on this resource",
            400: "the body could not be parsed",
        }.get(exc.status_code, str(exc.detail))
        return problem_response(exc.status_code, code, detail, headers)

    app.add_exception_handler(ApiProblem, on_problem)
    app.add_exception_handler(DomainError, on_domain)
    app.add_exception_handler(StorageUnavailable, on_storage)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(DuplicateKey, on_duplicate_key)  # more specific: wins by MRO
    # Anything else is caught by app.api.asgi.GuardMiddleware (500 without internals).
