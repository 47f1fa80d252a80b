"""Bearer-token authentication and scope checks as FastAPI dependencies.

``Ctx`` gives a route the facade; ``Reader``-style aliases give it the authenticated
principal after checking one scope (API.md: ``admin`` implies every scope).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.api.problems import FORBIDDEN, UNAUTHENTICATED, ApiProblem
from app.context.facade import AppFacade, Principal

_bearer = HTTPBearer(auto_error=False, description="An API token: `ql_` + 43 base64url chars")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


async def get_facade(request: Request) -> AppFacade:
    """The facade the lifespan put on the app."""
    # async on purpose: a plain def dependency costs a worker-thread round trip per request.
    facade: AppFacade = request.app.state.facade
    return facade


Ctx = Annotated[AppFacade, Depends(get_facade)]


async def authenticate(
    facade: Ctx,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller's principal; 401 UNAUTHENTICATED with a Bearer challenge otherwise."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiProblem(401, UNAUTHENTICATED, "a bearer token is required", headers=_CHALLENGE)
    # A token seen within the last second needs no database round trip (nor a thread hop).
    principal = facade.cached_principal(credentials.credentials)
    if principal is None:
        principal = await run_in_threadpool(facade.authenticate, credentials.credentials)
    if principal is None:
        raise ApiProblem(
            401, UNAUTHENTICATED, "the token is unknown or revoked", headers=_CHALLENGE
        )
    return principal


def require(scope: str) -> Callable[..., Awaitable[Principal]]:
    """A dependency that authenticates and then demands ``scope`` (403 FORBIDDEN)."""

    async def check(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
        # async: no I/O here, so no worker-thread hop (bench/api_reads.py profile).
        if not principal.can(scope):
            raise ApiProblem(403, FORBIDDEN, f"this token lacks the {scope} scope")
        return principal

    check.required_scope = scope  # type: ignore[attr-defined]  # read by the scope tests
    return check


DefinitionsReader = Annotated[Principal, Depends(require("definitions:read"))]
DefinitionsWriter = Annotated[Principal, Depends(require("definitions:write"))]
SecretsWriter = Annotated[Principal, Depends(require("secrets:write"))]
Reader = Annotated[Principal, Depends(require("runs:read"))]
RunsWriter = Annotated[Principal, Depends(require("runs:write"))]
LogsReader = Annotated[Principal, Depends(require("logs:read"))]
