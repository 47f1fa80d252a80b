"""The OpenAPI document: generated from the app, committed as api-schemas/openapi.json.

``python -m app.api.openapi`` prints it (``make openapi``); a test compares it with the
committed file, so a contract change is always a reviewed diff.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from app.api.problems import PROBLEM_MEDIA_TYPE

_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def build_document(app: FastAPI) -> dict[str, Any]:
    """The app's document with every 4xx/5xx as application/problem+json."""
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    scopes = {r.operation_id: required_scope(r) for r in api_routes(app.routes)}
    for path_item in doc.get("paths", {}).values():
        for operation in path_item.values():
            scope = scopes.get(operation.get("operationId"))
            if scope:
                operation["x-required-scope"] = scope  # space-separated when several
                named = " and ".join(f"`{one}`" for one in scope.split())
                plural = "s" if " " in scope else ""
                operation["description"] = (
                    operation.get("description", "") + f"\n\nScope{plural}: {named} (or `admin`)."
                ).strip()
            for status, response in operation.get("responses", {}).items():
                if status[0] in "45":
                    response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": _PROBLEM_REF}}
            if operation.get("security"):
                operation["responses"].setdefault(
                    "401",
                    {
                        "description": "missing or unknown token (UNAUTHENTICATED)",
                        "content": {PROBLEM_MEDIA_TYPE: {"schema": _PROBLEM_REF}},
                    },
                )
    schemas = doc.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    _integral_bounds(doc)
    return doc


_BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})


def _integral_bounds(node: Any) -> None:
    """Write whole-number bounds as integers, in place.

    FastAPI's OpenAPI model types every bound as a float, so ``le=2**62`` came out as
    ``4.611686018427388e+18``: read as a JSON number that is 4611686018427388000, 96 more than
    the api accepts. Each bound here came from an int that a float holds exactly (below 2**53,
    or 2**62), so ``int()`` gives it back; tests/unit/test_openapi.py checks 2**62."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _BOUNDS and isinstance(value, float) and value.is_integer():
                node[key] = int(value)
            else:
                _integral_bounds(value)
    elif isinstance(node, list):
        for item in node:
            _integral_bounds(item)


def api_routes(routes: list[Any]) -> list[APIRoute]:
    """Every APIRoute, descending into included routers (they stay branches of the list)."""
    found: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append(route)
        elif getattr(route, "original_router", None) is not None:
            found += api_routes(route.original_router.routes)
    return found


def required_scope(route: APIRoute) -> str | None:
    """The scope a route's auth dependency demands (``auth.require``), or None."""
    return _scope_of(route.dependant)


def _scope_of(dependant: Any) -> str | None:
    for dep in dependant.dependencies:
        scope = getattr(dep.call, "required_scope", None) or _scope_of(dep)
        if scope:
            return str(scope)
    return None


def install_openapi(app: FastAPI) -> None:
    """Serve ``build_document`` at /openapi.json (computed once)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def render(doc: dict[str, Any]) -> str:
    """Stable text form of the document (what is committed)."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    """Print the document of a freshly built app (no database is touched)."""
    from app.api.main import create_app

    sys.stdout.write(render(create_app().openapi()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
