"""Write-only secrets (docs/api.md §5): no route ever returns a value."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.api.auth import Ctx, SecretsWriter
from app.api.http import (
    READ_ERRORS,
    WRITE_ERRORS,
    PageQuery,
    SecretName,
    problems,
)
from app.api.schemas import SecretIn, SecretOut, SecretPage
from app.api.strict_json import StrictJSONRoute

router = APIRouter(prefix="/api/v1", tags=["secrets"], route_class=StrictJSONRoute)


@router.put(
    "/secrets/{name}",
    operation_id="secrets-put",
    status_code=204,
    response_class=Response,
    responses=problems(*WRITE_ERRORS),
)
def put_secret(name: SecretName, body: SecretIn, facade: Ctx, _: SecretsWriter) -> Response:
    """Encrypt and store a secret value (create or replace)."""
    facade.put_secret(name=name, value=body.value)
    return Response(status_code=204)


@router.get(
    "/secrets",
    operation_id="secrets-list",
    response_model=SecretPage,
    responses=problems(*READ_ERRORS),
)
def list_secrets(facade: Ctx, _: SecretsWriter, paging: PageQuery) -> SecretPage:
    """Secret names with their last change time, by name."""
    page = facade.list_secrets(limit=paging.limit, cursor=paging.cursor)
    return paging.body(
        page, SecretPage, lambda s: SecretOut(name=s.name, updated_at_ms=s.updated_at_ms)
    )


@router.delete(
    "/secrets/{name}",
    operation_id="secrets-delete",
    status_code=204,
    response_class=Response,
    responses=problems(*READ_ERRORS),
)
def delete_secret(name: SecretName, facade: Ctx, _: SecretsWriter) -> Response:
    """Remove a secret (404 SECRET_NOT_FOUND when there is none)."""
    facade.delete_secret(name=name)
    return Response(status_code=204)
