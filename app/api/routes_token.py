"""The calling token's own name, scopes and expiry (docs/api.md §1): what a client such as the
web UI needs to offer only what the token may do, rather than controls that refuse after a
click."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from app.api.auth import require
from app.api.http import problems
from app.api.schemas import TokenOut
from app.api.strict_json import StrictJSONRoute
from app.context.facade import Principal

router = APIRouter(prefix="/api/v1", tags=["token"], route_class=StrictJSONRoute)

# Any live token: no scope is needed to learn one's own.
AnyToken = Annotated[Principal, Depends(require())]


@router.get(
    "/token",
    operation_id="token-self",
    response_model=TokenOut,
    responses=problems(401, 503),
)
async def token_self(principal: AnyToken) -> TokenOut:
    """The token this request was made with: its name, scopes and expiry. Any valid token."""
    return TokenOut(
        name=principal.name,
        scopes=sorted(principal.scopes),
        expires_at_ms=principal.expires_at_ms,
    )
