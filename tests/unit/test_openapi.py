"""The committed OpenAPI document is exactly what the app serves; operation ids are stable."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.dependencies.utils import get_flat_params

from app.api.http import PLAIN_DIGITS
from app.api.main import create_app
from app.api.openapi import api_routes, render
from app.settings import Settings

COMMITTED = Path(__file__).resolve().parents[2] / "api-schemas" / "openapi.json"
OPERATION_IDS = {
    "tasks-put-revision", "tasks-list", "tasks-get", "tasks-list-revisions",
    "tasks-get-revision", "recipes-create", "recipes-get", "secrets-put", "secrets-list",
    "secrets-delete", "runs-create", "runs-cancel", "runs-rerun", "runs-list", "runs-get",
    "runs-list-attempts", "runs-list-events", "runs-get-log", "healthz", "readyz", "metrics",
    "schedules-put", "schedules-get", "schedules-list", "schedules-pause", "schedules-resume",
    "schedules-delete", "schedules-decisions",
    "tasks-get-retention", "tasks-put-retention", "runs-pin", "runs-unpin", "system-storage",
    "tasks-archive", "tasks-unarchive", "token-self",
}  # fmt: skip


def _live() -> dict[str, object]:
    settings = Settings.from_env({}, data_dir="/nonexistent-qinglong")
    return create_app(settings).openapi()


def test_committed_document_matches_the_live_one() -> None:
    live = render(_live())
    assert COMMITTED.read_text(encoding="utf-8") == live, (
        "api-schemas/openapi.json is stale: run `make openapi` and review the diff"
    )


def test_operation_ids_are_the_stable_set() -> None:
    doc = json.loads(COMMITTED.read_text(encoding="utf-8"))
    ids = {op["operationId"] for item in doc["paths"].values() for op in item.values()}
    assert ids == OPERATION_IDS


def test_every_error_response_is_problem_json() -> None:
    doc = json.loads(COMMITTED.read_text(encoding="utf-8"))
    for item in doc["paths"].values():
        for op in item.values():
            for status, response in op["responses"].items():
                if status[0] in "45":
                    assert list(response["content"]) == ["application/problem+json"], status


def _bounds(node: object) -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}:
                found.append((key, value))
            found += _bounds(value)
    elif isinstance(node, list):
        for item in node:
            found += _bounds(item)
    return found


def test_integer_bounds_are_exact_integers() -> None:
    # FastAPI's OpenAPI model types every bound as a float: 2**62 was rendered
    # 4.611686018427388e+18, which as a JSON number is 4611686018427388000, so the document
    # allowed 96 values above the 2**62 the api accepts (schemathesis sent one: 422).
    doc = json.loads(COMMITTED.read_text(encoding="utf-8"))
    floats = [(k, v) for k, v in _bounds(doc) if isinstance(v, float)]
    assert floats == []
    retention = doc["components"]["schemas"]["RetentionIn"]["properties"]["task_log_bytes"]
    assert retention["anyOf"][0]["maximum"] == 2**62


def test_every_integer_parameter_takes_plain_digits_only() -> None:
    # Each one the document calls an integer refuses "5.0" and "1_0" (docs/api.md §1); the
    # API tests send them to each, this catches a new one added without PLAIN_DIGITS.
    doc = json.loads(COMMITTED.read_text(encoding="utf-8"))
    documented = {
        (op["operationId"], param["name"])
        for item in doc["paths"].values()
        for op in item.values()
        for param in op.get("parameters", ())
        if "integer" in json.dumps(param["schema"])  # the query's and the path's
    }
    settings = Settings.from_env({}, data_dir="/nonexistent-qinglong")
    strict = {
        (route.operation_id, field.alias)
        for route in api_routes(create_app(settings).routes)
        for field in get_flat_params(route.dependant)
        if PLAIN_DIGITS in field.field_info.metadata
    }
    assert documented == strict
    assert ("runs-get-log", "tail_bytes") in strict and ("runs-list", "limit") in strict
    assert ("runs-get-log", "number") in strict and ("tasks-get-revision", "revision") in strict
