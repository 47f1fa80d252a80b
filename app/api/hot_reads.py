"""GET one run without the framework's per-request work, when the answer is a plain 200.

Clients poll ``GET /api/v1/runs/{id}``. Through FastAPI that read cost several times a
trivial route: solving the dependency graph and validating the response again cost more than
the database read (figures: bench/README.md). This pure ASGI layer answers the one case that needs
none of it: a ``GET`` with no query string, a bearer token the facade authenticated within
the last second that carries ``runs:read``, and a run that exists (a queued one's answer
says what holds it back, ``run_out``, as the route's).

Everything else passes through untouched to the FastAPI route: no or unknown token, a token
still to check against the database, a missing scope, a malformed or unknown id, a query
string. That route stays the one definition of every error answer and of the OpenAPI
document, and a test holds the two 200 answers byte-identical. A database that cannot take
the read now (StorageUnavailable: unreachable, say) is answered here, by the same function
as the route's exception handler (``problems.storage_unavailable``): the event-loop read
already tried a fresh connection, and through the route the same read would wait for the
database a second time (on a silent partition, each try waits out the connection's bounds).
Any other exception propagates as it would from the route.
"""

from __future__ import annotations

import re

from starlette.requests import Request

from app.api.asgi import ASGIApp, Receive, Scope, Send
from app.api.auth import bearer_token
from app.api.http import run_out
from app.api.problems import storage_unavailable
from app.context.facade import AppFacade
from app.domain.errors import DomainError, StorageUnavailable

_RUN_PATH = re.compile(r"/api/v1/runs/([0-9a-f-]{36})")
_SCOPE = "runs:read"
_HEADERS = [(b"content-type", b"application/json")]


class _Route:
    path = "/api/v1/runs/{run_id}"  # the template only: never the id, never client bytes


_ROUTE = _Route()


class HotReads:
    """Answers the plain 200 of ``GET /api/v1/runs/{id}``; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = None
        if scope["type"] == "http" and scope["method"] == "GET" and not scope["query_string"]:
            match = _RUN_PATH.fullmatch(scope["path"])
            if match is not None and not scope.get("root_path"):
                try:
                    body = await self._run_json(scope, match.group(1))
                except StorageUnavailable as exc:
                    scope["route"] = _ROUTE  # the log line names the route's template
                    await storage_unavailable(Request(scope), exc)(scope, receive, send)
                    return
                except Exception:
                    scope["route"] = _ROUTE  # the guard logs the error against the route
                    raise
        if body is None:
            await self.app(scope, receive, send)
            return
        headers = [(b"content-length", str(len(body)).encode()), *_HEADERS]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _run_json(scope: Scope, run_id: str) -> bytes | None:
        facade: AppFacade | None = getattr(scope["app"].state, "facade", None)
        if facade is None:
            return None
        # Exactly one Authorization header, as the route demands (else the route refuses).
        values = [v for k, v in scope["headers"] if k == b"authorization"]
        token = bearer_token(values[0].decode("latin-1")) if len(values) == 1 else None
        principal = facade.cached_principal(token) if token else None
        if principal is None or not principal.can(_SCOPE):
            return None
        try:
            run = await facade.get_run_async(run_id=run_id)
        except DomainError:
            return None  # the route gives the same read its problem+json answer
        return (await run_out(facade, run)).model_dump_json().encode()
