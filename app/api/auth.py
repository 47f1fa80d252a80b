"""Bearer-token authentication and scope checks as FastAPI dependencies.

``Ctx`` gives a route the facade; ``Reader``-style aliases give it the authenticated
principal after checking its scopes (docs/api.md §1: ``admin`` implies every scope).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPBearer

from app.api.problems import FORBIDDEN, UNAUTHENTICATED, ApiProblem
from app.context.facade import AppFacade, Principal

_BEARER_DESCRIPTION = "An API token: `ql_` + 43 base64url chars"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


async def get_facade(request: Request) -> AppFacade:
    """The facade the lifespan put on the app."""
    # async on purpose: a plain def dependency costs a worker-thread round trip per request.
    facade: AppFacade = request.app.state.facade
    return facade


Ctx = Annotated[AppFacade, Depends(get_facade)]


class _Require(HTTPBearer):
    """One dependency that authenticates the bearer token and demands its scopes (all of them).

    A subclass of ``HTTPBearer`` so the OpenAPI document keeps the bearer scheme, but a single
    node of the dependency graph: resolving the header, the token and the scope as separate
    dependencies cost more than the database read of GET one run (bench/api_reads.py).
    """

    def __init__(self, *scopes: str) -> None:
        super().__init__(
            auto_error=False, description=_BEARER_DESCRIPTION, scheme_name="HTTPBearer"
        )
        self.required_scopes = scopes
        # Space-separated, as OAuth writes several: read by the scope tests and the OpenAPI
        # extension.
        self.required_scope = " ".join(scopes)

    async def __call__(self, request: Request) -> Principal:  # type: ignore[override]
        # The guard authenticated a request with a body already (app/api/asgi.py): once.
        principal: Principal | None = request.scope.get("state", {}).get(GUARD_PRINCIPAL)
        if principal is None:
            values = request.headers.getlist("authorization")
            principal = await bearer_principal(request.app.state.facade, values)
        for scope in self.required_scopes:
            if not principal.can(scope):
                raise ApiProblem(403, FORBIDDEN, f"this token lacks the {scope} scope")
        return principal


# The request-state key under which the guard leaves the principal it authenticated.
GUARD_PRINCIPAL = "ql_principal"


async def bearer_principal(facade: AppFacade, values: list[str]) -> Principal:
    """The principal of the one bearer token among ``values`` (the request's Authorization
    headers); else ApiProblem 401 UNAUTHENTICATED saying why (the route's dependency, and the
    guard before it reads a body, app/api/asgi.py).

    Raises: ApiProblem (401), StorageUnavailable or NotMigrated (the database's answer).
    """
    if len(values) > 1:
        # A proxy and the service could each read another one (as with a key twice in a
        # body, app/api/strict_json.py): refused, never one of them picked.
        raise ApiProblem(
            401, UNAUTHENTICATED, "send one Authorization header, not several", headers=_CHALLENGE
        )
    token = bearer_token(values[0] if values else "")
    if token is None:
        raise ApiProblem(401, UNAUTHENTICATED, "a bearer token is required", headers=_CHALLENGE)
    principal = await authenticated(facade, token)
    if principal is None:
        raise ApiProblem(
            401, UNAUTHENTICATED, "the token is unknown, revoked or expired", headers=_CHALLENGE
        )
    return principal


async def authenticated(facade: AppFacade, token: str) -> Principal | None:
    """The principal of a live ``token``, or None (revoked, unknown, malformed).

    A token seen within the last second needs no database round trip (nor a thread hop):
    a revocation is seen at most the token cache's TTL after it committed.
    """
    principal = facade.cached_principal(token)
    if principal is None:
        principal = await run_in_threadpool(facade.authenticate, token)
    return principal


def bearer_token(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (scheme in any case), or None."""
    scheme, _, token = authorization.partition(" ")
    return token if scheme.lower() == "bearer" and token else None


def require(*scopes: str) -> _Require:
    """A dependency that authenticates and then demands every one of ``scopes`` (403
    FORBIDDEN naming the first one missing)."""
    return _Require(*scopes)


DefinitionsReader = Annotated[Principal, Depends(require("definitions:read"))]
DefinitionsWriter = Annotated[Principal, Depends(require("definitions:write"))]
# What makes runs start (or cancels them) is a runs:write power too: a schedule's creation,
# change, resume and deletion (docs/job-user.md, "What each API scope allows").
SchedulesWriter = Annotated[Principal, Depends(require("definitions:write", "runs:write"))]
SecretsWriter = Annotated[Principal, Depends(require("secrets:write"))]
Reader = Annotated[Principal, Depends(require("runs:read"))]
RunsWriter = Annotated[Principal, Depends(require("runs:write"))]
Admin = Annotated[Principal, Depends(require("admin"))]
LOGS_SCOPE = "logs:read"
LogsReader = Annotated[Principal, Depends(require(LOGS_SCOPE))]
MetricsReader = Annotated[Principal, Depends(require("metrics:read"))]
